"""What to compact, as pure functions tested without a model: whether the context is over
the threshold, where the kept recent tail starts, and a history without its open tool calls."""

from __future__ import annotations

import math
from collections.abc import Sequence

from crow.messages import Message

__all__ = ["closed_prefix", "cut_point", "should_compact"]


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


def closed_prefix(messages: Sequence[Message]) -> list[Message]:
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
