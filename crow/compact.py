"""Compaction: replace the old part of a session's context with a model-written summary.

The decision and the cut are pure functions, tested without a model:

    should_compact(context_tokens, context_window, threshold)  -> bool
    cut_point(messages, keep_ratio, min_keep)                   -> where the kept tail starts

`cut_point` keeps the recent 10% of messages (at least 2) and never separates an assistant
message with tool calls from its results: the cut moves earlier until it lands on a
message that is not a tool result.

`CompactService.compact(session, provider)` is the one implementation every caller uses
(the summarization hook, the loop's `Compact` action and its context-length retry, the ACP
`crow.compact` method). The new context is

    [first user message, if it was cut]  +  [user: "<summary>…</summary>"]  +  kept tail

written with `session.set_messages` (the store rewrites the context; the transcript stays
whole). A failed or empty summary leaves the session untouched: compaction never raises
into a turn, it reports `compacted=False` with the reason in `error`.

Cache-preserving requests (the default): the summary request repeats the previous model
request (`session.last_request`) exactly — same system message, tools, model and options,
the same messages — and only appends one user message with the instruction, with
`tool_choice="none"`. A provider's prompt cache then covers nearly all of it.
`prefix_share` measures that: serialize the request as a list of items (the tool list,
then each message, as JSON), walk both requests while the items are equal, and divide the
characters of the shared items by the characters of the whole summary request. Without a
previous request (or with `cache_preserving=False`, or when the history no longer fits
the window) the request is standalone: a summarizer system prompt and the old messages
rendered as text, old write_file/edit_file arguments cut to 2,000 characters, no tools.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from crow.errors import ContextLengthError, ProviderError
from crow.events import Emit, UsageUpdated
from crow.llm.base import ModelRequest, Provider, complete
from crow.messages import (
    InvalidMessages,
    Message,
    close_dangling_tool_calls,
    human,
    system,
    validate,
)

if TYPE_CHECKING:
    from crow.session import Session

__all__ = [
    "CompactResult",
    "CompactService",
    "cut_point",
    "prefix_share",
    "should_compact",
    "summary_message",
]

log = logging.getLogger("crow.compact")

# Tools whose (often huge) arguments are cut in the summarized part of the history.
FILE_WRITE_TOOLS = frozenset({"write_file", "edit_file"})
_LOCK_KEY = "crow.compact.lock"

SUMMARY_INTRO = (
    "This conversation was compacted to fit the context window. The summary below "
    "replaces the earlier messages; the most recent messages follow it unchanged."
)

SUMMARIZER_SYSTEM = (
    "You summarize conversations between a user and a coding agent so that the agent can "
    "continue the work with only your summary and the most recent messages."
)


def _instruction(words: int, kept: int, extra: str | None) -> str:
    tail = (
        f" The last {kept} messages will stay in the context verbatim after your summary, "
        "so concentrate on what came before them."
        if kept
        else ""
    )
    text = (
        "Stop working on the task for a moment: the conversation is about to be compacted. "
        "Do not call any tools. Write a summary of the conversation so far, under "
        f"{words} words, that lets you continue the work without the earlier messages."
        f"{tail} Preserve:\n"
        "1. The user's goals, requests and constraints, in their own words where it matters.\n"
        "2. Decisions made and why.\n"
        "3. Files read, written or edited, with the key details (paths, functions, what "
        "changed).\n"
        "4. Errors met and how they were fixed.\n"
        "5. The current state of the work and the next steps.\n"
        "6. Any todo items and their status.\n"
        "Answer with the summary only, as plain text or Markdown."
    )
    if extra and extra.strip():
        text += f"\n\nAdditional instructions from the user:\n{extra.strip()}"
    return text


# ---------------------------------------------------------------- pure functions
FAILED_AT = "crow.compact.failed_at"  # session.state: history length at the last failed attempt


def should_compact(context_tokens: int, context_window: int, threshold: float = 0.85) -> bool:
    """True when the context occupies more than `threshold` of the window."""
    if context_window <= 0:
        return False
    return context_tokens > threshold * context_window


def cut_point(messages: Sequence[Message], keep_ratio: float = 0.10, min_keep: int = 2) -> int:
    """Index where the kept recent tail starts; 0 means there is nothing to compact.

    Keeps `max(min_keep, ceil(len * keep_ratio))` messages, then moves the cut earlier
    while it would land on a tool result, so an assistant message with tool calls always
    stays with its results (they follow it directly in a valid history).
    """
    n = len(messages)
    keep = max(min_keep, math.ceil(n * keep_ratio), 1)
    cut = n - keep
    while cut > 0 and messages[cut].role == "tool":
        cut -= 1
    return max(cut, 0)


def summary_message(summary: str) -> Message:
    """The user message that stands in for the summarized part of the history."""
    return Message("user", f"{SUMMARY_INTRO}\n\n<summary>\n{summary}\n</summary>", meta={"crow": "summary"})


def _item(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, sort_keys=True, default=str)


def _message_item(m: Message) -> str:
    d = m.to_dict()
    d.pop("meta", None)  # never sent to the model
    return _item(d)


def _request_items(request: ModelRequest) -> list[str]:
    tools = _item([dataclasses.asdict(t) for t in request.tools])
    return [tools, *(_message_item(m) for m in request.messages)]


def prefix_share(request: ModelRequest, previous: ModelRequest | None) -> float | None:
    """Share of `request` (serialized JSON characters, tools then messages) that repeats
    `previous` exactly from the start; None without a previous request."""
    if previous is None:
        return None
    mine, theirs = _request_items(request), _request_items(previous)
    total = sum(map(len, mine))
    shared = 0
    for a, b in zip(mine, theirs, strict=False):
        if a != b:
            break
        shared += len(a)
    return shared / total if total else 0.0


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... {len(text) - limit} more characters cut by compaction]"


def _head_tail(text: str, limit: int) -> str:
    if len(text) <= 2 * limit:
        return text
    return f"{text[:limit]}\n[... {len(text) - 2 * limit} characters cut ...]\n{text[-limit:]}"


def render(
    messages: Sequence[Message], max_arg_chars: int = 2000, max_output_chars: int | None = None
) -> str:
    """The messages as plain text for a standalone summary request. String arguments of
    write_file/edit_file calls are cut to `max_arg_chars` with a marker; tool outputs are
    cut to head and tail when `max_output_chars` is given."""
    labels = {"system": "System", "user": "User", "assistant": "Assistant"}
    parts = []
    for m in messages:
        if m.role == "tool":
            head = f"[Tool result: {m.name}{' (error)' if m.is_error else ''}]"
            body = m.content if max_output_chars is None else _head_tail(m.content, max_output_chars)
            parts.append(f"{head}\n{body}")
            continue
        lines = [f"[{labels.get(m.role, m.role)}]"]
        if m.content:
            lines.append(m.content)
        for call in m.tool_calls:
            args = dict(call.args)
            if call.name in FILE_WRITE_TOOLS:
                args = {k: _cut(v, max_arg_chars) if isinstance(v, str) else v for k, v in args.items()}
            lines.append(f"→ {call.name}({json.dumps(args, ensure_ascii=False)})")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def _closed_prefix(messages: Sequence[Message]) -> list[Message]:
    """`messages` without a trailing assistant message whose tool calls have no results
    yet (compaction requested right after the model asked for tools)."""
    items = list(messages)
    for i in range(len(items) - 1, -1, -1):
        m = items[i]
        if m.role == "assistant" and m.tool_calls:
            answered = {r.tool_call_id for r in items[i + 1 :] if r.role == "tool"}
            if not {c.id for c in m.tool_calls} <= answered:
                return items[:i]
            break
        if m.role != "tool":
            break
    return items


# ---------------------------------------------------------------- the service
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
        return d


class CompactService:
    """Summarizes the old part of a session's context. One compaction per session at a
    time (a lock kept in `session.state`); never raises into the turn."""

    def __init__(
        self,
        keep_ratio: float = 0.10,
        min_keep: int = 2,
        summary_words: int = 2000,
        max_tool_arg_chars: int = 2000,
        cache_preserving: bool = True,
    ) -> None:
        self.keep_ratio = keep_ratio
        self.min_keep = min_keep
        self.summary_words = summary_words
        self.max_tool_arg_chars = max_tool_arg_chars
        self.cache_preserving = cache_preserving

    async def compact(
        self,
        session: Session,
        provider: Provider | None,
        *,
        instructions: str | None = None,
        emit: Emit | None = None,
    ) -> CompactResult:
        lock = session.state.get(_LOCK_KEY)
        if lock is None:
            lock = session.state[_LOCK_KEY] = anyio.Lock()
        async with lock:
            result = await self._compact(session, provider, instructions)
        if result.compacted and emit is not None and provider is not None:
            await emit(UsageUpdated(result.tokens_after, provider.context_window))
        return result

    async def _compact(
        self, session: Session, provider: Provider | None, instructions: str | None
    ) -> CompactResult:
        messages, tokens = list(session.messages), session.context_tokens()
        before = CompactResult(False, len(messages), len(messages), tokens, tokens)
        if provider is None:
            return dataclasses.replace(before, error="no model is configured to write the summary")
        cut = cut_point(messages, self.keep_ratio, self.min_keep)
        first = next((i for i, m in enumerate(messages) if m.role == "user"), None)
        keep_first = first is not None and first < cut
        if cut == 0 or (keep_first and cut == 1):
            return dataclasses.replace(
                before, error=f"nothing to compact: {len(messages)} messages, all in the kept recent part"
            )
        tail = messages[cut:]

        summary, share, error = await self._summarize(session, provider, messages, cut, instructions)
        if error is not None:
            log.warning("compaction of session %s failed: %s; context unchanged", session.id, error)
            session.state[FAILED_AT] = len(messages)  # automatic triggers back off (HookContext)
            return dataclasses.replace(before, prefix_share=share, error=error)
        session.state.pop(FAILED_AT, None)

        new = [
            *([messages[first]] if keep_first and first is not None else []),
            summary_message(summary),
            *tail,
        ]
        try:
            validate(close_dangling_tool_calls(new))  # the tail may end in calls still running
        except InvalidMessages as exc:
            log.error("compaction of session %s built an invalid context: %s; unchanged", session.id, exc)
            return dataclasses.replace(before, prefix_share=share, error=f"invalid compacted context: {exc}")
        await session.set_messages(new)
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
        messages: list[Message],
        cut: int,
        instructions: str | None,
    ) -> tuple[str, float | None, str | None]:
        """(summary, prefix_share, error)."""
        previous = session.last_request
        kept = len(messages) - cut
        if self.cache_preserving and previous is not None:
            request = self.cached_request(previous, messages, kept, instructions)
            share = prefix_share(request, previous)
            try:
                return await self._call(provider, request), share, None
            except ContextLengthError as exc:
                log.info("cache-preserving summary request is over the window (%s); retrying standalone", exc)
            except Exception as exc:
                return "", share, _describe(exc)
        request = self.standalone_request(provider, messages[:cut], instructions)
        share = prefix_share(request, previous)
        try:
            return await self._call(provider, request), share, None
        except Exception as exc:
            return "", share, _describe(exc)

    def cached_request(
        self, previous: ModelRequest, messages: Sequence[Message], kept: int, instructions: str | None
    ) -> ModelRequest:
        """The previous request again — its system message(s), tools, model and options —
        with the session's current messages and one user message asking for the summary."""
        head = []
        for m in previous.messages:
            if m.role != "system":
                break
            head.append(m)
        body = _closed_prefix(messages)
        visible = kept - (len(messages) - len(body))  # the open call is not in the request
        ask = human(_instruction(self.summary_words, max(visible, 0), instructions))
        return previous.replace(messages=[*head, *body, ask], tool_choice="none")

    def standalone_request(
        self, provider: Provider, old: Sequence[Message], instructions: str | None
    ) -> ModelRequest:
        """A request of its own: the old messages as text, cut to fit the window."""
        budget = max(4000, int(provider.context_window * 4 * 0.6))  # chars; room for the answer
        text = render(old, self.max_tool_arg_chars)
        if len(text) > budget:
            text = render(old, self.max_tool_arg_chars, max_output_chars=self.max_tool_arg_chars // 2)
        if len(text) > budget:
            text = "[... the oldest part of the conversation was cut ...]\n" + text[-budget:]
        ask = _instruction(self.summary_words, 0, instructions)
        prompt = f"<conversation>\n{text}\n</conversation>\n\n{ask}"
        return ModelRequest(messages=[system(SUMMARIZER_SYSTEM), human(prompt)], model=provider.model)

    async def _call(self, provider: Provider, request: ModelRequest) -> str:
        response = await complete(provider, request)
        text = response.message.content.strip()
        if text.startswith("<summary>") and text.endswith("</summary>"):
            text = text[len("<summary>") : -len("</summary>")].strip()
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
