"""Agent definitions: what a subagent is (crow's `task` tool runs them).

    ---
    name: reviewer
    description: Reviews a change for bugs; read-only
    tools: read_file, grep, glob
    model: openai:gpt-4.1-mini
    mode: read_only
    ---
    You review code. ...

`.crow/agents/*.md` and `.claude/agents/*.md` (the project's, under the session's cwd) and
`$CROW_HOME/agents/*.md` (the user's). The body is the child's system prompt.

TODO(helper: definitions): discovery, hostile-file care as in crow.prompt_files, the
default general-purpose agent, Claude Code's tool names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class AgentDefinition:
    name: str
    description: str
    prompt: str  # the child's system prompt
    tools: tuple[str, ...] | None = None  # an allow-list of tool names; None: every tool
    model: str | None = None  # a model ref; None: the parent's
    mode: str | None = None  # a mode; None: the parent's (a child is never less strict)
    path: str = ""  # the file it came from ("" for the builtin default)


def find_agents(cwd: Path, home: Path) -> tuple[dict[str, AgentDefinition], list[str]]:
    """Every agent definition for a session in `cwd` by name (the default included), and
    the problems met (one line each, naming the file)."""
    raise NotImplementedError
