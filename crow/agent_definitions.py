"""Agent definitions: what a subagent is (crow's `task` tool runs them).

    ---
    name: reviewer
    description: Reviews a change for bugs; read-only
    tools: read_file, grep, glob
    model: openai:gpt-4.1-mini
    mode: read_only
    ---
    You review code. ...

Found in `.crow/agents/*.md` and `.claude/agents/*.md` (the project's, under the session's
cwd) and `$CROW_HOME/agents/*.md` (the user's), in that order: the first file of each
name wins, and a file may replace the builtin `general-purpose` agent. Subfolders are read
too (as Claude Code does): a file's name is its frontmatter `name`, else its file name.
Claude Code's files work as written: its tool names map to crow's (`Read` is `read_file`),
`model: inherit` is the parent's model, `permissionMode` stands for `mode`, and keys crow
has no use for (`color`, ...) are ignored.

A repository may be hostile: files are read as `crow.prompt_files` reads prompt files
(its `walk`, `read` and `StatCache`). A file that cannot be used is a problem line naming
it, and its agent is not offered; so is one whose `mode` crow does not know, or with a
`disallowedTools` list: run without them, the agent would have more than its author meant.
What a definition asks for is not yet granted: the `task` tool decides whether its `model`
is one the user configured, and keeps its `mode` only when stricter than the parent's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

from crow.config import MODES
from crow.frontmatter import split_frontmatter
from crow.prompt_files import StatCache, existing, read_text_file, walk

Scope = Literal["project", "user", "builtin"]
NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
# Every agent's name and description are in the `task` tool's description, sent with each
# model request: a repository's thousand agents must not make every request huge.
MAX_AGENTS = 100  # per folder
MAX_DESCRIPTION = 1024  # characters
FOLDERS: tuple[str, ...] = (".crow/agents", ".claude/agents")  # the project's
USER_FOLDER = "agents"  # in CROW_HOME
# Claude Code's tool names -> crow's; any other name (an MCP tool's) is kept as written.
CLAUDE_TOOLS = {
    "Read": "read_file",
    "Write": "write_file",
    "Edit": "edit_file",
    "MultiEdit": "edit_file",
    "Glob": "glob",
    "Grep": "grep",
    "LS": "ls",
    "Bash": "execute",
    "TodoWrite": "write_todos",
}
# Claude Code's `permissionMode` -> crow's mode (None: the parent's)
CLAUDE_MODES: dict[str, str | None] = {
    "default": None,
    "acceptEdits": "accept_edits",
    "plan": "plan",
    "bypassPermissions": "yolo",
}


@dataclass(frozen=True, slots=True)
class AgentDefinition:
    name: str
    description: str
    prompt: str  # the child's system prompt
    tools: tuple[str, ...] | None = None  # an allow-list of tool names; None: every tool
    model: str | None = None  # a model ref; None: the parent's
    mode: str | None = None  # a mode; None: the parent's (a child is never less strict)
    path: str = ""  # the file it came from ("" for the builtin default)
    scope: Scope = "builtin"  # whose folder it came from


GENERAL_PURPOSE = AgentDefinition(
    name="general-purpose",
    description=(
        "A general-purpose agent for a self-contained task: researching a question across"
        " the code, searching for files or usages, or making a change in several steps."
    ),
    prompt="""\
You are a subagent: another agent handed you one task, and only your final answer goes \
back to it. It does not see your tool calls, their results or anything else you write.

- Work on the task with the tools you have. Search broadly before you conclude that \
something does not exist; read the code you report on rather than guessing.
- Be thorough, but stay inside the task: do not change files the task did not ask you to \
change.
- If the task cannot be done, say why and what you found on the way.

End with a concise report: what you found or did, with file paths (and line numbers where \
they help), and anything left undone or uncertain. That report is your whole answer.""",
)

# (real path, scope) -> the file's definition, or why it is skipped
_cache: StatCache[AgentDefinition | str] = StatCache()


def folders(cwd: Path, home: Path) -> list[tuple[Path, Scope]]:
    """Where agent files are looked for, in precedence order."""
    project: list[tuple[Path, Scope]] = [(cwd / f, "project") for f in FOLDERS]
    return [*project, (home / USER_FOLDER, "user")]


def find_agents(cwd: Path, home: Path) -> tuple[dict[str, AgentDefinition], list[str]]:
    """Every agent definition for a session in `cwd` by name (the default included), and
    the problems met (one line each, naming the file)."""
    found: dict[str, AgentDefinition] = {}
    problems: list[str] = []
    for folder, scope, within in existing(folders(cwd, home), cwd):
        paths = walk(folder, problems, within, "agent files")
        if len(paths) > MAX_AGENTS:
            problems.append(f"{folder}: over {MAX_AGENTS} agent files; the rest are skipped")
        here: dict[str, str] = {}  # name -> path, in this folder: a twin in it is a problem
        for path, _ in paths[:MAX_AGENTS]:
            outcome = _cache.get((path, scope), partial(_parse, path, scope))
            if isinstance(outcome, str):
                problems.append(outcome)
            elif outcome is None:
                continue  # gone since the listing
            elif outcome.name in here:
                problems.append(
                    f"{path}: agent {outcome.name!r} is also defined by {here[outcome.name]}; skipped"
                )
            else:
                here[outcome.name] = path
                found.setdefault(outcome.name, outcome)  # an earlier folder's wins
    _cache.trim()
    found.setdefault(GENERAL_PURPOSE.name, GENERAL_PURPOSE)
    return found, problems


def _parse(path: str, scope: Scope) -> AgentDefinition | str:
    """The definition a file holds, or why it is skipped."""
    try:
        meta, body = split_frontmatter(read_text_file(path))
        if meta is None:
            raise ValueError("no frontmatter (a '---' block with at least a description)")
        return _definition(meta, body.strip(), path, scope)
    except (OSError, ValueError) as exc:
        return f"{path}: {exc}; skipped"


def _definition(meta: dict[str, Any], prompt: str, path: str, scope: Scope) -> AgentDefinition:
    name = meta.get("name", Path(path).stem)
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"{_shown(name)} is not an agent name (1-64 letters, digits, _ or -)")
    if not prompt:
        raise ValueError("the body (the agent's system prompt) is empty")
    if meta.get("disallowedTools"):  # ignoring it would give the agent what its author denied
        raise ValueError("'disallowedTools' is not supported: list the tools it may use in 'tools'")
    return AgentDefinition(
        name=name,
        description=_description(meta.get("description"), prompt),
        prompt=prompt,
        tools=_tools(meta.get("tools")),
        model=_model(meta.get("model")),
        mode=_mode(meta),
        path=path,
        scope=scope,
    )


def _description(value: object, prompt: str) -> str:
    if value is not None and not isinstance(value, str):
        raise ValueError("'description' must be text")
    text = value or next(ln for ln in prompt.splitlines() if ln.strip()).lstrip("#")
    text = " ".join(text.split())
    return text if len(text) <= MAX_DESCRIPTION else text[: MAX_DESCRIPTION - 1] + "…"


def _tools(value: object) -> tuple[str, ...] | None:
    """The allow-list: a YAML list or Claude Code's `Read, Grep, Glob`; None when absent."""
    if value is None:
        return None
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise ValueError("'tools' must be a list of tool names or a comma-separated text")
    names = (CLAUDE_TOOLS.get(t.strip(), t.strip()) for t in value)
    return tuple(dict.fromkeys(n for n in names if n))  # Edit and MultiEdit are one tool


def _model(value: object) -> str | None:
    if value is None or value == "inherit":
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError("'model' must be a model name")
    return value.strip()


def _mode(meta: dict[str, Any]) -> str | None:
    if "mode" in meta:
        mode = meta["mode"]
        if mode is not None and mode not in MODES:
            raise ValueError(f"'mode' {_shown(mode)} is not one of {', '.join(MODES)}")
        return mode
    claude = meta.get("permissionMode")
    if claude is None:
        return None
    if not isinstance(claude, str) or claude not in CLAUDE_MODES:
        raise ValueError(f"'permissionMode' {_shown(claude)} is not one of {', '.join(CLAUDE_MODES)}")
    return CLAUDE_MODES[claude]


def _shown(value: object) -> str:
    """A frontmatter value in a problem line: text quoted and cut, anything else by its
    type (a YAML list of aliases of aliases spelled out would be billions of items)."""
    if isinstance(value, str):
        return repr(value if len(value) <= 80 else value[:79] + "…")
    return f"a {type(value).__name__}" if isinstance(value, list | dict) else repr(value)
