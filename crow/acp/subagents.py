"""Subagents (crow's `task` tool) as an ACP editor shows them.

The task call itself is an ordinary tool call of the parent (kind think, titled with the
task's description); once its child starts, a `tool_call_update` links it to the child's
session (`_meta.crow.subagentSessionId`). The rest depends on the client:

- It advertised the unstable `subagents` capability: `SubagentStarted` becomes a
  `subagent_update` on the parent's session (the child's id, the description as title, the
  agent's name as description, state running, where it works), sent before anything bearing
  the child's id (whose session then shows the prompt as its first user message); the
  child's events become the usual updates on the CHILD's session, its
  tool calls under their own ids with `_meta.crow.parentToolCallId` (mode and command
  changes excepted: a child session has neither to pick); `SubagentFinished` becomes a
  `subagent_update` with state idle, the stop reason and the tokens used. A task call that
  ends with its child unreported (a cancel) reports the child idle, cancelled, first.
- It did not (Zed today): everything shows on the parent's session. Each child tool call is
  a tool call of its own, id `child_call_id(task call, call)`, shown as the parent's are
  (`crow.acp.view`) with `_meta.crow.parentToolCallId` and `subagentSessionId`. The child's
  text replaces the task call's content: coalesced (at most every `FLUSH_EVERY` seconds,
  and at each tool call and at the end, so the final state is always shown), and only its
  tail (`MAX_SHOWN` characters). Its thoughts are left out: a tool call's content cannot
  show them apart from the answer. Its notices become the parent's, prefixed with its
  name. Its plan, usage, title, mode and commands are not shown: on the parent's session
  each would replace the parent's own (the plan, the context meter, the session's name).

A grandchild (a child's own task) is shown the same way one level down. Several children
emit into one parent sink at once; each child's events arrive in its own order, so the
announcement precedes its traffic and its end follows it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from acp import text_block, tool_content, update_tool_call

from crow.acp import convert as acp_convert
from crow.acp import reports as acp_reports
from crow.acp import view as acp_view
from crow.acp.protocol import ClientFeatures, SubagentUpdate
from crow.acp.protocol import ToolCallStart as ToolCallShown
from crow.events import (
    CommandsChanged,
    Event,
    ModeChanged,
    Notice,
    SubagentEvent,
    SubagentFinished,
    SubagentStarted,
    TextDelta,
    ToolCallEnd,
    ToolCallRunning,
    ToolCallStart,
    child_call_id,
)

__all__ = ["EVENTS", "FLUSH_EVERY", "MAX_SHOWN", "SubagentView", "innermost"]

EVENTS = (SubagentStarted, SubagentEvent, SubagentFinished)
FLUSH_EVERY = 0.1  # seconds between two updates of a task call's streamed text
MAX_SHOWN = 4000  # characters of a child's text shown in its task call (the tail)
_CALLS = (ToolCallStart, ToolCallRunning, ToolCallEnd)
_NOT_ON_CHILD = (ModeChanged, CommandsChanged)  # a child session has no modes or commands to pick

Shown = tuple[str, Any]  # (session id, update)


def innermost(event: Event) -> Event:
    """The child's (or grandchild's) own event inside `SubagentEvent` wrappers."""
    while isinstance(event, SubagentEvent):
        event = event.event
    return event


def _linked(call_id: str, **crow: str) -> Any:
    """A `tool_call_update` of `call_id` that only sets crow's `_meta`."""
    update = update_tool_call(call_id)
    update.field_meta = {"crow": crow}
    return update


@dataclass
class _Flattened:
    """A child shown among its parent's calls: how its ids show there, and its text so far."""

    name: str
    session_id: str
    top: str  # the session it is shown on (its call ids are that session's)
    task_call: str  # the task call's id as shown
    text: str = ""
    message_id: str = ""
    sent_at: float = float("-inf")
    dirty: bool = False
    cut: bool = False  # its beginning was dropped
    rename: Callable[[str], str] = field(init=False)

    def __post_init__(self) -> None:
        self.rename = lambda call_id: child_call_id(self.task_call, call_id)

    def add(self, delta: TextDelta) -> None:
        if delta.message_id != self.message_id and self.text:
            self.text += "\n\n"  # a new message of the child's
        self.message_id = delta.message_id
        self.text += delta.text
        if len(self.text) > 2 * MAX_SHOWN:  # memory stays bounded, whatever the child says
            self.text, self.cut = self.text[-MAX_SHOWN:], True
        self.dirty = True

    def flush(self, now: float) -> list[Any]:
        """The task call's content replaced with the text so far (nothing when unchanged)."""
        if not self.dirty:
            return []
        self.dirty, self.sent_at = False, now
        cut = self.cut or len(self.text) > MAX_SHOWN
        shown = "…" + self.text[-MAX_SHOWN:] if cut else self.text
        return [update_tool_call(self.task_call, content=[tool_content(text_block(shown))])]


class SubagentView:
    """Turns one connection's subagent events into (session id, update) pairs."""

    def __init__(self, features: ClientFeatures, clock: Callable[[], float] = time.monotonic) -> None:
        self.features = features
        self._clock = clock
        self._flattened: dict[str, _Flattened] = {}  # child session id -> its state
        self._running: dict[tuple[str, str], str] = {}  # (session, task call) -> child announced

    def updates(self, session_id: str, cwd: Path, event: Event) -> list[Shown]:
        """What the editor is sent for `event`, emitted by session `session_id`'s turn."""
        if self.features.subagents:
            return self._as_sessions(session_id, cwd, event)
        return [(session_id, u) for u in self._flatten(session_id, cwd, event, lambda call_id: call_id)]

    # ------------------------------------------------------------ with the capability
    def _as_sessions(self, session_id: str, cwd: Path, event: Event) -> list[Shown]:
        if isinstance(event, SubagentStarted):
            announce = SubagentUpdate(
                session_update="subagent_update",
                session_id=event.session_id,
                title=event.description,
                description=event.name,
                state={"state": "running"},
                cwd=event.cwd,
                additional_directories=list(event.additional_directories) or None,
            )
            self._running[(session_id, event.parent_call_id)] = event.session_id
            link = _linked(event.parent_call_id, subagentSessionId=event.session_id)
            shown = [(session_id, announce), (session_id, link)]
            if event.prompt is not None:  # what the child was asked, as a replay of it shows first
                shown.append((event.session_id, acp_view.user_chunk(event.prompt, event.prompt.id)))
            return shown
        if isinstance(event, SubagentFinished):
            self._running.pop((session_id, event.parent_call_id), None)
            ended = SubagentUpdate(
                session_update="subagent_update", session_id=event.session_id, state=_idle(event)
            )
            return [(session_id, ended)]
        if not isinstance(event, SubagentEvent):
            shown = acp_convert.event_updates(event, cwd, self.features)
            return self._unfinished(session_id, event) + [(session_id, u) for u in shown]
        inner, child = event.event, event.session_id
        if isinstance(inner, EVENTS):
            return self._as_sessions(child, cwd, inner)
        if isinstance(inner, _NOT_ON_CHILD):
            return []
        shown = acp_convert.event_updates(inner, cwd, self.features)
        for update in shown:
            if isinstance(update, ToolCallShown):
                update.field_meta = {"crow": {"parentToolCallId": event.parent_call_id}}
        return self._unfinished(child, inner) + [(child, u) for u in shown]

    def _unfinished(self, session_id: str, event: Event) -> list[Shown]:
        """A task call that ends with its child unfinished (the turn was cancelled, or the
        tool failed before the child's end was told): the child is reported idle first, so
        that no editor shows it running for ever."""
        child = (
            self._running.pop((session_id, event.call.id), None) if isinstance(event, ToolCallEnd) else None
        )
        if child is None:
            return []
        state = {"state": "idle", "stopReason": "cancelled"}
        return [(session_id, SubagentUpdate(session_update="subagent_update", session_id=child, state=state))]

    # ------------------------------------------------------------ without it
    def _flatten(self, top: str, cwd: Path, event: Event, rename: Callable[[str], str]) -> list[Any]:
        """`event` shown among the calls of `top` (the session whose turn emitted it);
        `rename` makes its emitter's call ids unique there (the identity for `top` itself)."""
        if isinstance(event, SubagentStarted):
            task_call = rename(event.parent_call_id)
            self._flattened[event.session_id] = _Flattened(event.name, event.session_id, top, task_call)
            return [_linked(task_call, subagentSessionId=event.session_id)]
        if isinstance(event, SubagentFinished):
            child = self._flattened.pop(event.session_id, None)
            return child.flush(self._clock()) if child is not None else []
        if not isinstance(event, SubagentEvent):
            if isinstance(event, ToolCallEnd):
                self._forget(top, event.call.id)
            return acp_convert.event_updates(event, cwd, self.features)
        child = self._flattened.get(event.session_id)
        if child is None:  # its start was not seen (a plugin's child): shown all the same
            task_call = rename(event.parent_call_id)
            child = _Flattened("subagent", event.session_id, top, task_call)
            self._flattened[event.session_id] = child
        inner = event.event
        if isinstance(inner, EVENTS):
            return self._flatten(top, cwd, inner, child.rename)
        if isinstance(inner, TextDelta):
            child.add(inner)
            now = self._clock()
            return child.flush(now) if now - child.sent_at >= FLUSH_EVERY else []
        if isinstance(inner, _CALLS):
            if isinstance(inner, ToolCallEnd):
                self._forget(top, child.rename(inner.call.id))
            return child.flush(self._clock()) + self._child_call(child, cwd, inner)
        if isinstance(inner, Notice):
            told = replace(
                inner,
                text=f"{child.name}: {inner.text}",
                title=inner.title and f"{child.name}: {inner.title}",
            )
            return acp_reports.updates(told, self.features)
        return []  # thoughts, plan, usage, title, mode, commands, compaction: see the docstring

    def _forget(self, top: str, task_call: str) -> None:
        """Drop what is kept of the children of a task call of `top` that ended (normally
        gone already); another session's call of the same id (models reuse ids) is not it."""
        gone = [k for k, c in self._flattened.items() if (c.top, c.task_call) == (top, task_call)]
        for session_id in gone:
            del self._flattened[session_id]

    @staticmethod
    def _child_call(
        child: _Flattened, cwd: Path, event: ToolCallStart | ToolCallRunning | ToolCallEnd
    ) -> list[Any]:
        shown_call = event.call.replace(id=child.rename(event.call.id))
        update = acp_convert.event_update(replace(event, call=shown_call), cwd)
        # A child's own task call ends linked to the grandchild it ran (`view.end_update`):
        # that link wins, or the editor's last word on the call would name the wrong child.
        own = (update.field_meta or {}).get("crow", {})
        update.field_meta = {
            "crow": {"parentToolCallId": child.task_call, "subagentSessionId": child.session_id, **own}
        }
        return [update]


def _idle(event: SubagentFinished) -> dict[str, Any]:
    """The child's state once its turn ended: idle, why, and what it used."""
    state: dict[str, Any] = {"state": "idle", "stopReason": event.stop_reason}
    if event.error is not None or event.stop_reason == "failed":
        state.update(
            stopReason="error", error={"code": acp_reports.TURN_FAILED, "message": event.error or "failed"}
        )
    if event.input_tokens or event.output_tokens:
        state["usage"] = {
            "totalTokens": event.input_tokens + event.output_tokens,
            "inputTokens": event.input_tokens,
            "outputTokens": event.output_tokens,
        }
    return state
