"""What the loop emits while a turn runs.

The loop never imports ACP: it hands these to a sink (`Emit`). The ACP adapter turns them
into `session/update` notifications, `crow run` prints them, tests collect them. The sink
is awaited, so a slow client slows the loop instead of growing a buffer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from crow.llm.base import TextDelta, ThoughtDelta, ToolSpec
from crow.messages import ToolCall, ToolResult

__all__ = [
    "Emit",
    "Event",
    "ModeChanged",
    "Notice",
    "PlanUpdated",
    "TextDelta",
    "ThoughtDelta",
    "TitleChanged",
    "ToolCallEnd",
    "ToolCallRunning",
    "ToolCallStart",
    "UsageUpdated",
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


@dataclass(frozen=True, slots=True)
class Notice:
    """Something crow or a hook tells the user (shown as agent text)."""

    text: str


@dataclass(frozen=True, slots=True)
class ModeChanged:
    """The session's mode changed during a turn (already saved); the front end shows it."""

    mode: str


@dataclass(frozen=True, slots=True)
class TitleChanged:
    """The session was named (already saved; from its first prompt); the front end shows it."""

    title: str


Event = (
    TextDelta
    | ThoughtDelta
    | ToolCallStart
    | ToolCallRunning
    | ToolCallEnd
    | PlanUpdated
    | UsageUpdated
    | Notice
    | ModeChanged
    | TitleChanged
)
Emit = Callable[[Event], Awaitable[None]]
