"""What a prompt means, whatever the front end: commands and titles (pure functions)."""

from __future__ import annotations

from crow.prompting import BUILTINS, parse_command, title_of


def test_only_a_known_command_is_a_command() -> None:
    assert parse_command("/compact", BUILTINS) == ("compact", "")
    assert parse_command("/compact  keep the API notes ", BUILTINS) == ("compact", "keep the API notes")
    # anything else is an ordinary prompt for the model
    assert parse_command("/compacted the logs?", BUILTINS) is None
    assert parse_command("/usr/bin/env is missing", BUILTINS) is None
    assert parse_command("please /compact", BUILTINS) is None
    assert parse_command("/", BUILTINS) is None


def test_a_title_is_one_short_line() -> None:
    assert title_of("  Fix\tthe\n\nlogin   bug ") == "Fix the login bug"
    assert title_of("x" * 200) == "x" * 80
    assert title_of(" \n") == "Untitled"
