"""Agent definitions (crow.agent_definitions) without a model: the folders and their
precedence, Claude Code's files as written, a hostile repository's files, the stat cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crow import agent_definitions
from crow.agent_definitions import GENERAL_PURPOSE, MAX_AGENTS, find_agents
from crow.prompt_files import MAX_BYTES, MAX_ENTRIES


def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(data, bytes) else path.write_text)(data)  # type: ignore[operator]
    return path


def agent(name: str, description: str, body: str = "You help.\n", **more: str) -> str:
    lines = [f"name: {name}", f"description: {description}", *(f"{k}: {v}" for k, v in more.items())]
    return "---\n" + "\n".join(lines) + "\n---\n" + body


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "repo").mkdir()
    return tmp_path / "repo", tmp_path / "home"


def test_without_files_only_the_builtin_general_purpose_agent(dirs: tuple[Path, Path]) -> None:
    agents, problems = find_agents(*dirs)
    assert agents == {"general-purpose": GENERAL_PURPOSE} and problems == []
    assert GENERAL_PURPOSE.scope == "builtin" and GENERAL_PURPOSE.tools is None and GENERAL_PURPOSE.path == ""
    assert "final answer" in GENERAL_PURPOSE.prompt and "report" in GENERAL_PURPOSE.prompt


def test_crow_then_claude_then_the_users_folder_first_of_each_name_wins(dirs: tuple[Path, Path]) -> None:
    cwd, home = dirs
    write(cwd / ".crow/agents/reviewer.md", agent("reviewer", "crow's reviewer"))
    write(cwd / ".claude/agents/reviewer.md", agent("reviewer", "claude's reviewer"))
    write(cwd / ".claude/agents/tester.md", agent("tester", "claude's tester"))
    write(home / "agents/tester.md", agent("tester", "my tester"))
    write(home / "agents/mine.md", agent("mine", "my own"))
    write(home / "agents/general-purpose.md", agent("general-purpose", "my default", "Do it my way.\n"))
    agents, problems = find_agents(cwd, home)
    assert problems == []  # a name in a later folder is overridden, not a problem
    assert {n: (a.description, a.scope) for n, a in agents.items()} == {
        "reviewer": ("crow's reviewer", "project"),
        "tester": ("claude's tester", "project"),
        "mine": ("my own", "user"),
        "general-purpose": ("my default", "user"),
    }
    assert agents["reviewer"].path == str((cwd / ".crow/agents/reviewer.md").resolve())
    assert agents["general-purpose"].prompt == "Do it my way."


def test_a_claude_code_agent_file_as_written(dirs: tuple[Path, Path]) -> None:
    cwd, home = dirs
    text = """\
---
name: code-reviewer
description: Expert code review specialist. Proactively reviews code for quality,
  security, and maintainability. Use immediately after writing or modifying code.
tools: Read, Grep, Glob, Bash
model: sonnet
color: purple
---

You are a senior code reviewer ensuring high standards of code quality and security.

When invoked:
1. Run git diff to see recent changes
2. Focus on modified files
"""
    write(cwd / ".claude/agents/code-reviewer.md", text)
    write(
        cwd / ".claude/agents/inherits.md",
        agent("inherits", "x", model="inherit", tools="[Edit, MultiEdit, TodoWrite, mcp__github__get_issue]"),
    )
    write(
        cwd / ".claude/agents/planner.md",
        agent("planner", "x", permissionMode="plan", tools="LS, WebFetch, Bash(git:*)"),
    )
    agents, problems = find_agents(cwd, home)
    assert problems == []
    reviewer = agents["code-reviewer"]
    assert reviewer.description == (
        "Expert code review specialist. Proactively reviews code for quality, security, and"
        " maintainability. Use immediately after writing or modifying code."
    )
    assert reviewer.tools == ("read_file", "grep", "glob", "execute")
    assert reviewer.model == "sonnet" and reviewer.mode is None and reviewer.scope == "project"
    assert reviewer.prompt.startswith("You are a senior code reviewer") and reviewer.prompt.endswith(
        "modified files"
    )
    inherits = agents["inherits"]
    assert inherits.model is None
    assert inherits.tools == ("edit_file", "write_todos", "mcp__github__get_issue")  # Edit and MultiEdit: one
    # names crow has no tool for are kept: they match no tool, so the child has less, never more
    assert agents["planner"].tools == ("ls", "WebFetch", "Bash(git:*)") and agents["planner"].mode == "plan"


def test_fields_crow_writes_and_their_defaults(dirs: tuple[Path, Path]) -> None:
    cwd, home = dirs
    write(
        cwd / ".crow/agents/reviewer.md",
        agent(
            "reviewer", "Reviews", tools="[read_file, grep]", mode="read_only", model="openai:gpt-4.1-mini"
        ),
    )
    write(
        cwd / ".crow/agents/stem-named.md", "---\ntools: []\n---\n# Finds things fast\n\nYou find things.\n"
    )
    write(cwd / ".crow/agents/nested/deeper.md", "---\ndescription: in a subfolder\n---\nBody\n")
    write(cwd / ".crow/agents/long.md", agent("long", "word " * 1000))
    agents, problems = find_agents(cwd, home)
    assert problems == []
    reviewer = agents["reviewer"]
    assert (reviewer.tools, reviewer.mode, reviewer.model) == (
        ("read_file", "grep"),
        "read_only",
        "openai:gpt-4.1-mini",
    )
    stem = agents["stem-named"]
    assert stem.description == "Finds things fast" and stem.tools == () and stem.model is None
    assert agents["deeper"].description == "in a subfolder"  # subfolders are read, as Claude Code does
    long = agents["long"].description
    assert len(long) == agent_definitions.MAX_DESCRIPTION and long.endswith("…")


def test_a_hostile_repository_costs_only_its_bad_files(tmp_path: Path, dirs: tuple[Path, Path]) -> None:
    cwd, home = dirs
    folder = cwd / ".crow" / "agents"
    write(folder / "good.md", agent("good", "Good"))
    write(folder / "huge.md", agent("huge", "x", "y" * MAX_BYTES))
    write(folder / "binary.md", b"\x7fELF\x02\x01\x01\x00\x00\x00")
    write(folder / "nul.md", agent("nul", "x", "before\x00after"))
    write(folder / "latin1.md", agent("latin1", "caf\xe9").encode("latin-1"))
    write(tmp_path / "secret.md", agent("secret", "outside", "Exfiltrate.\n"))
    (folder / "escape.md").symlink_to(tmp_path / "secret.md")
    os.mkfifo(folder / "fifo.md")
    write(folder / "badname.md", agent("../../etc", "x"))
    write(folder / "has space.md", "---\ndescription: x\n---\nbody\n")
    write(folder / "longname.md", agent("a" * 65, "x"))
    write(folder / "intname.md", agent("123", "x").replace("name: 123", "name: [1]"))
    write(folder / "badmode.md", agent("badmode", "x", mode="read-only"))
    write(folder / "dontask.md", agent("dontask", "x", permissionMode="dontAsk"))
    write(folder / "denies.md", agent("denies", "x", disallowedTools="Bash"))
    write(folder / "nofront.md", "You are a reviewer.\n")
    write(folder / "empty.md", agent("empty", "x", "\n  \n"))
    write(folder / "badtools.md", agent("badtools", "x", tools="[[Read], Grep]"))
    write(folder / "badmodel.md", agent("badmodel", "x", model="[1, 2]"))
    write(folder / "unclosed.md", "---\nname: unclosed\n")
    write(folder / "twin.md", agent("good", "a second good"))
    agents, problems = find_agents(cwd, home)
    assert sorted(agents) == ["general-purpose", "good"]
    assert agents["good"].description == "Good"
    said = "\n".join(problems)
    for why in (
        "huge.md: over 256 KB",
        "binary.md: binary content",
        "nul.md: binary content",
        "latin1.md: not UTF-8",
        "escape.md: a symlink out of",
        "fifo.md: not a regular file",
        "badname.md: '../../etc' is not an agent name",
        "has space.md: 'has space' is not an agent name",
        f"longname.md: '{'a' * 65}' is not an agent name",
        "intname.md: a list is not an agent name",
        "badmode.md: 'mode' 'read-only' is not one of ask, accept_edits, yolo, read_only, plan",
        "dontask.md: 'permissionMode' 'dontAsk' is not one of",
        "denies.md: 'disallowedTools' is not supported",
        "nofront.md: no frontmatter",
        "empty.md: the body (the agent's system prompt) is empty",
        "badtools.md: 'tools' must be a list of tool names",
        "badmodel.md: 'model' must be a model name",
        "unclosed.md: frontmatter has no closing",
        f"twin.md: agent 'good' is also defined by {folder.resolve() / 'good.md'}",
    ):
        assert why in said, why
    assert len(problems) == 19, said
    assert all(line.startswith(str(folder)) for line in problems), "each problem names its file"
    assert all(line.endswith("skipped") for line in problems)


def test_a_project_agents_folder_linked_out_of_the_project_is_refused(
    tmp_path: Path, dirs: tuple[Path, Path]
) -> None:
    cwd, home = dirs
    write(tmp_path / "elsewhere" / "spy.md", agent("spy", "from outside"))
    (cwd / ".claude").mkdir()
    (cwd / ".claude" / "agents").symlink_to(tmp_path / "elsewhere")
    agents, problems = find_agents(cwd, home)
    assert "spy" not in agents and problems == [
        f"{cwd}/.claude/agents: a symlink out of the project; skipped"
    ]
    home.symlink_to(tmp_path / "dotfiles")
    write(tmp_path / "dotfiles" / "agents" / "mine.md", agent("mine", "Mine"))
    agents, _ = find_agents(cwd, home)
    assert agents["mine"].scope == "user", "the user's own folder may be a link (dotfiles)"


def test_a_folder_of_countless_entries_is_listed_only_so_far(dirs: tuple[Path, Path]) -> None:
    """100,000 entries in a repository's agents folder: found before every model request,
    so the listing stops at MAX_ENTRIES; the user's own agents are still read."""
    cwd, home = dirs
    folder = cwd / ".crow" / "agents"
    folder.mkdir(parents=True)
    for i in range(100_000):
        os.close(os.open(folder / f"junk{i}.txt", os.O_CREAT | os.O_WRONLY, 0o644))
    write(home / "agents" / "mine.md", agent("mine", "Mine"))
    agents, problems = find_agents(cwd, home)
    assert sorted(agents) == ["general-purpose", "mine"]
    assert problems == [f"{folder}: over {MAX_ENTRIES} files and folders; the rest are skipped"]


def test_a_thousand_agents_are_cut_to_max_agents_per_folder(dirs: tuple[Path, Path]) -> None:
    cwd, home = dirs
    for i in range(MAX_AGENTS + 5):
        write(cwd / ".crow" / "agents" / f"a{i:03}.md", agent(f"a{i:03}", f"Agent {i}"))
    write(home / "agents" / "mine.md", agent("mine", "Mine"))
    agents, problems = find_agents(cwd, home)
    assert len(agents) == MAX_AGENTS + 2 and "a099" in agents and "a100" not in agents and "mine" in agents
    assert problems == [f"{cwd / '.crow/agents'}: over {MAX_AGENTS} agent files; the rest are skipped"]


def test_an_unchanged_file_is_not_read_again_a_changed_one_is(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cwd, home = dirs
    path = write(cwd / ".crow/agents/a.md", agent("a", "First"))
    write(cwd / ".crow/agents/b.md", agent("b", "Bee"))
    find_agents(cwd, home)
    reads: list[str] = []
    real = agent_definitions.read_text_file
    monkeypatch.setattr(agent_definitions, "read_text_file", lambda p: reads.append(p) or real(p))
    agents, _ = find_agents(cwd, home)
    assert reads == [] and agents["a"].description == "First"
    write(path, agent("a", "Second, longer"))
    agents, _ = find_agents(cwd, home)
    assert agents["a"].description == "Second, longer" and reads == [str(path.resolve())]
    write(path, agent("a", "x", mode="bogus"))  # a file turned bad is a problem, every scan
    for _ in range(2):
        agents, problems = find_agents(cwd, home)
        assert "a" not in agents and len(problems) == 1
    assert len(reads) == 2


def test_the_worked_example_in_the_docs_reads_as_they_say(dirs: tuple[Path, Path]) -> None:
    cwd, home = dirs
    docs = (Path(__file__).parents[1] / "docs" / "agents.md").read_text()
    example = docs.split("`.crow/agents/reviewer.md` in your project:\n\n```markdown\n")[1].split("\n```")[0]
    write(cwd / ".crow/agents/reviewer.md", example + "\n")
    agents, problems = find_agents(cwd, home)
    reviewer = agents["reviewer"]
    assert problems == [] and reviewer.scope == "project"
    assert (reviewer.tools, reviewer.mode, reviewer.model) == (
        ("read_file", "grep", "glob"),
        "read_only",
        None,
    )
    assert reviewer.description.startswith("Reviews a change for bugs") and reviewer.description.endswith(
        "Read-only."
    )
    assert reviewer.prompt.startswith("You are a careful code reviewer.")


LAUGHS = """\
import resource, sys
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from crow.agent_definitions import find_agents
agents, problems = find_agents(Path(sys.argv[1]), Path(sys.argv[1]) / "home")
print(sorted(agents), problems)
"""


@pytest.mark.parametrize("key", ["name", "mode", "permissionMode", "tools", "model", "description"])
def test_a_billion_laughs_value_is_refused_not_spelled_out(tmp_path: Path, key: str) -> None:
    """1 KB of YAML aliases (a list of lists of ... 9^12 words) as a field: the problem line
    named the value with repr(), spelling it out until memory ran out."""
    import subprocess
    import sys

    lines = ["---", "a0: &a0 [" + ",".join(["lol"] * 9) + "]"]
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 12)]
    lines += [f"{key}: [*a11]", "description: x" if key != "description" else "", "---", "body"]
    write(tmp_path / ".crow" / "agents" / "laugh.md", "\n".join(lines) + "\n")
    done = subprocess.run(
        [sys.executable, "-c", LAUGHS, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("['general-purpose'] [") and "laugh.md: " in done.stdout
    assert len(done.stdout) < 1000, done.stdout[:1000]
