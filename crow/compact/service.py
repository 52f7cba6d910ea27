"""The one compaction service: `due` decides, `compact` summarizes.

`CompactService.due(session, window)` is the only "should we compact": the context is over
`compaction.threshold` of the model's window, and the last failed summary is not still
backing off (after a failure, automatic triggers wait until the history has grown by
`max(backoff_messages, backoff_ratio x its length at the failure)`; a history that shrank
since is a new one). The automatic triggers — the summarization hook, any hook through
`HookContext.should_compact()` — ask it; the loop's context-length retry and an explicit
request (`/compact`, `crow.compact`, `crow compact`) compact without asking.

`CompactService.compact(session, provider)` is the one implementation every caller uses.
The new context is

    [first user message, if it was cut]  +  [user: "<summary>…</summary>"]  +  kept tail

written with `session.set_messages` (the store rewrites the context; the transcript stays
whole). A failed or empty summary leaves the session untouched: compaction never raises
into a turn, it reports `compacted=False` with the reason in `error`, and records the
failure in `session.compaction` for `due` to back off from. Each compaction is told to
the caller's sink as `CompactionStarted` then `CompactionFinished` (one fresh id); a
cancel ends it `cancelled` and propagates, the session as it was.

Settings come from the session's config (`compaction:`, a trusted project's crow.yaml
merged over the user's); the service's own are for a session without one.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from crow.compact.cut import cut_point, should_compact
from crow.compact.request import (
    cached_request,
    prefix_share,
    standalone_request,
    summary_message,
    summary_text,
)
from crow.config import CompactionConfig
from crow.errors import ContextLengthError, ProviderError, StoreError
from crow.events import CompactionFinished, CompactionStarted, Emit, Event, UsageUpdated
from crow.llm.base import ModelRequest, Provider, complete
from crow.messages import InvalidMessages, Message, close_dangling_tool_calls, validate
from crow.pricing import add_cost, call_ref

if TYPE_CHECKING:
    from crow.session import Session

__all__ = ["CompactResult", "CompactService"]

log = logging.getLogger("crow.compact")


@dataclass
class CompactResult:
    compacted: bool
    messages_before: int = 0
    messages_after: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    summary: str = ""
    prefix_share: float | None = None
    error: str | None = None
    id: str = ""  # the compaction's (its CompactionStarted/Finished events)
    failure: Exception | None = None  # why the summary call failed (a front end names its cause)

    def to_dict(self) -> dict[str, Any]:
        """The ACP `crow.compact` answer (camelCase)."""
        d: dict[str, Any] = {
            "compacted": self.compacted,
            "messagesBefore": self.messages_before,
            "messagesAfter": self.messages_after,
            "tokensBefore": self.tokens_before,
            "tokensAfter": self.tokens_after,
            "summary": self.summary,
        }
        if self.error is not None:
            d["error"] = self.error
        if self.id:
            d["compactionId"] = self.id
        return d


class CompactService:
    """Decides when a session's context is summarized and summarizes it. One compaction
    per session at a time (`session.compaction.lock`); never raises into the turn."""

    def __init__(self, settings: CompactionConfig | None = None) -> None:
        self.settings = settings if settings is not None else CompactionConfig()

    def settings_for(self, session: Session) -> CompactionConfig:
        return session.config.compaction if session.config is not None else self.settings

    def due(self, session: Session, window: int) -> bool:
        """True when an automatic trigger should compact `session` for a model with a
        `window`-token context: over the threshold, and not backing off a failure."""
        settings = self.settings_for(session)
        failed_at, length = session.compaction.failed_at, len(session.messages)
        if failed_at is not None and failed_at <= length:
            wait = max(settings.backoff_messages, int(failed_at * settings.backoff_ratio))
            if length < failed_at + wait:
                return False
        if not should_compact(session.context_tokens(), window, settings.threshold):
            return False
        return _old_part(session.messages, settings)[0] > 0  # else it would only fail, each turn

    async def compact(
        self,
        session: Session,
        provider: Provider | None,
        *,
        instructions: str | None = None,
        emit: Emit | None = None,
    ) -> CompactResult:
        """Compact now. Told through `emit` as it goes: `CompactionStarted`, then one
        `CompactionFinished` (completed, failed, or cancelled: a cancel before the new
        context is stored leaves the session exactly as it was)."""
        report = emit if emit is not None else _unreported
        compaction = uuid.uuid4().hex
        try:
            await report(CompactionStarted(compaction))
            async with session.compaction.lock:
                result = await self._compact(session, provider, instructions)
        except anyio.get_cancelled_exc_class():
            with anyio.move_on_after(REPORT_GRACE, shield=True):
                await report(CompactionFinished(compaction, "cancelled"))
            raise
        result.id = compaction
        with anyio.move_on_after(REPORT_GRACE, shield=True):  # it happened, even if a cancel came
            status = "completed" if result.compacted else "failed"
            await report(CompactionFinished(compaction, status, result.summary, result.error))
        if result.compacted and emit is not None and provider is not None:
            await emit(UsageUpdated(result.tokens_after, provider.context_window, session.cost))
        return result

    async def _compact(
        self, session: Session, provider: Provider | None, instructions: str | None
    ) -> CompactResult:
        messages, tokens = list(session.messages), session.context_tokens()
        before = CompactResult(False, len(messages), len(messages), tokens, tokens)
        if provider is None:
            return dataclasses.replace(before, error="no model is configured to write the summary")
        settings = self.settings_for(session)
        cut, first = _old_part(messages, settings)
        if cut == 0:
            return dataclasses.replace(
                before, error=f"nothing to compact: {len(messages)} messages, all in the kept recent part"
            )
        tail = messages[cut:]

        summary, share, failure = await self._summarize(
            session, provider, settings, messages, cut, instructions
        )
        if failure is not None:
            error = _describe(failure)
            log.warning("compaction of session %s failed: %s; context unchanged", session.id, error)
            session.compaction.failed_at = len(messages)  # automatic triggers back off (`due`)
            return dataclasses.replace(before, prefix_share=share, error=error, failure=failure)
        session.compaction.failed_at = None

        new = [
            *([messages[first]] if first is not None else []),
            summary_message(summary),
            *tail,
        ]
        try:
            validate(close_dangling_tool_calls(new))  # the tail may end in calls still running
        except InvalidMessages as exc:
            log.error("compaction of session %s built an invalid context: %s; unchanged", session.id, exc)
            return dataclasses.replace(before, prefix_share=share, error=f"invalid compacted context: {exc}")
        try:
            with anyio.CancelScope(shield=True):  # a cancel now would leave memory ahead of the store
                await session.set_messages(new)
        except StoreError as exc:  # the session is left as it was (`set_messages`)
            log.warning("compaction of session %s not stored: %s; context unchanged", session.id, exc)
            session.compaction.failed_at = len(messages)  # the summary call is not repeated at once
            return dataclasses.replace(
                before, prefix_share=share, error=f"the compacted context was not stored: {exc}"
            )
        tokens_after = session.context_tokens()
        log.info(
            "compacted session %s: %d -> %d messages, ~%d -> ~%d tokens (prefix share %s)",
            session.id,
            len(messages),
            len(new),
            before.tokens_before,
            tokens_after,
            "n/a" if share is None else f"{share:.3f}",
        )
        return CompactResult(
            compacted=True,
            messages_before=len(messages),
            messages_after=len(new),
            tokens_before=before.tokens_before,
            tokens_after=tokens_after,
            summary=summary,
            prefix_share=share,
        )

    # ------------------------------------------------------------ the summary call
    async def _summarize(
        self,
        session: Session,
        provider: Provider,
        settings: CompactionConfig,
        messages: list[Message],
        cut: int,
        instructions: str | None,
    ) -> tuple[str, float | None, Exception | None]:
        """(summary, prefix_share, what made the summary call fail)."""
        previous = session.last_request
        if settings.cache_preserving and previous is not None:
            kept = len(messages) - cut
            request = cached_request(previous, messages, kept, settings.summary_words, instructions)
            share = prefix_share(request, previous)
            try:
                return await _call(session, provider, request), share, None
            except ContextLengthError as exc:
                log.info("cache-preserving summary request is over the window (%s); retrying standalone", exc)
            except Exception as exc:
                return "", share, exc
        request = standalone_request(
            messages[:cut],
            model=provider.model,
            context_window=provider.context_window,
            words=settings.summary_words,
            max_arg_chars=settings.max_tool_arg_chars,
            extra=instructions,
        )
        share = prefix_share(request, previous)
        try:
            return await _call(session, provider, request), share, None
        except Exception as exc:
            return "", share, exc


REPORT_GRACE = 5.0  # seconds a cancelled compaction has to say so


def _old_part(messages: Sequence[Message], settings: CompactionConfig) -> tuple[int, int | None]:
    """Where the kept recent tail starts (0: nothing to compact), and the first user
    message, kept verbatim before the summary (None when it is in the tail or absent)."""
    cut = cut_point(messages, settings.keep_ratio, settings.min_keep)
    first = next((i for i, m in enumerate(messages) if m.role == "user"), None)
    kept = first if first is not None and first < cut else None
    if cut == 0 or (kept is not None and cut == 1):
        return 0, None
    return cut, kept


async def _unreported(event: Event) -> None:
    return None


async def _call(session: Session, provider: Provider, request: ModelRequest) -> str:
    response = await complete(provider, request)
    await add_cost(session, call_ref(provider, request), response.usage)
    text = summary_text(response.message.content)
    if not text:
        raise _EmptySummary("the model returned an empty summary")
    return text


class _EmptySummary(Exception):
    pass


def _describe(exc: Exception) -> str:
    if isinstance(exc, _EmptySummary):
        return str(exc)
    if not isinstance(exc, ProviderError):  # not a model failure: a bug worth a traceback
        log.error("summary request raised unexpectedly", exc_info=exc)
    return f"summary request failed: {type(exc).__name__}: {exc}"
