"""Permission rules without a model: parsing, matching, precedence, the scoped prompt options,
and property tests for compound commands and path normalisation."""

from __future__ import annotations

import os
import posixpath
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crow.config import load_config
from crow.errors import ConfigError
from crow.rules import RuleError, RuleSet, choices, compile_rules, decide, parse_rule, subject
from crow.shell_parse import split_commands

ROOT = os.path.realpath(tempfile.mkdtemp(prefix="crow-rules-"))


def verdict(
    tool: str, args: dict, allow: tuple = (), ask: tuple = (), deny: tuple = (), root: str = ROOT
) -> str | None:
    return decide(subject(tool, args, root), compile_rules(allow, ask, deny))[0]


def run(command: str, **rules: tuple) -> str | None:
    return verdict("execute", {"command": command}, **rules)


# ------------------------------------------------------------------ parsing
@pytest.mark.parametrize(
    ("text", "tool", "pattern"),
    [
        ("execute", "execute", None),
        ("execute(git status *)", "execute", "git status *"),
        ("  execute(git   status *)  ", "execute", "git status *"),
        ("edit_file(src/**)", "edit_file", "src/**"),
        ("shout", "shout", None),
        ("shout(*)", "shout", None),
        ("execute(echo (a))", "execute", "echo (a)"),
    ],
)
def test_rules_parse(text: str, tool: str, pattern: str | None) -> None:
    rule = parse_rule(text)
    assert (rule.tool, rule.pattern) == (tool, pattern)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "expected TOOL or TOOL(PATTERN)"),
        ("(x)", "expected TOOL or TOOL(PATTERN)"),
        ("git status", "expected TOOL or TOOL(PATTERN)"),
        ("execute(git status", "must end with ')'"),
        ("execute()", "empty pattern"),
        ("shout(loud)", "patterns are understood for execute"),
        ("edit_file(!src/**)", "negated patterns"),
        ("edit_file(#comment)", "not a usable gitignore-style pattern"),
        (42, "must be a string"),
    ],
)
def test_invalid_rules_are_refused_with_the_reason(text: object, reason: str) -> None:
    with pytest.raises(RuleError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        parse_rule(text)


def test_an_invalid_rule_is_a_configuration_error_at_load(tmp_path: Path) -> None:
    config = tmp_path / "crow.yaml"
    config.write_text("permissions:\n  allow: ['execute(git status *)']\n  deny: ['shout(loud)']\n")
    with pytest.raises(ConfigError, match=r"(?s)permissions\.deny.*shout\(loud\).*patterns are understood"):
        load_config(str(config), env={"CROW_HOME": str(tmp_path)})
    config.write_text("permissions:\n  deny: ['execute(rm *)', 'edit_file(src/**)']\n")
    assert load_config(str(config), env={"CROW_HOME": str(tmp_path)}).permissions.deny[0] == "execute(rm *)"


# ------------------------------------------------------------------ execute
ALLOW = ("execute(git status *)", "execute(ls *)", "execute(echo *)")


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("git status", "allow"),
        ("git status -s", "allow"),
        ("git  status   --short", "allow"),
        ("git statusx", None),  # `git status *` is the command or the command with arguments
        ("git push", None),
        ("ls -la && echo done", "allow"),
        ("ls | wc -l", None),  # wc is not allowed
        ("git status; rm -rf x", None),
        ("git status && rm -rf x", None),
        ("git status || rm -rf x", None),
        ("git status | rm -rf x", None),
        ("git status & rm -rf x", None),
        ("git status\nrm -rf x", None),
        ("echo $(rm -rf x)", None),
        ("echo `rm -rf x`", None),
        ('echo "$(rm -rf x)"', None),
        ("echo hi > ~/.bashrc", None),
        ("echo hi >> notes.txt", None),
        ("ls > /dev/null 2>&1", "allow"),
        ("echo 'a; rm -rf x'", "allow"),  # quoted: an argument, not a command
        ("PAGER=evil git status", None),
        ("cat <<EOF\nx\nEOF", None),
        ("(ls)", "allow"),
        ("if ls; then echo y; fi", None),
        ("$CMD status", None),
        ("", None),
        ("git status # && rm -rf x", "allow"),  # a comment
        ("diff <(ls) <(ls a)", None),
        ("ls >&2", "allow"),
        ("ls >& out", None),
        ("ls >| out", None),
        ("ls 2>&1|wc -l", None),
        ("ls >", None),
        ("git status\r#; rm -rf x", None),  # bash runs rm: \r does not start a comment
    ],
)
def test_execute_allow_covers_every_command_of_the_line(command: str, expected: str | None) -> None:
    assert run(command, allow=ALLOW) == expected


@pytest.mark.parametrize(
    "command",
    [
        "rm -rf x",
        "git status && rm -rf x",
        "echo $(rm -rf x)",
        "echo `rm -rf x`",
        "sudo rm -rf x",
        "/bin/rm -rf x",
        "bash -c 'rm -rf x'",
        "eval 'rm -rf x'",
        "(rm -rf x)",
        '"rm" -rf x',
        "r\\m -rf x",
        "FOO=1 rm -rf x",
        "if true; then rm -rf x; fi",
        "ls\nrm -rf x",
        "echo ok; rm  -rf   x",
        'echo > "$(rm -rf x)"',
        'cat <<< "$(rm -rf x)"',
        "$'\\x72m' -rf x",  # ANSI-C quoting, as bash decodes it
        "$'r\\155' -rf x",
        "$'\\u0072'm -rf x",
        '$"rm" -rf x',  # a translated string
        "sudo -u root rm -rf x",  # a wrapper's option with a value
        "env -u HOME rm -rf x",
        "timeout -s KILL 5 rm -rf x",
        "ls | xargs -I {} rm -rf {}",
        "find . -name x -exec rm -rf {} +",
        "find . -execdir /bin/rm -rf {} \\;",
        "echo ok\r#; rm -rf x",  # \r is no blank to bash: `ok\r#` is a word, not a comment
        'echo ${x:-"}"}; rm -rf x',  # a quoted } does not end ${...}
        "echo $(echo ')'); rm -rf x",
    ],
)
def test_execute_deny_matches_any_command_of_the_line(command: str) -> None:
    assert run(command, allow=("execute",), deny=("execute(rm *)",)) == "deny"


def test_precedence_is_deny_then_ask_then_allow() -> None:
    rules = {"allow": ("execute",), "ask": ("execute(git push *)",), "deny": ("execute(git push --force*)",)}
    assert run("git push --force origin", **rules) == "deny"
    assert run("git push origin", **rules) == "ask"
    assert run("git status", **rules) == "allow"
    assert run("git status && git push", **rules) == "ask"
    assert (
        verdict("edit_file", {"path": "src/a.py"}, allow=("edit_file",), deny=("edit_file(src/**)",))
        == "deny"
    )


def test_a_bare_tool_rule_covers_every_call_of_that_tool_only() -> None:
    assert run("echo $(id) > out", allow=("execute",)) == "allow"
    assert run("echo $(id)", allow=("execute(*)",)) is None, "a pattern never covers substitution"
    assert verdict("shout", {"text": "x"}, allow=("shout",)) == "allow"
    assert verdict("shout", {"text": "x"}, allow=("shout(*)",)) == "allow"
    assert verdict("whisper", {}, allow=("shout",)) is None


# ------------------------------------------------------------------ paths
@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("src/app.py", "allow"),
        ("./src/app.py", "allow"),
        ("src/deep/er/x.py", "allow"),
        ("lib/../src/app.py", "allow"),
        ("src/../lib/app.py", None),
        ("src/../../outside/src/x", None),
        (f"{ROOT}/src/app.py", "allow"),
        (f"{ROOT}/lib/app.py", None),
        ("/etc/src/x", None),
        ("lib/src/x.py", None),  # the pattern is anchored
        ("src", None),
        (42, None),
    ],
    ids=lambda value: str(value).replace(ROOT, "ROOT"),  # the same in every xdist worker
)
def test_file_rules_match_the_normalised_workspace_path(path: object, expected: str | None) -> None:
    assert verdict("edit_file", {"path": path}, allow=("edit_file(/src/**)",)) == expected


def test_a_symlink_does_not_carry_an_allow_rule_elsewhere(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "lib").mkdir()
    (root / "src" / "link").symlink_to(root / "lib")
    (root / "src" / "out").symlink_to(tmp_path)
    rules = {"allow": ("edit_file(/src/**)",), "root": str(root)}
    assert verdict("edit_file", {"path": "src/link/x.py"}, **rules) is None
    assert verdict("edit_file", {"path": "src/out/x.py"}, **rules) is None
    assert verdict("edit_file", {"path": "src/x.py"}, **rules) == "allow"
    # a deny rule matches the path written and the path it resolves to
    assert (
        verdict("edit_file", {"path": "src/link/x.py"}, deny=("edit_file(/lib/**)",), root=str(root))
        == "deny"
    )


# ------------------------------------------------------------------ prompt options
def options(tool: str, args: dict, asked_by_rule: bool = False) -> dict[str, tuple[str, tuple[str, ...]]]:
    return {c.id: (c.label, c.rules) for c in choices(subject(tool, args, ROOT), asked_by_rule)}


def test_always_options_name_exactly_what_they_cover() -> None:
    git = options("execute", {"command": "git status -s"})
    assert git["allow_always"] == ("Always allow `git status` commands", ("execute(git status *)",))
    assert git["reject_always"] == ("Always reject `git status` commands", ("execute(git status *)",))
    assert options("execute", {"command": "ls -la src"})["allow_always"][1] == ("execute(ls *)",)
    both = options("execute", {"command": "git diff && ls"})["allow_always"]
    assert both == ("Always allow `git diff` and `ls` commands", ("execute(git diff *)", "execute(ls *)"))
    sub = options("execute", {"command": "echo $(rm -rf x)"})
    assert "allow_always" not in sub, "nothing can always-allow a substitution"
    assert sub["reject_always"] == ("Always reject this exact command", ("execute(echo $(rm -rf x))",))
    edit = options("edit_file", {"path": "src/app.py"})
    assert edit["allow_always"] == (
        "Always allow edits to src/app.py",
        ("edit_file(/src/app.py)", "write_file(/src/app.py)"),
    )
    assert edit["allow_always_folder"] == (
        "Always allow edits in src/",
        ("edit_file(/src/**)", "write_file(/src/**)"),
    )
    assert "allow_always_folder" not in options("write_file", {"path": "top.txt"})
    assert "allow_always" not in options("write_file", {"path": "../elsewhere.txt"})
    assert options("shout", {"text": "x"})["allow_always"] == ("Always allow `shout`", ("shout",))
    assert list(options("execute", {"command": "git push"}, asked_by_rule=True)) == [
        "allow_once",
        "reject_once",
        "reject_always",
    ], "an ask rule would still ask: no always-allow is offered"


def test_the_rules_an_option_adds_cover_the_call_and_no_more() -> None:
    for tool, args, other in [
        ("execute", {"command": "git status -s"}, {"command": "git push"}),
        ("execute", {"command": "ls"}, {"command": "ls; rm -rf x"}),
        ("edit_file", {"path": "src/app.py"}, {"path": "src/other.py"}),
        ("edit_file", {"path": "we[ir]d *.py"}, {"path": "weird x.py"}),
    ]:
        label, rules = options(tool, args)["allow_always"]
        session = RuleSet(allow=[parse_rule(r, "session") for r in rules])
        assert decide(subject(tool, args, ROOT), session)[0] == "allow", label
        assert decide(subject(tool, other, ROOT), session)[0] is None, label


@pytest.mark.parametrize(
    "command",
    ["timeout 10 pytest", "sudo ls", "env ls", "ls | xargs echo", "nice make", "bash build.sh",
     "echo ls | sh", "exec ls", "command ls", "source env.sh", "/usr/bin/timeout 5 ls"],
)  # fmt: skip
def test_no_always_allow_for_a_program_that_runs_other_commands(command: str) -> None:
    """An always-allow of `timeout` commands would allow `timeout 1 rm -rf ~`: not offered."""
    offered = options("execute", {"command": command})
    assert "allow_always" not in offered, offered
    assert offered["reject_always"][0] == "Always reject this exact command"


def test_exact_command_reject_matches_that_command() -> None:
    line = "echo $(rm -rf x) [1]*"
    (rule,) = options("execute", {"command": line})["reject_always"][1]
    assert run(line, deny=(rule,)) == "deny"
    assert run("echo other", deny=(rule,)) is None


# ------------------------------------------------------------------ properties
SIMPLE = {
    "git status": True,
    "git status -s": True,
    "ls -la": True,
    "echo hi": True,
    "rm -rf x": False,
    "curl http://x": False,
    "git push": False,
}
OPERATORS = [";", "&&", "||", "|", "&", "\n", " ; ", " && "]


@given(
    st.lists(st.sampled_from(sorted(SIMPLE)), min_size=1, max_size=6),
    st.lists(st.sampled_from(OPERATORS), min_size=6, max_size=6),
    st.sampled_from(["", " ", "  ", "\t"]),
)
@settings(max_examples=300, deadline=None)
def test_compound_allowed_only_if_every_part_is(cmds: list[str], ops: list[str], pad: str) -> None:
    line = cmds[0] + "".join(f"{pad}{op}{pad}{c}" for op, c in zip(ops, cmds[1:], strict=False))
    expected = "allow" if all(SIMPLE[c] for c in cmds) else None
    assert run(line, allow=ALLOW) == expected
    denied = run(line, allow=ALLOW, deny=("execute(rm *)",))
    assert (denied == "deny") == ("rm -rf x" in cmds)


@given(
    st.sampled_from(sorted(SIMPLE)),
    st.sampled_from(["$({})", "`{}`", '"$({})"', "<({})", "$(echo $({}))"]),
    st.sampled_from(sorted(SIMPLE)),
)
@settings(max_examples=200, deadline=None)
def test_substitution_is_never_allowed_by_a_pattern(outer: str, wrap: str, inner: str) -> None:
    line = f"{outer} {wrap.format(inner)}"
    assert run(line, allow=(*ALLOW, "execute(*)")) is None
    if inner == "rm -rf x":
        assert run(line, deny=("execute(rm *)",)) == "deny"


def _quote(word: str, style: int) -> str:
    return [word, f"'{word}'", f'"{word}"', "\\" + "\\".join(word), f"{word[0]}''{word[1:]}"][style]


@given(
    st.lists(st.integers(0, 4), min_size=3, max_size=3), st.sampled_from(["", "ls; ", "ls && ", "(", "sudo "])
)
@settings(max_examples=200, deadline=None)
def test_quoting_does_not_hide_a_denied_command(styles: list[int], prefix: str) -> None:
    words = [_quote(w, s) for w, s in zip(["rm", "-rf", "x"], styles, strict=True)]
    line = prefix + " ".join(words) + (")" if prefix == "(" else "")
    assert split_commands(line).commands[-1].bare == "rm -rf x"
    assert run(line, deny=("execute(rm *)",)) == "deny"


SEGMENTS = st.sampled_from(["src", "lib", "a", "..", ".", "", "x.py"])


@given(st.lists(SEGMENTS, min_size=1, max_size=7), st.sampled_from(["", "./", f"{ROOT}/"]))
@settings(max_examples=400, deadline=None)
def test_path_normalisation_cannot_escape_a_pattern(segments: list[str], prefix: str) -> None:
    path = prefix + "/".join(segments)
    full = posixpath.normpath(posixpath.join(ROOT, path))
    inside_src = full.startswith(ROOT + "/src/")
    assert verdict("write_file", {"path": path}, allow=("write_file(/src/**)",)) == (
        "allow" if inside_src else None
    )
    outside = not (full == ROOT or full.startswith(ROOT + "/"))
    if outside:
        assert verdict("write_file", {"path": path}, allow=("write_file", "write_file(**)")) == "allow"
        assert verdict("write_file", {"path": path}, allow=("write_file(**)",)) is None


# ------------------------------------------------------------------ the hook, per mode
class Asker:
    """A front end that answers every question with one option id and counts them."""

    def __init__(self, answer: str | None = "allow_once") -> None:
        self.answer = answer
        self.asked: list[tuple[str, list[str]]] = []

    async def ask_permission(self, call, *, options, spec=None, timeout=600.0):  # type: ignore[no-untyped-def]
        self.asked.append((call.name, [o.id for o in options]))
        return self.answer


async def _session(mode: str, **rules: list[str]):  # type: ignore[no-untyped-def]
    """A session with crow's own tools (file tools, todos, the plan), whose kinds the
    permissions hook reads."""
    from builtin_hooks.plan import PlanHook
    from crow.config import Config, PermissionRules
    from crow.session import Session
    from crow.tools import ServerSpec, ToolHub
    from mcp_servers.filesystem import build_server
    from mcp_servers.todos import build_server as todo_server

    session = Session("s", Path(ROOT), mode=mode, config=Config(permissions=PermissionRules(**rules)))
    session.client = Asker()
    session.tools = ToolHub()
    own = [
        ServerSpec("filesystem", "inprocess", server=build_server(ROOT)),
        ServerSpec("todos", "inprocess", server=todo_server()),
    ]
    await session.tools.connect([*own, *PlanHook().tool_servers(session)])
    return session


async def _check(session, name: str, **args: object) -> str | None:  # type: ignore[no-untyped-def]
    from types import SimpleNamespace

    from builtin_hooks.permissions import PermissionsHook
    from crow.messages import ToolCall

    return await PermissionsHook().check(SimpleNamespace(session=session), ToolCall("c", name, args))


@pytest.mark.anyio
async def test_modes_and_rules_together() -> None:
    s = await _session("accept_edits", ask=["edit_file(/setup.py)"])
    assert await _check(s, "edit_file", path="src/a.py") is None and s.client.asked == []
    assert await _check(s, "edit_file", path="setup.py") is None
    assert s.client.asked == [("edit_file", ["allow_once", "reject_once", "reject_always"])]

    await s.tools.aclose()
    s = await _session("read_only", allow=["execute(git status *)", "write_file"])
    assert "read-only mode" in (await _check(s, "execute", command="git status") or ""), "never commands"
    assert "read-only mode" in (await _check(s, "execute", command="git push") or "")
    assert "read-only mode" in (await _check(s, "write_file", path="a", content="") or ""), "never edits"
    assert s.client.asked == []

    await s.tools.aclose()
    s = await _session("plan", allow=["write_file", "execute(git status *)"], deny=["write_todos"])
    assert "exit_plan_mode(plan)" in (await _check(s, "write_file", path="a", content="") or "")
    assert "exit_plan_mode(plan)" in (await _check(s, "execute", command="git status") or ""), "no commands"
    assert await _check(s, "exit_plan_mode", plan="do it") is None
    assert "`write_todos`" in (await _check(s, "write_todos", todos=[]) or ""), "deny holds everywhere"
    assert s.client.asked == []

    await s.tools.aclose()
    s = await _session("yolo", ask=["execute(git push *)"])
    s.client.answer = "reject_always"
    assert "declined" in (await _check(s, "execute", command="git push origin") or "")
    assert "rejected execute calls like this one" in (await _check(s, "execute", command="git push") or "")
    assert await _check(s, "execute", command="git pull") is None
    assert len(s.client.asked) == 1

    await s.tools.aclose()
    s = await _session("ask")
    s.client.answer = "not-an-option"
    assert "did not answer" in (await _check(s, "execute", command="ls") or "")
    await s.tools.aclose()


@given(st.text(alphabet=st.sampled_from(list("ab $`'\"\\(){};&|<>#\n\t=*~@!-12")), max_size=60))
@settings(max_examples=1000, deadline=None)
def test_any_line_parses_without_error(line: str) -> None:
    parsed = split_commands(line)
    if "`" in line.replace("\\`", "") and "'" not in line and "#" not in line:
        assert not parsed.plain, "a backtick is never plain"
    run(line, allow=ALLOW, deny=("execute(rm *)",))
