"""Notices, compactions and failed turns, as the client said it can take them.

- `Notice`: a `notice` update (severity, title, description) when the client advertised
  `session.notices`, else agent text on a line of its own (what every client understands).
  A notice that repeats a compaction's outcome (`/compact`'s words) is dropped for a
  client that advertised `session.compaction`: it gets the compaction itself.
- `CompactionStarted` / `CompactionFinished`: with `session.compaction`, one
  `compaction_update` `in_progress`, then the summary as a `compaction_summary_chunk` and
  `completed` (or `failed` with the error, or `cancelled`); without it, nothing.
- A replay (`session/load`) shows stored notices as agent text only to a client that would
  have got them so live: notices are live information, not history. A rewind's report is
  history: it replaces the turns it took back, which are not replayed.
- A turn that failed (`TurnResult.error`) answers `session/prompt` with a JSON-RPC error
  once its history is settled; the data names the cause (`crow.notices.cause_of`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, get_args

from acp import RequestError
from acp.schema import TextContentBlock

from crow import rewind
from crow.acp import view as acp_view
from crow.acp.protocol import (
    ClientFeatures,
    CompactionSummaryChunk,
    CompactionUpdate,
    NoticeSeverity,
    NoticeUpdate,
)
from crow.errors import AuthRequired
from crow.events import CompactionFinished, CompactionStarted, Event, Notice
from crow.messages import Message
from crow.notices import failure_text
from crow.session import new_message_id

if TYPE_CHECKING:
    from crow.loop import TurnResult

__all__ = ["REPORTS", "auth_required", "replayable", "turn_failed", "updates"]

REPORTS = (Notice, CompactionStarted, CompactionFinished)  # the events `updates` shows
_SEVERITIES = frozenset(get_args(NoticeSeverity))
TURN_FAILED = -32000  # ACP's generic failure; the message and data say what it was


def updates(event: Event, features: ClientFeatures) -> list[Any]:
    """The session/update payloads for one of `REPORTS`, in order (maybe none)."""
    if isinstance(event, Notice):
        if event.compaction is not None and features.compaction:
            return []
        if features.notices:
            notice = NoticeUpdate(
                session_update="notice",
                # a hook may name a severity ACP has not got: the notice still goes out
                severity=event.severity if event.severity in _SEVERITIES else "info",
                title=event.headline,
                description=event.detail,
            )
            return [notice]
        return [acp_view.notice_update(event.full_text, event.message_id or new_message_id())]
    if not features.compaction:
        return []
    if isinstance(event, CompactionStarted):
        return [
            CompactionUpdate(session_update="compaction_update", compaction_id=event.id, status="in_progress")
        ]
    if not isinstance(event, CompactionFinished):
        return []
    shown: list[Any] = []
    if event.summary:
        block = TextContentBlock(type="text", text=event.summary)
        chunk = CompactionSummaryChunk(
            session_update="compaction_summary_chunk", compaction_id=event.id, content=block
        )
        shown.append(chunk)
    shown.append(
        CompactionUpdate(
            session_update="compaction_update", compaction_id=event.id, status=event.status, error=event.error
        )
    )
    return shown


def replayable(transcript: Sequence[Message], features: ClientFeatures) -> Sequence[Message]:
    """`transcript` without what rewinds took back (`crow.rewind.shown`) and the stored
    notices this client was not (or would not have been) shown as agent text. A rewind's
    report is history, not news: every client is shown it, where the turns it took back were."""
    transcript = rewind.shown(transcript)
    if not (features.notices or features.compaction):
        return transcript

    def shown(m: Message) -> bool:
        notice = (m.meta or {}).get("notice") if m.role == "system" else None
        if not notice or rewind.is_marker(m):
            return True
        if features.notices:
            return False
        return not (isinstance(notice, dict) and notice.get("compaction"))

    return [m for m in transcript if shown(m)]


def turn_failed(result: TurnResult) -> RequestError:
    """The answer to a `session/prompt` whose turn failed (history already stored)."""
    cause = result.cause or "provider"
    error = result.error or "the turn failed"
    return RequestError(TURN_FAILED, failure_text(cause, error), {"cause": cause, "error": error})


def auth_required(exc: AuthRequired) -> RequestError:
    """ACP's auth_required (-32000) for a turn that ended for want of a valid key (history
    already stored): the editor can offer `authenticate`, then prompt again."""
    return RequestError(TURN_FAILED, str(exc), {"cause": "auth", "error": str(exc.cause)})
