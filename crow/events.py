"""What the loop emits while a turn runs.

The loop never imports ACP: it hands these to a sink (`Emit`). The ACP adapter turns them
into `session/update` notifications, `crow run` prints them, tests collect them. The sink
is awaited, so a slow client slows the loop instead of growing a buffer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from crow.llm.base import TextDelta, ThoughtDelta, ToolSpec
from crow.messages import Message, ToolCall, ToolResult

if TYPE_CHECKING:
    from crow.prompting import Command

__all__ = [
    "CommandsChanged",
    "CompactionFinished",
    "CompactionStarted",
    "Emit",
    "Event",
    "ModeChanged",
    "Notice",
    "PlanUpdated",
    "SubagentEvent",
    "SubagentFinished",
    "SubagentStarted",
    "TextDelta",
    "ThoughtDelta",
    "TitleChanged",
    "ToolCallEnd",
    "ToolCallRunning",
    "ToolCallStart",
    "UsageUpdated",
    "UserMessageAdded",
]


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """The model asked for a tool; it has not run yet (status pending). `spec` is the tool
    as its server declared it (kind, title), None for a tool crow does not know."""

    call: ToolCall
    spec: ToolSpec | None = None


@dataclass(frozen=True, slots=True)
class ToolCallRunning:
    call: ToolCall


@dataclass(frozen=True, slots=True)
class ToolCallEnd:
    """A call's final status: every ToolCallStart gets one, also when the turn is cancelled
    or fails (then `result` is an error saying so)."""

    call: ToolCall
    result: ToolResult


@dataclass(frozen=True, slots=True)
class PlanUpdated:
    todos: Sequence[Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class UsageUpdated:
    used: int  # tokens the context occupies now
    size: int  # the model's context window
    cost: float | None = None  # the session's USD total so far, when known (crow.pricing)


Severity = Literal["info", "warning", "error"]


@dataclass(frozen=True, slots=True)
class Notice:
    """Something crow or a hook tells the user while a turn runs: live information, never
    model context. A front end that can show notices apart shows `title` (default: the
    text's first line) with `text`; the others show `full_text` in the transcript. Each is
    also stored as a system message outside the context (`crow.prompting`), for a replay
    to a front end of the second kind. `compaction` names the compaction this one reports
    (`/compact`'s answer): a front end that shows `CompactionFinished` drops it."""

    text: str
    severity: Severity = "info"
    title: str = ""
    compaction: str | None = None
    message_id: str = ""  # the stored notice's `Message.id` (crow.prompting keeps notices)
    stored: bool = False  # stored already by who tells it (a rewind's report, with its context)

    @property
    def headline(self) -> str:
        """The title, or the text's first line (at most 80 characters)."""
        line = self.title or next((ln for ln in self.text.splitlines() if ln.strip()), "")
        return line.strip()[:80] or "Notice"

    @property
    def full_text(self) -> str:
        """The notice as one text: the title first when the text does not start with it."""
        if self.title and not self.text.startswith(self.title):
            return f"{self.title}: {self.text}" if self.text else self.title
        return self.text

    @property
    def detail(self) -> str | None:
        """What the text adds to `headline` (None when nothing)."""
        rest = self.text.strip()
        head = self.headline
        if rest.startswith(head):
            rest = rest[len(head) :].lstrip(" :.\n")
        return rest or None


CompactionStatus = Literal["completed", "failed", "cancelled"]


@dataclass(frozen=True, slots=True)
class CompactionStarted:
    """A compaction of the session's context began (automatic, requested or after the model
    refused an over-long context); `id` is fresh for each one."""

    id: str


@dataclass(frozen=True, slots=True)
class CompactionFinished:
    """How compaction `id` ended: completed (with the model's `summary`), failed (`error`
    says why; the context is unchanged) or cancelled (the context is unchanged)."""

    id: str
    status: CompactionStatus
    summary: str = ""
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ModeChanged:
    """The session's mode changed during a turn (already saved); the front end shows it."""

    mode: str


@dataclass(frozen=True, slots=True)
class TitleChanged:
    """The session was named (already saved; from its first prompt); the front end shows it."""

    title: str


@dataclass(frozen=True, slots=True)
class UserMessageAdded:
    """A user message joined the running turn (steering), as stored: front ends echo it."""

    message: Message


@dataclass(frozen=True, slots=True)
class CommandsChanged:
    """The session's slash commands are now these (builtins first; `crow.command_catalog`):
    a prompt file came or went, an MCP server's prompts changed. ACP front ends send
    `available_commands_update`; `crow run` ignores it."""

    commands: tuple[Command, ...]


@dataclass(frozen=True, slots=True)
class SubagentStarted:
    """A child session (a subagent: crow's `task` tool) starts inside the parent's turn, run
    by the parent's tool call `parent_call_id`. Sent before any of its `SubagentEvent`s.
    `name` is its agent definition's; `description` the task's short title; `cwd` and
    `additional_directories` where it works; `prompt` what it is asked (its first user
    message, under the id it is stored with)."""

    parent_call_id: str
    session_id: str
    name: str
    description: str
    cwd: str
    additional_directories: tuple[str, ...] = ()
    prompt: Message | None = None


@dataclass(frozen=True, slots=True)
class SubagentEvent:
    """An event of child session `session_id`'s turn, as its own loop emitted it (its tool
    call ids are its own: a front end showing them among the parent's makes them unique
    with `child_call_id`)."""

    parent_call_id: str
    session_id: str
    event: Event


@dataclass(frozen=True, slots=True)
class SubagentFinished:
    """Child session `session_id` ended: sent after its last `SubagentEvent`, before the
    parent's call ends. `stop_reason` is its turn's (ACP stop reasons) or "failed" with
    `error`; `turns` its model calls, `input_tokens`/`output_tokens` what they used, `cost`
    its USD total (None when unknown)."""

    parent_call_id: str
    session_id: str
    stop_reason: str
    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None
    error: str | None = None


def child_call_id(parent_call_id: str, call_id: str) -> str:
    """A child's tool call id as shown among the parent's calls: unique across the tree."""
    return f"{parent_call_id}/{call_id}"


Event = (
    TextDelta
    | ThoughtDelta
    | ToolCallStart
    | ToolCallRunning
    | ToolCallEnd
    | PlanUpdated
    | UsageUpdated
    | Notice
    | CompactionStarted
    | CompactionFinished
    | ModeChanged
    | TitleChanged
    | UserMessageAdded
    | CommandsChanged
    | SubagentStarted
    | SubagentEvent
    | SubagentFinished
)
Emit = Callable[[Event], Awaitable[None]]
