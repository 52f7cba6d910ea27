"""A session's slash commands: gathered from every source, kept current, advertised.

`refresh` gathers them (`crow.commands` says which sources, in which precedence): the
prompt files are a listing and a stat each (`crow.prompt_files`), hooks' `commands(session)`
run in the same worker thread, MCP prompts are what the tool hub listed. It runs when the
session's tools are ready, before each prompt and after an MCP server's prompts changed;
when the list differs from what the front end was last shown, `CommandsChanged` goes to
the front end: through the prompt's sink, or outside a prompt through the one a front end
registered with `watch` (ACP sends `available_commands_update`). Problems (a broken prompt
file) are told once each, as warnings at the next prompt. Nothing here runs on the way to
the `initialize` or `session/new` answers.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crow import images
from crow.commands import NAME, SCOPES, PromptCommand, init_command
from crow.errors import CommandError
from crow.events import CommandsChanged, Emit, Notice
from crow.messages import Message

if TYPE_CHECKING:
    from crow.agent import Agent
    from crow.prompting import Command
    from crow.session import Session

log = logging.getLogger("crow.commands")

STATE = "crow.commands"  # session.state: the session's _Book
COMMAND_META = "command"  # Message.meta of an expanded prompt: {"name", "line"}
# Message.meta of a prompt with embedded files (`@a.py` in an editor): where in its
# content they begin; before it is the typed text, where each file is a mention.
ATTACHED = "attached_from"


@dataclass(eq=False)
class _Book:
    commands: dict[str, PromptCommand] = field(default_factory=dict)
    gathered: bool = False
    gathered_at: float = float("-inf")  # time.monotonic() of the last gathering
    shown: tuple[Command, ...] | None = None  # what the front end was last told
    sink: Emit | None = None  # the front end's, outside a prompt
    told: set[str] = field(default_factory=set)
    untold: list[str] = field(default_factory=list)


# A prompt that names no command gathers the commands again at most this often (seconds):
# one a person types always does; a script's rapid prompts do not pay a scan each.
REFRESH_EVERY = 1.0


def stale(session: Session) -> bool:
    """Whether a prompt that names no command should gather the session's commands again."""
    return time.monotonic() - _book(session).gathered_at >= REFRESH_EVERY


def _book(session: Session) -> _Book:
    book = session.state.get(STATE)
    if book is None:
        book = session.state[STATE] = _Book()
    return book


def builtin_commands() -> list[Command]:
    """What every session offers before its own sources are read."""
    from crow.prompting import BUILTINS

    return [*(c for c, _ in BUILTINS.values()), init_command(Path()).command]


def listed(session: Session) -> list[Command]:
    """Everything the session offers now, builtins first."""
    from crow.prompting import BUILTINS

    return [*(c for c, _ in BUILTINS.values()), *(c.command for c in _book(session).commands.values())]


async def gather(agent: Agent, session: Session) -> tuple[dict[str, PromptCommand], list[str]]:
    """The session's prompt commands by name, first of a name by precedence, and the
    problems met."""
    import anyio

    from crow import mcp_prompts, prompt_files
    from crow.prompting import BUILTINS

    home = (session.config or agent.config).home
    hooks = agent.hooks.hooks

    def read() -> tuple[list[PromptCommand], list[str]]:
        found, problems = prompt_files.scan(session.cwd, Path(home).expanduser())
        for hook in hooks:
            try:
                offered = list(hook.commands(session))
            except Exception as exc:  # a hook's bug costs its commands, not the others
                log.exception("hook %s: commands() failed", hook.hook_name)
                problems.append(f"hook {hook.hook_name!r} could not list its commands: {exc}")
                continue
            for command in offered:
                if NAME.fullmatch(command.name):
                    found.append(command)
                else:
                    problems.append(f"hook {hook.hook_name!r}: {command.name!r} is no command name; skipped")
        return found, problems

    found, problems = await anyio.to_thread.run_sync(read)
    found = [init_command(session.cwd), *found]
    if session.tools is not None:
        found += mcp_prompts.commands(session.tools)
    chosen: dict[str, PromptCommand] = {}
    for command in sorted(found, key=lambda c: SCOPES.index(c.scope)):  # stable: source order within a scope
        if command.name in BUILTINS or command.name in chosen:
            known = chosen.get(command.name)
            winner = known.origin if known is not None else "builtin"
            log.info("/%s from %s is shadowed by the one from %s", command.name, command.origin, winner)
            continue
        chosen[command.name] = command
    return chosen, problems


async def refresh(agent: Agent, session: Session, emit: Emit | None = None) -> None:
    """Gather the session's commands again; tell the front end when they changed (through
    `emit`, else the watcher's sink), and, with `emit`, the problems not told yet."""
    book = _book(session)
    book.commands, problems = await gather(agent, session)
    book.gathered, book.gathered_at = True, time.monotonic()
    for problem in problems:
        if problem not in book.told:
            book.told.add(problem)
            book.untold.append(problem)
            log.warning("slash commands: %s", problem)
    sink = emit or book.sink
    now = tuple(listed(session))
    if sink is not None and now != book.shown:
        book.shown = now
        await sink(CommandsChanged(now))
    if emit is not None and book.untold:
        untold, book.untold = book.untold, []
        for problem in untold:
            await emit(Notice(problem, "warning", "A slash command was skipped"))


async def watch(session: Session, sink: Emit, shown: list[Command]) -> None:
    """A front end's sink for changes outside a prompt; it was shown `shown`. Once the
    session's commands are gathered, it is sent them if they differ."""
    book = _book(session)
    book.sink, book.shown = sink, tuple(shown)
    now = tuple(listed(session))
    if book.gathered and now != book.shown:
        book.shown = now
        await sink(CommandsChanged(now))


async def refresh_logged(agent: Agent, session: Session) -> None:
    """`refresh` outside a prompt (the session's tools connected, an MCP server's prompts
    changed): a failure is logged, never raised into the caller's task."""
    try:
        await refresh(agent, session)
    except Exception:
        log.exception("session %s: its slash commands could not be gathered", session.id)


def typed(message: Message) -> tuple[str, str]:
    """(what the user typed, the embedded files' text after it) of a prompt."""
    end = (message.meta or {}).get(ATTACHED)
    if not isinstance(end, int):
        return message.content, ""
    return message.content[:end], message.content[end:].lstrip("\n")


def resolve(session: Session, message: Message) -> tuple[PromptCommand, str] | None:
    """(the command, the rest of the line) when the typed text starts with one of the
    session's prompt commands; None otherwise (an unknown `/word` is an ordinary prompt)."""
    from crow.prompting import parse_command

    commands = _book(session).commands
    parsed = parse_command(typed(message)[0], commands)
    return (commands[parsed[0]], parsed[1]) if parsed is not None else None


def expanded(message: Message, command: PromptCommand, out: str | Message) -> Message:
    """The prompt the model reads in place of the user's line; the line is kept in its
    meta, which is what a replay shows (`crow.acp.view.replay`)."""
    text, extra = (out, ()) if isinstance(out, str) else (out.content, out.images)
    attached = (*message.images, *extra)[: images.MAX_PER_PROMPT]
    if not text.strip() and not attached:  # as an editor's empty prompt is: providers refuse it
        raise CommandError(f"/{command.name} expanded to an empty prompt")
    line, files = typed(message)
    text = "\n\n".join(filter(None, (text, files)))  # the files mentioned follow the expansion
    meta: dict[str, Any] = {**(message.meta or {}), COMMAND_META: {"name": command.name, "line": line}}
    meta.pop(ATTACHED, None)
    return message.replace(content=text, images=attached, meta=meta)


def shown_line(message: Message) -> str:
    """What the user typed for a stored prompt: the command line it was expanded from."""
    meta = (message.meta or {}).get(COMMAND_META)
    line = meta.get("line") if isinstance(meta, dict) else None
    return line if isinstance(line, str) else message.content
