"""A user's prompt, handled the same way whatever the front end (ACP, `crow run`, a script).

`Agent.prompt(session, message, emit)` comes here. The front end turns the user's input into
a `Message` and shows the events it is handed; everything else is decided here, once:

- a builtin slash command (`/compact [instructions]`) runs instead of a turn; the line is
  kept in the transcript (shown on replay) but never sent to the model;
- a prompt command (`/init`, a prompt file, a skill, an MCP prompt: `crow.command_catalog`)
  becomes the turn's prompt: the model reads the expansion, the stored message keeps the
  typed line in its meta, which a replay shows; one that cannot expand is told, no turn;
- the first prompt names the session (`TitleChanged`);
- every `Notice` is stored as a system message outside the model context, so a replay to
  a front end that shows notices as text shows what the user was told (`notice_record`).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from crow import notices, report_commands
from crow.errors import AuthError, AuthRequired, CommandError, ConfigError, CrowError, MissingKeyError
from crow.events import Emit, Event, ModeChanged, Notice, TitleChanged
from crow.messages import Message
from crow.rewind import undo
from crow.session import new_message_id

if TYPE_CHECKING:
    from crow.agent import Agent
    from crow.compact import CompactResult
    from crow.loop import TurnResult
    from crow.session import Session

log = logging.getLogger("crow.commands")

TITLE_LENGTH = 80
_LINE = re.compile(r"/(\S+)(?:\s+(.*))?\Z", re.DOTALL)  # /name, then the rest of the line


@dataclass(frozen=True, slots=True)
class Command:
    """A slash command: `/name rest-of-line`. Front ends advertise these."""

    name: str
    description: str
    hint: str  # what may follow the name
    source: str = "builtin"  # where it comes from, shown with the hint


# A builtin command runs instead of a turn: (agent, session, the rest of the line, emit).
# The line itself is kept in the transcript (shown on replay), never sent to the model.
Builtin = Callable[["Agent", "Session", str, Emit], Awaitable["TurnResult"]]


def parse_command(text: str, names: Iterable[str]) -> tuple[str, str] | None:
    """`/compact keep the API notes` -> ("compact", "keep the API notes") when "compact" is
    one of `names`; None for text that names none (an unknown `/word` is an ordinary prompt).
    The name ends at any whitespace: `/compact` then a new line and instructions is /compact."""
    match = _LINE.match(text)
    if match is None or match.group(1) not in names:
        return None
    return match.group(1), (match.group(2) or "").strip()


def title_of(text: str) -> str:
    """A session's title from its first prompt: one line, at most 80 characters."""
    return " ".join(text.split())[:TITLE_LENGTH] or "Untitled"


def notice_record(notice: Notice) -> Message:
    """How a notice is stored: a system message outside the model context, its text the
    one a front end without notices shows; `meta.notice` keeps the rest for a replay."""
    meta: dict[str, Any] = {"severity": notice.severity, "title": notice.headline}
    if notice.compaction is not None:
        meta["compaction"] = notice.compaction
    return Message("system", notice.full_text, meta={"notice": meta}, id=notice.message_id)


def keeping_notices(session: Session, emit: Emit) -> Emit:
    """`emit`, storing each `Notice` first (`notice_record`)."""

    async def sink(event: Event) -> None:
        if isinstance(event, Notice) and not event.stored:  # shown under the id it is stored with
            event = dataclasses.replace(event, message_id=event.message_id or new_message_id())
            await session.add(notice_record(event), in_context=False)
        await emit(event)

    return sink


async def handle(agent: Agent, session: Session, message: Message, emit: Emit) -> TurnResult:
    """Run one user prompt: a command, or a turn. Raises `SessionBusy` while another crow
    process runs a turn in the session; nothing is stored before the session is held."""
    from crow import steering

    # Steering waits from the moment the prompt is taken (a second prompt is busy from
    # then): starting servers, expanding a command or the trust question can take long,
    # and "no turn is running, send it as a prompt" would leave the user no way to say it.
    steering.begin(session)
    try:
        return await _handle(agent, session, message, emit)
    finally:
        steering.end(session, "no turn ran")  # a turn that ran ended it, with its reason


async def _handle(agent: Agent, session: Session, message: Message, emit: Emit) -> TurnResult:
    from crow import command_catalog

    emit = keeping_notices(session, emit)
    await agent.session_ready(session)
    async with session.exclusive():
        typed = command_catalog.typed(message)[0]
        if not typed.startswith("/"):  # no command: the catalog is refreshed beside the turn
            return await _turn(agent, session, message, typed, emit, refresh=command_catalog.stale(session))
        await command_catalog.refresh(agent, session, emit)  # a prompt file added since: offered now
        command = parse_command(typed, BUILTINS)
        if command is not None:
            await session.add(message, in_context=False)  # shown on replay, never sent to the model
            return await BUILTINS[command[0]][1](agent, session, command[1], emit)
        if (prompt := command_catalog.resolve(session, message)) is not None:
            try:
                message = command_catalog.expanded(message, prompt[0], await prompt[0].expand(prompt[1]))
            except Exception as exc:  # CommandError, or a hook's bug: said, and no turn
                return await _refused(session, message, f"/{prompt[0].name}", exc, emit)
        return await _turn(agent, session, message, typed, emit)


async def _turn(
    agent: Agent, session: Session, message: Message, typed: str, emit: Emit, *, refresh: bool = False
) -> TurnResult:
    """The turn of a prompt (its title first). With `refresh`, the session's slash commands
    are gathered again at the same time (a prompt file added since is advertised during the
    turn): off the prompt's round trip, and a failure there is logged, never the turn's. A
    prompt that starts with `/` gathers them before, always (`_handle`)."""
    from crow import command_catalog

    if not session.title:
        await session.save(title=title_of(typed))
        await emit(TitleChanged(session.title))
    if await agent.settle_project(session, emit):
        await emit(ModeChanged(session.mode))  # front ends show the mode (and its options)
    if not refresh:
        return await agent.run_turn(session, message, emit)

    async def gather() -> None:
        try:
            await command_catalog.refresh(agent, session, emit)
        except Exception:
            log.exception("session %s: its slash commands could not be gathered", session.id)

    failure: Exception | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(gather)
        try:
            return await agent.run_turn(session, message, emit)
        except Exception as exc:  # raised as itself below, not in a task group's ExceptionGroup
            failure = exc
    raise failure


async def _refused(session: Session, message: Message, name: str, exc: Exception, emit: Emit) -> TurnResult:
    """A prompt command that could not expand: the line is kept (shown on replay), the
    user told why; no turn runs."""
    from crow.loop import TurnResult

    if not isinstance(exc, CommandError):
        log.error("%s failed to expand", name, exc_info=exc)
    await session.add(message, in_context=False)
    await emit(Notice(f"{name}: {exc}", "error", f"{name} did not run"))
    return TurnResult(stop_reason="end_turn")


async def _compact(agent: Agent, session: Session, instructions: str, emit: Emit) -> TurnResult:
    """`/compact`: the compaction reports itself (`CompactionStarted`/`Finished`); the
    notice after it says the same in words, for front ends that do not show those. A model
    that could not be called (no model, a refused key, a failed summary call) fails the
    prompt as it fails a turn; nothing to compact is no failure."""
    from crow.loop import TurnResult

    try:
        result = await agent.compact(session, instructions or None, emit=emit)
    except CrowError as exc:  # no model (or no key): no compaction began
        await emit(Notice(f"Compaction failed: {exc}", "error", "Compaction failed"))
        return _failed(exc, str(exc))
    if result.compacted:
        title, severity = "Compacted the conversation", "info"
    else:
        title, severity = "Nothing compacted", "warning"
    await emit(Notice(describe_compaction(result), severity, title, result.id))
    if isinstance(result.failure, CrowError):
        return _failed(result.failure, result.error or str(result.failure))
    return TurnResult(stop_reason="end_turn")


def _failed(exc: CrowError, error: str) -> TurnResult:
    """The end of a `/compact` whose model could not be called, as a failed turn's."""
    from crow.loop import TurnResult

    if isinstance(exc, AuthError | MissingKeyError):  # the front end can have the user log in
        raise AuthRequired(exc)
    cause = notices.no_model_cause(error) if isinstance(exc, ConfigError) else notices.cause_of(exc)
    return TurnResult("end_turn", error, cause)


BUILTINS: dict[str, tuple[Command, Builtin]] = {
    "compact": (
        Command("compact", "Summarize older messages to free context", "optional summary instructions"),
        _compact,
    ),
    "undo": (
        Command(
            "undo",
            "Take back the last turn: the conversation and the files it changed",
            "how many turns (default 1)",
        ),
        undo,
    ),
    "usage": (Command("usage", "Tokens, cost and context left in this session", ""), report_commands.usage),
    "mcp": (Command("mcp", "The session's MCP servers, their state and tools", ""), report_commands.mcp),
}
COMMANDS = tuple(command for command, _ in BUILTINS.values())


def describe_compaction(result: CompactResult) -> str:
    if not result.compacted:
        return f"Nothing compacted: {result.error or 'the conversation is already short'}."
    return (
        f"Compacted the conversation: {result.messages_before} → {result.messages_after} "
        f"messages, about {result.tokens_before:,} → {result.tokens_after:,} tokens."
    )
