"""Actions: what `after_model_call` and `agent_stop` hooks may ask of the loop, and the one
rule deciding whether the loop can do it now.

    Continue(messages)   agent_stop only: append user messages, run the loop again
    Compact(instructions) compact the session through the compaction service
    Replace(messages)    replace the session's context with these messages
    Stop(reason)         end the turn now; tool calls that will not run are answered

The first action offered at a phase wins (`ActionPicker`); `refusal(action, state)` then
checks it against the loop's state at that moment. A refused action is logged with the
hook's name and the reason, and the turn goes on as if no action had been returned.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, get_args

from crow.messages import InvalidMessages, Message, ToolCall, validate

log = logging.getLogger("crow.hooks")

TurnStopReason = Literal["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"]
"""Why a turn ended: the ACP `stopReason` the client receives (not the model's reason)."""

# How a hook may end a turn: "cancelled" is the client's to say.
HOOK_STOP_REASONS: tuple[TurnStopReason, ...] = tuple(r for r in get_args(TurnStopReason) if r != "cancelled")


@dataclass(frozen=True, slots=True)
class Continue:
    """Run the loop again with these user messages appended (a "Ralph loop")."""

    messages: Sequence[Message | str]


@dataclass(frozen=True, slots=True)
class Compact:
    instructions: str | None = None


@dataclass(frozen=True, slots=True)
class Replace:
    """Replace the conversation (validated before it is applied)."""

    messages: Sequence[Message]


@dataclass(frozen=True, slots=True)
class Stop:
    """End the turn now. `reason` is the turn's stop reason (one of `HOOK_STOP_REASONS`;
    any other value is logged and ends the turn as "end_turn": a Stop always stops)."""

    reason: str = "end_turn"


Action = Continue | Compact | Replace | Stop


class LoopState(NamedTuple):
    """What the loop looks like when an action is offered. (A NamedTuple: this module is
    imported before `initialize` is answered, and a dataclass takes ~0.3 ms more to define.)"""

    phase: str  # "after_model_call" or "agent_stop"
    pending: Sequence[ToolCall] = ()  # tool calls of the last response not answered yet
    continues_left: int = 0
    can_compact: bool = False


def refusal(action: Action, state: LoopState) -> str | None:
    """Why `action` cannot apply in `state`; None when it can. The one place the rules live.

    Replace while tool calls wait for their results is refused, not deferred: applied
    before the calls run, their results would follow the replacement as orphans every
    provider rejects; applied after, the model would lose the results of what it just did.
    Compact keeps the pending exchange (its cut never splits one), so it is the way to
    shrink the history mid-turn.
    """
    if isinstance(action, Continue):
        if (why := _malformed(action, (Message, str), "Message objects or strings")) is not None:
            return why
        if state.phase != "agent_stop":
            return "Continue is honoured at agent_stop only"
        if state.continues_left <= 0:
            return "the limit of continues for this prompt is reached"
        return None
    if isinstance(action, Replace):
        if (why := _malformed(action, (Message,), "Message objects")) is not None:
            return why
        if state.pending:
            ids = ", ".join(c.id for c in state.pending)
            return (
                f"the model's tool calls ({ids}) wait for their results; "
                "return Compact, or Replace at agent_stop"
            )
        try:
            validate(action.messages)
        except InvalidMessages as exc:
            return str(exc)
        return None
    if isinstance(action, Compact):
        return None if state.can_compact else "this agent has no compaction service"
    return None  # Stop: always; the loop answers the calls that will not run


def _malformed(action: Continue | Replace, kinds: tuple[type, ...], named: str) -> str | None:
    """Why the messages a hook put in `action` are not a list of `kinds` (a bare string is
    a Sequence too: taken as one, it would become a message per character)."""
    what, messages = type(action).__name__, action.messages
    if isinstance(messages, str):
        return f"{what} takes a list of messages, not one string"
    if not isinstance(messages, Sequence):
        return f"{what} takes a list of messages, not {messages!r:.200}"
    if not messages and isinstance(action, Continue):
        return "Continue without messages: nothing new for the model to answer"
    for m in messages:
        if not isinstance(m, kinds):
            return f"{what}'s messages must be {named}; got {m!r:.200}"
    return None


def stop_reason(action: Stop, by: str) -> TurnStopReason:
    """The turn's stop reason for a Stop (an unknown one is logged and ends the turn)."""
    for reason in HOOK_STOP_REASONS:
        if action.reason == reason:
            return reason
    log.warning(
        "hook %s: Stop reason %r is not one of %s; the turn ends as end_turn",
        by,
        action.reason,
        ", ".join(HOOK_STOP_REASONS),
    )
    return "end_turn"


@dataclass(slots=True)
class ActionPicker:
    """First action wins; later ones are logged as conflicts."""

    chosen: Action | None = None
    chosen_by: str = ""
    ignored: list[tuple[str, Action]] = field(default_factory=list)

    def offer(self, by: str, action: object) -> None:
        if action is None:
            return
        if not isinstance(action, Continue | Compact | Replace | Stop):
            log.warning("hook %s returned %r, which is not an action; ignored", by, action)
            return
        if self.chosen is None:
            self.chosen, self.chosen_by = action, by
        else:
            self.ignored.append((by, action))
            log.warning(
                "hook %s asked for %s but %s already chose %s; ignored",
                by,
                type(action).__name__,
                self.chosen_by,
                type(self.chosen).__name__,
            )
