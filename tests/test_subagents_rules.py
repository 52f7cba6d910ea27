"""The pure rules of crow/subagents.py: limits as the user set them, a child's mode, and
the listing in the task tool's description."""

from __future__ import annotations

import pytest

from crow import AgentDefinition, subagents


def test_limits_are_clamped_and_a_value_that_is_no_whole_number_is_the_default() -> None:
    assert subagents.Limits.from_settings({}) == subagents.Limits(max_depth=1, max_turns=25, max_concurrent=4)
    wild = {"max_depth": 9, "max_concurrent": 0, "max_turns": "many"}
    assert subagents.Limits.from_settings(wild) == subagents.Limits(
        max_depth=3, max_turns=25, max_concurrent=1
    )
    assert subagents.Limits.from_settings({"max_depth": True, "max_concurrent": 99}).max_concurrent == 16
    assert subagents.Limits.from_settings({"max_depth": True}).max_depth == 1
    assert subagents.Limits.from_settings("not a mapping") == subagents.Limits()


@pytest.mark.parametrize(
    ("parent", "wanted", "child"),
    [
        ("yolo", None, "yolo"),
        ("yolo", "accept_edits", "accept_edits"),
        ("accept_edits", "yolo", "accept_edits"),
        ("ask", "yolo", "ask"),
        ("ask", "read_only", "read_only"),
        ("read_only", "ask", "read_only"),
        ("plan", None, "read_only"),
        ("yolo", "plan", "read_only"),
        ("yolo", "nonsense", "yolo"),
        ("nonsense", None, "ask"),
    ],
)
def test_a_child_runs_in_the_stricter_mode(parent: str, wanted: str | None, child: str) -> None:
    assert subagents.child_mode(parent, wanted) == child


def test_the_listing_names_each_agent_on_one_line() -> None:
    agents = [AgentDefinition("b", "two\nlines", ""), AgentDefinition("a", "x" * 300, "")]
    lines = subagents.listing(agents).splitlines()
    assert lines[0] == "- a: " + "x" * 199 + "…"
    assert lines[1] == "- b: two lines"
