"""A session's live state: the model context, todos, files, and where it is persisted."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from crow import images
from crow.errors import StoreError
from crow.llm.base import ModelRequest, Usage
from crow.messages import Message, Messages, close_dangling_tool_calls, valid_value, without_stray_results
from crow.pricing import known_cost

if TYPE_CHECKING:
    from crow.config import Config
    from crow.editor import EditorClient
    from crow.store import Store
    from crow.tools import ToolHub


def new_message_id() -> str:
    """A message's id (ACP `messageId`): unique, and given before the message is complete,
    so a streamed answer's chunks carry the id its stored message will have."""
    return str(uuid.uuid4())


@dataclass(eq=False)
class CompactionState:
    """What compaction keeps per session (crow/compact/): one compaction at a time, and
    the history length at the last failed summary, from which automatic triggers back off."""

    failed_at: int | None = None
    _lock: anyio.Lock | None = field(default=None, repr=False)

    @property
    def lock(self) -> anyio.Lock:
        # Made at first use: the first anyio primitive imports its backend (~20 ms), which
        # session/new must not wait for.
        if self._lock is None:
            self._lock = anyio.Lock()
        return self._lock


_RELOADED = frozenset({"todos", "files", "title", "cost"})  # what `Session._reload` reads back


@dataclass(eq=False)
class Session:
    id: str
    cwd: Path
    messages: Messages = field(default_factory=Messages)  # model context, no system prompt
    todos: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # path -> "written" | "edited"
    state: dict[str, Any] = field(default_factory=dict)  # scratch space for hooks
    mode: str = "ask"
    model: str = ""
    title: str = ""
    cost: float | None = 0.0  # USD so far; None once a call's price was unknown (crow.pricing)
    thought_level: str = ""  # chosen for models that take one; "" = the model's default
    store: Store | None = None
    tools: ToolHub | None = None
    # Provider-reported usage of the last model call and the history length it covered:
    # the context estimate is that plus chars/4 of what came after.
    last_usage: Usage | None = None
    usage_covers: int = 0
    # The last request sent to the model: cache-preserving compaction repeats its prefix.
    last_request: ModelRequest | None = None
    compaction: CompactionState = field(default_factory=CompactionState)
    # What a hook may ask of the front end (questions, and the editor's files and terminals
    # when its `can_*` flags say so); None when nothing is attached to ask.
    client: EditorClient | None = None
    # The configuration in force for this session: the user's, with a trusted project's
    # crow.yaml (found from `cwd`) merged over it. Hooks read their settings here.
    config: Config | None = None
    holds: int = 0  # nesting depth of `exclusive()` in this process
    # More workspace roots (ACP `additionalDirectories`): absolute folders the file tools and
    # the sandbox cover too; `cwd` stays where relative paths start. Stored with the session.
    additional_directories: list[str] = field(default_factory=list)
    # A subagent's (`Agent.create_child`): the session whose turn runs it. `parent` is the
    # live parent while that turn runs (None for a child loaded later); `parent_id` is stored.
    parent_id: str | None = None
    parent: Session | None = field(default=None, repr=False)
    # A write failed: the store may hold it all the same (a server that did it and whose
    # answer was lost), so the next turn reads the session back (`exclusive`).
    unsure: bool = field(default=False, repr=False)
    unsaved: set[str] = field(default_factory=set, repr=False)  # fields of the saves that failed

    @property
    def root(self) -> Session:
        """The session at the top of the subagent tree (itself for an ordinary session):
        whose permission rules and questions a child shares."""
        session = self
        while session.parent is not None:
            session = session.parent
        return session

    @property
    def depth(self) -> int:
        """How many live parents this session has (0: not a subagent)."""
        depth, session = 0, self.parent
        while session is not None:
            depth, session = depth + 1, session.parent
        return depth

    @property
    def roots(self) -> list[Path]:
        """Every root of the session's workspace, `cwd` first."""
        return [self.cwd, *map(Path, self.additional_directories)]

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Run a turn (or a compaction) as this session's only writer across crow processes.
        Raises `SessionBusy` while another live crow process holds it. When another process
        wrote since this one last read the session, its context and todos are reloaded first.
        Nested uses in one process share the outer lock."""
        lock = getattr(self.store, "lock_session", None)  # a store without locks runs unlocked
        if self.holds or lock is None:
            self.holds += 1
            try:
                yield
            finally:
                self.holds -= 1
            return
        stale = await lock(self.id)
        self.holds = 1
        try:
            if stale or self.unsure:
                await self._reload()
            yield
        finally:
            self.holds = 0
            with anyio.CancelScope(shield=True), suppress(StoreError):
                await self.store.unlock_session(self.id)  # type: ignore[union-attr]

    async def _reload(self) -> None:
        assert self.store is not None
        self.unsure = False  # a write failing from here on is read back next time too
        unsaved, self.unsaved = self.unsaved, set()  # likewise a save failing from here on
        try:
            # What a reload does not read (the mode, model, ... this process keeps) is put
            # back as memory and the editor have it, in case the failed save was done.
            if kept := {k: getattr(self, k) for k in unsaved if k not in _RELOADED}:
                await self.store.update_session(self.id, **kept)
            record = await self.store.get_session(self.id)
            stored = await self.store.load_context(self.id)
        except BaseException:
            self.unsure = True
            self.unsaved |= unsaved
            raise
        if record is not None:
            self.todos, self.files, self.title = list(record.todos), dict(record.files), record.title
            self.cost = known_cost(record.cost)
        self.messages = Messages(stored)
        self.last_usage, self.usage_covers, self.last_request = None, 0, None
        self.state.pop("crow.tool_ids", None)
        self.state.pop("crow.message_ids", None)
        await self.repair()

    async def repair(self) -> list[Message]:
        """Make a stored context sendable again, durably: drop images no provider accepts
        (stored before prompts were checked: a note says so) and results stored twice (a
        write whose answer was lost), and answer tool calls left without a result (a crash
        mid-turn). Returns the answers appended at the end."""
        current = list(self.messages)
        if (kept := without_stray_results(images.without_invalid(current))) is not current:
            await self.set_messages(kept)  # the context only: the transcript stays as shown
            current = list(kept)
        repaired = close_dangling_tool_calls(current)
        if len(repaired) == len(current):
            return []
        if repaired[: len(current)] == current:
            await self.add(*repaired[len(current) :])
            return repaired[len(current) :]
        await self.set_messages(repaired)
        return []

    @staticmethod
    def needs_repair(messages: Sequence[Message]) -> bool:
        listed = list(messages)
        return (
            images.without_invalid(messages) is not messages
            or without_stray_results(listed) is not listed
            or len(close_dangling_tool_calls(listed)) != len(listed)
        )

    def unique_tool_ids(self, message: Message) -> Message:
        """Give tool calls whose id the session already used (local servers reuse `call_0`)
        a fresh one: editors key tool calls by id, and Anthropic rejects duplicates."""
        seen: set[str] | None = self.state.get("crow.tool_ids")
        if seen is None:
            seen = {c.id for m in self.messages for c in m.tool_calls}
            self.state["crow.tool_ids"] = seen
        calls = []
        for call in message.tool_calls:
            if not call.id or call.id in seen:
                call = call.replace(id=f"call_{uuid.uuid4().hex[:24]}")
            seen.add(call.id)
            calls.append(call)
        return message.replace(tool_calls=tuple(calls)) if calls != list(message.tool_calls) else message

    def _unique_id(self, message: Message) -> Message:
        seen: set[str] | None = self.state.get("crow.message_ids")
        if seen is None:
            seen = self.state["crow.message_ids"] = {m.id for m in self.messages if m.id}
        if not message.id or message.id in seen:
            message = message.replace(id=new_message_id())
        seen.add(message.id)
        return message

    def context_tokens(self) -> int:
        if self.last_usage is None or self.usage_covers > len(self.messages):
            return self.messages.estimate_tokens()
        tail = Messages(self.messages[self.usage_covers :])
        return self.last_usage.context_tokens + tail.estimate_tokens()

    async def add(self, *messages: Message, in_context: bool = True) -> None:
        """Append and persist at once: every message is durable when it is produced. Text is
        made valid Unicode first (`Message.valid`): a lone surrogate from a model, a tool or
        a hook must not make every later store write and model request fail. A message
        gets a new id (`new_message_id`) unless it has one the session has not used (a
        hook may add an earlier message again)."""
        messages = tuple(self._unique_id(m).valid() for m in messages)
        if in_context:
            self.messages.extend(messages)
        if self.store is None:
            return
        try:
            await self.store.append(self.id, list(messages), in_context=in_context)
        except StoreError:
            # Not stored (the append is one transaction): memory must not hold it either,
            # or a failed turn's clean-up stores answers to calls the store never had.
            # A cancel keeps them: a queued append still runs. (By identity: another
            # call's add may have appended since.) Unless the answer was lost: `unsure`.
            self.unsure = True
            if in_context:
                failed = {id(m) for m in messages}
                self.messages[:] = [m for m in self.messages if id(m) not in failed]
            raise

    async def set_messages(self, messages: Sequence[Message]) -> None:
        """Rewrite the model context (compaction, replace); the transcript is untouched.
        A rewrite the store refuses (StoreError) leaves memory as it was too."""
        before = (self.messages, self.last_usage, self.usage_covers)
        self.messages = Messages(m.valid() for m in messages)
        self.last_usage, self.usage_covers = None, 0
        if self.store is None:
            return
        try:
            await self.store.set_context(self.id, list(self.messages))
        except StoreError:
            self.messages, self.last_usage, self.usage_covers = before
            self.unsure = True
            raise

    async def rewind_context(self, messages: Sequence[Message], marker: Message) -> None:
        """Take the model context back to `messages` (`crow.rewind`), storing `marker` in the
        transcript with it in one write; a write the store refuses leaves memory as it was.
        What the last request and usage said (and a failed summary's back-off) described
        turns now gone, so they are forgotten."""
        before = (self.messages, self.last_usage, self.usage_covers, self.last_request)
        self.messages = Messages(m.valid() for m in messages)
        self.last_usage, self.usage_covers, self.last_request = None, 0, None
        self.compaction.failed_at = None
        if self.store is None:
            return
        try:
            await self.store.rewind_context(self.id, list(self.messages), marker.valid())
        except StoreError:
            self.messages, self.last_usage, self.usage_covers, self.last_request = before
            self.unsure = True
            raise

    async def save(self, **fields: Any) -> None:
        """Persist metadata fields (todos, files, title, mode, model, cost, thought_level)."""
        fields = {key: valid_value(value) for key, value in fields.items()}
        before = {key: getattr(self, key) for key in fields}
        for key, value in fields.items():
            setattr(self, key, value)
        if self.store is None:
            return
        try:
            await self.store.update_session(self.id, **fields)
        except StoreError:  # refused (a database away, a lock taken over): not in force here either
            for key, value in before.items():
                if getattr(self, key) is fields[key]:  # unless another save set it since
                    setattr(self, key, value)
            self.unsure = True
            self.unsaved.update(fields)
            raise
