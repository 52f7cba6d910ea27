"""Taking back turns: `/undo [N]`, `_crow.rewind {sessionId, turns}`, `crow sessions rewind`.

A turn is named by its prompt, the user message `Turn.run` stores marked (`as_prompt`);
steering messages, a hook's `Continue` text and slash-command lines are not turn starts.
Taking back the last N turns (`rewind`):

1. holds the session (`Session.exclusive`) and reads its transcript: the turns still shown
   (`live_turns`; an earlier rewind hides the turns it took back);
2. reads the context just before the oldest of those prompts (`Store.context_at`: the store
   keeps every context a rewrite replaced, so a compaction or a hook's `Replace` since is
   no obstacle), tool calls answered;
3. puts back the files those turns changed (`crow.checkpoints.restore_turns`), first: a
   failure or a crash there leaves the conversation as it was, and a second try takes it
   back (the checkpoints then have nothing more to put back);
4. in one store write, sets that context and appends the marker: the report's stored
   notice, whose meta (`REWIND`) names the prompt rewound to and the command line that
   asked (shown on replay).

The transcript keeps everything; a replay leaves out what a marker took back (`shown`).
A rewind is not cancellable: it is short, and half of one is worse than none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crow.errors import CannotRewind, FilesNotPutBack, SessionError
from crow.events import Notice
from crow.messages import Message, close_dangling_tool_calls

if TYPE_CHECKING:
    from crow.agent import Agent
    from crow.checkpoints import Restored
    from crow.events import Emit
    from crow.loop import TurnResult
    from crow.session import Session

PROMPT = "crow/prompt"  # Message.meta of a turn's prompt
REWIND = "crow/rewind"  # Message.meta of a rewind's marker: {"to": prompt id, "line"?: id}
_QUOTED = 3  # prompts quoted in a report
_EXCERPT = 60  # characters of each


def as_prompt(message: Message) -> Message:
    """`message` marked as a turn's prompt: what a rewind counts and goes back to."""
    return message.replace(meta={**(message.meta or {}), PROMPT: True})


def is_prompt(message: Message) -> bool:
    return message.role == "user" and bool((message.meta or {}).get(PROMPT))


def _marker(message: Message) -> Mapping[str, Any] | None:
    rewind = (message.meta or {}).get(REWIND) if message.role == "system" else None
    return rewind if isinstance(rewind, Mapping) else None


def is_marker(message: Message) -> bool:
    """Whether `message` is a rewind's stored report (history: replayed to every client)."""
    return _marker(message) is not None


def _hidden(transcript: Sequence[Message]) -> list[bool] | None:
    """Per entry, whether a rewind took it back: from the prompt a marker names up to the
    marker, except the command line that asked for it. None when no rewind did."""
    prompts = {m.id: i for i, m in enumerate(transcript) if m.id and is_prompt(m)}
    depth = [0] * (len(transcript) + 1)  # +1 where a hidden range starts, -1 past its end
    found = False
    for i, m in enumerate(transcript):
        rewind = _marker(m)
        start = prompts.get(rewind.get("to")) if rewind is not None else None
        if start is None or start >= i:  # names no earlier prompt (damaged): hides nothing
            continue
        found = True
        depth[start] += 1
        depth[i] -= 1
        line = i - 1
        if line > start and rewind and rewind.get("line") and transcript[line].id == rewind["line"]:
            depth[line] -= 1
            depth[line + 1] += 1
    if not found:
        return None
    hidden, level = [], 0
    for i in range(len(transcript)):
        level += depth[i]
        hidden.append(level > 0)
    return hidden


def shown(transcript: Sequence[Message]) -> Sequence[Message]:
    """`transcript` without what rewinds took back (itself when nothing was)."""
    hidden = _hidden(transcript)
    return transcript if hidden is None else [m for m, h in zip(transcript, hidden, strict=True) if not h]


def live_turns(transcript: Sequence[Message]) -> list[tuple[int, Message]]:
    """(seq, prompt) of every turn not taken back, oldest first."""
    hidden = _hidden(transcript)
    return [(i, m) for i, m in enumerate(transcript) if is_prompt(m) and not (hidden and hidden[i])]


@dataclass(frozen=True, slots=True)
class Rewound:
    """What a rewind did: the prompts of the turns taken back (oldest first), the files put
    back, and the report (stored as the rewind's marker: `Notice.stored`)."""

    prompts: tuple[Message, ...]
    files: Restored
    notice: Notice

    def to_dict(self) -> dict[str, Any]:
        """The `_crow.rewind` answer: each prompt as the user typed it (a slash command's
        line, not its expansion)."""
        from crow.command_catalog import shown_line

        return {
            "turns": len(self.prompts),
            "prompts": [{"messageId": m.id, "text": shown_line(m)} for m in self.prompts],
            "restored": list(self.files.restored),
            "removed": list(self.files.removed),
            "skipped": [{"path": path, "reason": why} for path, why in self.files.skipped],
            "message": self.notice.full_text,
        }


def report(prompts: Sequence[Message], files: Restored) -> Notice:
    """The notice a rewind answers with: the turns taken back, then each file outcome."""
    from crow.command_catalog import shown_line
    from crow.session import new_message_id

    n = len(prompts)
    title = "Undid the last turn" if n == 1 else f"Undid the last {n} turns"
    quoted = ", ".join(f"“{_excerpt(shown_line(m))}”" for m in prompts[-_QUOTED:])  # as typed
    if n > _QUOTED:
        quoted = f"{n - _QUOTED} more, {quoted}"
    lines = [f"{title} ({quoted}): the conversation is back to before {'it' if n == 1 else 'them'}."]
    if files.restored:
        lines.append(f"Files restored: {', '.join(files.restored)}.")
    if files.removed:
        lines.append(f"Files removed (created by {'it' if n == 1 else 'them'}): {', '.join(files.removed)}.")
    if files.skipped:
        lines.append("Not restored: " + "; ".join(f"{path} ({why})" for path, why in files.skipped) + ".")
    if not (files.restored or files.removed or files.skipped):
        lines.append("No file changes were recorded to put back.")
    severity = "warning" if files.skipped else "info"
    return Notice("\n".join(lines), severity, title, message_id=new_message_id(), stored=True)


def _excerpt(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _EXCERPT else line[: _EXCERPT - 1] + "…"


def checked_turns(value: object) -> int:
    """A turn count a client sent: a whole number, at least 1 (ValueError else)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("turns must be a whole number, at least 1")
    return value


def turns_in(text: str) -> int:
    """A turn count a user typed (`/undo 2`, `crow sessions rewind ID 2`); none: 1."""
    text = text.strip()
    if not (text.isascii() and text.isdigit()) and text:
        raise ValueError("turns must be a whole number, at least 1")
    return checked_turns(int(text)) if text else 1


async def rewind(session: Session, turns: int, home: Path, *, asked_by_line: bool = False) -> Rewound:
    """Take back the session's last `turns` turns: their files, then the conversation (see
    the module docstring). `asked_by_line`: the transcript's last entry is the command line
    that asked (kept on replay). Raises `CannotRewind` (nothing changed) when there are
    fewer turns to take back, `SessionBusy` while another crow process runs a turn."""
    import anyio

    from crow.checkpoints import restore_turns
    from crow.prompting import notice_record

    store = session.store
    if store is None:
        raise SessionError(f"session {session.id} is not stored: it has no turns to take back")
    with anyio.CancelScope(shield=True):
        async with session.exclusive():
            transcript = await store.load_transcript(session.id)
            live = live_turns(transcript)
            if turns > len(live):
                raise _cannot(turns, len(live))
            taken = live[-turns:]
            context = close_dangling_tool_calls(await store.context_at(session.id, taken[0][0]))
            files = await restore_turns(session, [m.id for _, m in reversed(taken)], home)
            prompts = tuple(m for _, m in taken)
            notice = report(prompts, files)
            marker = notice_record(notice)
            meta: dict[str, Any] = {"to": prompts[0].id}
            if asked_by_line and transcript and transcript[-1].role == "user":
                meta["line"] = transcript[-1].id
            await session.rewind_context(context, marker.replace(meta={**(marker.meta or {}), REWIND: meta}))
    return Rewound(prompts, files, notice)


def _cannot(asked: int, available: int) -> CannotRewind:
    if available == 0:
        text = "Nothing to undo: this session has no turn to take back."
    else:
        text = f"Cannot take back {asked} turns: this session has {available}; nothing was undone."
    return CannotRewind(text, asked=asked, available=available)


async def undo(agent: Agent, session: Session, rest: str, emit: Emit) -> TurnResult:
    """`/undo [N]`: take back the last turn (or N), conversation and files, and say what
    was restored and what could not be. Fewer turns than asked: a notice, nothing changed."""
    import anyio

    from crow.loop import TurnResult

    try:
        turns = turns_in(rest)
    except ValueError:
        why = f"Nothing undone: /undo takes a number of turns (default 1), not {rest!r}."
        await emit(Notice(why, "warning"))
        return TurnResult("end_turn")
    home = (session.config or agent.config).home
    with anyio.CancelScope(shield=True):  # done or not begun: the user is told which
        try:
            rewound = await rewind(session, turns, home, asked_by_line=True)
        except (CannotRewind, FilesNotPutBack) as exc:  # nothing of the conversation changed
            await emit(Notice(str(exc), "warning"))
            return TurnResult("end_turn")
        await emit(rewound.notice)
    return TurnResult("end_turn")
