"""Slash commands that become a prompt: the type every source produces, and its arguments.

A `PromptCommand` is `/name rest-of-line` turned into the prompt the model reads
(`expand(rest)`); the user's line is what the transcript shows. Sources, first of a name
wins (`crow.command_catalog` merges them, builtins of `crow.prompting.BUILTINS` first):

    builtin  /init
    project  .crow/commands/, .claude/commands/ under the session's cwd; a hook's commands
             that live in the project (a skill in .crow/skills/)
    user     $CROW_HOME/commands/; a hook's commands that live elsewhere
    mcp      every prompt of the session's MCP servers, as /<server>.<prompt>

Arguments follow Claude Code's prompt files: `$ARGUMENTS` is the whole rest of the line,
`$1`, `$2`... its words (quotes group words), `$ARGUMENTS[0]`... the same from 0; a body
that uses none gets the arguments appended as `ARGUMENTS: ...`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from crow.messages import Message
    from crow.prompting import Command

Scope = Literal["builtin", "project", "user", "mcp"]
SCOPES: tuple[Scope, ...] = ("builtin", "project", "user", "mcp")  # precedence, first wins
# What a command name may be: typed after `/` up to the first space.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")
SHOWN = 200  # characters of a description or hint the editor is shown
_PLACEHOLDER = re.compile(r"\$(?:ARGUMENTS\[(\d+)\]|(ARGUMENTS)(?![\w\[])|([1-9]\d*)(?!\w))")


@dataclass(frozen=True, slots=True)
class PromptCommand:
    """A slash command that becomes a prompt. `expand(rest_of_line)` returns the text the
    model reads (or a user `Message`, to attach images); raising `CommandError` refuses it
    with that message (shown to the user; no turn runs). `scope` decides precedence;
    `origin` says where it came from (shown with its description)."""

    name: str
    description: str
    expand: Callable[[str], Awaitable[str | Message]]
    hint: str = ""  # what may follow the name
    scope: Scope = "user"
    origin: str = ""

    @property
    def command(self) -> Command:
        from crow.prompting import Command

        # What the editor is shown, bounded whatever the source (an MCP server may declare
        # hundreds of long argument names).
        return Command(self.name, one_line(self.description), one_line(self.hint), self.origin or self.scope)


def one_line(text: str) -> str:
    """`text` on one line, at most `SHOWN` characters (cut ones end with `…`)."""
    text = " ".join(text.split())
    return text if len(text) <= SHOWN else text[: SHOWN - 1] + "…"


def split_arguments(text: str) -> list[str]:
    """The words of a command line, quotes grouping words (`a "b c"` -> [a, b c]); an
    unbalanced quote falls back to splitting at whitespace."""
    import shlex

    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def expand_arguments(template: str, arguments: str) -> str:
    """`template` with `$ARGUMENTS`, `$1`... and `$ARGUMENTS[0]`... replaced (a missing word
    is empty); when it has none of them, non-empty arguments are appended."""
    words: list[str] | None = None
    found = False

    def replace(match: re.Match[str]) -> str:
        nonlocal words, found
        found = True
        if match.group(2):
            return arguments
        if words is None:
            words = split_arguments(arguments)
        index = int(match.group(1)) if match.group(1) is not None else int(match.group(3)) - 1
        return words[index] if index < len(words) else ""

    text = _PLACEHOLDER.sub(replace, template)
    if not found and arguments.strip():
        text = "\n\n".join(filter(None, (text.rstrip(), f"ARGUMENTS: {arguments.strip()}")))
    return text


# ------------------------------------------------------------------ /init
INIT_PROMPT = """\
Look at this project and {action} AGENTS.md at its root: the file coding agents read \
before they work here, so they can be useful at once.

First explore: the README and other docs, the build and package files, the CI \
configuration, the layout of the source and test folders, and any instructions written \
for other agents or editors (CLAUDE.md, .cursorrules, .cursor/rules/, \
.github/copilot-instructions.md, CONTRIBUTING). Base every line on what you found; \
leave out what you could not confirm.

Then write, briefly and specifically for this project:
- how to set it up, build it, run it, lint it and run the tests, including a single test;
- the big picture: the main parts, where they live and how they fit together, as far as \
it takes reading several files to see;
- the conventions a newcomer would get wrong: style, naming, error handling, how changes \
are tested and committed.

Skip generic advice that holds for any project and lists a reader can get from `ls`. \
Keep it short: a page is plenty.{existing}"""
_EXISTING = (
    "\n\nAGENTS.md already exists: read it first, keep what is still true, correct what is "
    "not and add what is missing; do not start over."
)


def init_command(cwd: Path) -> PromptCommand:
    """`/init [instructions]`: a turn that writes or updates the project's AGENTS.md."""

    async def expand(arguments: str) -> str:
        exists = (cwd / "AGENTS.md").exists()
        text = INIT_PROMPT.format(
            action="update" if exists else "write", existing=_EXISTING if exists else ""
        )
        return f"{text}\n\nThe user adds: {arguments.strip()}" if arguments.strip() else text

    description = "Write or update AGENTS.md from a look at the project"
    return PromptCommand("init", description, expand, "optional instructions", "builtin", "builtin")
