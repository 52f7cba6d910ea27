"""How `crow run` writes a turn: `--output text|json|stream-json`.

stdout carries the answer only: the text (text), one JSON object at the end (json), or one
JSON object per line per event ending with that same object as `{"type": "result", ...}`
(stream-json). Tool activity and notices go to stderr in text and json modes; in
stream-json they are events. A subagent's (crow's `task` tool) are shown the same way,
named: on stderr each of its lines starts with `[agent · task]`; in stream-json its events
are their usual objects with `parent_tool_call_id` and `session_id`, between a
`subagent_started` and a `subagent_finished`. Its text never joins the answer. JSON is
UTF-8; a lone surrogate in a model's text is written as its `\\udXXX` escape, so every
line parses.

`Tracker` watches the events for what the end needs: the answer (the text of the model's
last message; empty when that message only called tools) and whether the last tool round
had a call the permission hook refused (`crow.rules.REFUSED`).
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

from crow.events import (
    CompactionFinished,
    CompactionStarted,
    Event,
    ModeChanged,
    Notice,
    PlanUpdated,
    SubagentEvent,
    SubagentFinished,
    SubagentStarted,
    TextDelta,
    ThoughtDelta,
    TitleChanged,
    ToolCallEnd,
    ToolCallRunning,
    ToolCallStart,
    UsageUpdated,
    UserMessageAdded,
)
from crow.rules import REFUSED
from crow.terminal import printable

if TYPE_CHECKING:
    from crow.loop import TurnResult

TOOL_LINE = 120  # characters of a tool's output shown on stderr


class Tracker:
    def __init__(self) -> None:
        self.answer = ""
        self.refused = False  # in the last tool round
        self._message = None  # the id of the message `answer` is from
        self._new_round = True

    def see(self, event: Event) -> None:
        if isinstance(event, TextDelta):
            if event.message_id != self._message:
                self._message, self.answer = event.message_id, ""
            self.answer += event.text
        elif isinstance(event, UsageUpdated):
            self._new_round = True  # sent after each model call: the next tool call starts a round
        elif isinstance(event, ToolCallStart):
            self._message, self.answer = None, ""
            if self._new_round:
                self.refused, self._new_round = False, False
        elif isinstance(event, ToolCallEnd) and (event.result.meta or {}).get(REFUSED):
            self.refused = True


def exit_status(result: TurnResult | None, refused: bool) -> int:
    """The table in `crow run --help` (crow.cli)."""
    if result is None or result.stop_reason == "cancelled":
        return 130
    if result.error:
        return 1
    if result.stop_reason in ("max_turn_requests", "max_tokens", "refusal"):
        return 3
    return 4 if refused else 0


class Ending:
    """The result object of json and stream-json output when `crow run` ends without a
    turn's result (`cli_run.run`): `stop_reason` is null (no turn ended; "cancelled" for
    Ctrl-C), `error` and `cause` say why. Written once, and only while stdout is writable."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.session_id: str | None = None  # once the session is open
        self.written = False  # the turn's own result went out (or stdout is gone)

    def fail(self, exc: BaseException) -> None:
        if self.written or self.kind == "text" or sys.stdout is None:
            return
        self.written = True
        cancelled = isinstance(exc, KeyboardInterrupt)
        report: dict[str, Any] = {
            "session_id": self.session_id,
            "stop_reason": "cancelled" if cancelled else None,
            "answer": "",
            "usage": dict.fromkeys(USAGE_FIELDS, 0),
            "cost": None,
        }
        if not cancelled:
            report.update(error=str(exc) or type(exc).__name__, cause=failure_cause(exc))
        try:
            write_json(report if self.kind == "json" else {"type": "result", **report})
        except OSError:  # the reader went away too: the exit status still says why
            pass


USAGE_FIELDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


def failure_cause(exc: BaseException) -> str:
    """The `cause` of a `crow run` that raised: a name a script can branch on."""
    from crow.errors import ConfigError, CrowError, HookError, SessionBusy, SessionError, StoreError

    for cls, name in (
        (SessionBusy, "busy"),
        (SessionError, "session"),
        (ConfigError, "config"),
        (HookError, "hook"),
        (StoreError, "store"),
        (CrowError, "error"),
    ):
        if isinstance(exc, cls):
            return name
    return "internal"  # a bug in crow or a plugin: the traceback is on stderr


def write_json(obj: dict[str, Any]) -> None:
    line = json.dumps(obj, ensure_ascii=False) + "\n"
    sys.stdout.buffer.write(line.encode("utf-8", "backslashreplace"))
    sys.stdout.buffer.flush()


def activity(event: Event) -> str | None:
    """The stderr line for an event of text and json modes (None: nothing to show)."""
    if isinstance(event, ToolCallStart):
        from crow.tool_kinds import tool_title

        return f"→ {printable(tool_title(event.call, event.spec))}"
    if isinstance(event, ToolCallEnd):
        return f"  {'✗' if event.result.is_error else '✓'} {printable(first_line(event.result.text))}"
    if isinstance(event, Notice):
        return printable(event.full_text)  # may name a hostile file
    if isinstance(event, ModeChanged):
        return f"  mode: {printable(event.mode)}"
    return None


class Activity:
    """The stderr lines of text and json modes: `activity`'s, and a subagent's, each
    starting with its agent's name and task (`[reviewer · Find the bug] → Read a.py`), so
    children running side by side stay apart; its text, plan, usage and mode are left out."""

    def __init__(self) -> None:
        self._children: dict[str, tuple[str, float]] = {}  # session id -> (prefix, start)

    def line(self, event: Event) -> str | None:
        if isinstance(event, SubagentStarted):
            tag = f"[{_short(event.name, 30)} · {_short(event.description, 50)}]"
            self._children[event.session_id] = (tag, time.monotonic())
            return f"  {tag} started"
        if isinstance(event, SubagentEvent):
            tag, _ = self._children.get(event.session_id, (f"[{event.session_id}]", 0.0))
            inner = event.event
            line = None if isinstance(inner, ModeChanged | SubagentEvent) else activity(inner)
            return f"  {tag} {line.lstrip()}" if line else None
        if isinstance(event, SubagentFinished):
            from crow.tui.text import child_ended, child_figures

            tag, since = self._children.pop(event.session_id, (f"[{event.session_id}]", time.monotonic()))
            said = f"  {tag} {child_ended(event)[0]} · {child_figures(event, time.monotonic() - since)}"
            return said + (f": {printable(first_line(event.error))}" if event.error else "")
        return activity(event)


def _short(text: str, width: int) -> str:
    """A name or a title on one line of at most `width` characters, printable."""
    line = " ".join(text.split())
    return printable(line if len(line) <= width else line[: width - 1] + "…")


def first_line(text: str, width: int = TOOL_LINE) -> str:
    """A tool's output in one line: its first line, cut at a word boundary when long, and
    how many lines were left out."""
    lines = text.splitlines() or [""]
    first = lines[0]
    if len(first) > width:
        cut = first[: width - 1]
        space = cut.rfind(" ")
        first = (cut[:space] if space > width // 2 else cut).rstrip() + "…"
    more = len(lines) - 1
    return first + (f" ({more} more line{'s' * (more > 1)})" if more else "")


class PlainText:
    """Text mode when stdout is not a terminal: the model's text as it came, each message of
    the turn separated from the one before by a blank line; activity on stderr."""

    def __init__(self) -> None:
        self._message: str | None = None
        self._last = ""  # the last character written
        self._activity = Activity()

    async def emit(self, event: Event) -> None:
        if isinstance(event, TextDelta) and event.text:
            if self._last and event.message_id != self._message:
                self._write("\n\n" if self._last != "\n" else "\n")
            self._message = event.message_id
            self._write(event.text)
        elif (line := self._activity.line(event)) is not None:
            print(line, file=sys.stderr, flush=True)

    def _write(self, text: str) -> None:
        sys.stdout.buffer.write(text.encode("utf-8", "replace"))
        sys.stdout.buffer.flush()
        self._last = text[-1]

    def finish(self, report: dict[str, Any], result: TurnResult | None) -> None:
        if self._last and self._last != "\n":
            self._write("\n")


class OnTerminal:
    """Text mode on a terminal: `crow.tui.render.Renderer` shows the turn."""

    def __init__(self, cwd: str) -> None:
        from crow.tui.render import Renderer

        self.renderer = Renderer(cwd=cwd)
        self.renderer.start_turn()
        self.emit = self.renderer.emit

    def finish(self, report: dict[str, Any], result: TurnResult | None) -> None:
        self.renderer.end_turn(result, cancelled=report["stop_reason"] == "cancelled")


class OneObject:
    """json: activity on stderr, one object on stdout at the end."""

    def __init__(self) -> None:
        self._activity = Activity()

    async def emit(self, event: Event) -> None:
        if (line := self._activity.line(event)) is not None:
            print(line, file=sys.stderr, flush=True)

    def finish(self, report: dict[str, Any], result: TurnResult | None) -> None:
        write_json(report)


class Stream:
    """stream-json: one object per event, then the result."""

    async def emit(self, event: Event) -> None:
        obj = event_object(event)
        if obj is not None:
            write_json(obj)

    def finish(self, report: dict[str, Any], result: TurnResult | None) -> None:
        write_json({"type": "result", **report})


def event_object(event: Event) -> dict[str, Any] | None:
    """An event as a stream-json line (None: not shown; the slash-command list)."""
    if isinstance(event, SubagentStarted | SubagentEvent | SubagentFinished):
        return _subagent_object(event)
    if isinstance(event, TextDelta | ThoughtDelta):
        kind = "text" if isinstance(event, TextDelta) else "thought"
        return {"type": kind, "text": event.text, "message_id": event.message_id}
    if isinstance(event, ToolCallStart):
        from crow.tool_kinds import tool_title

        spec = event.spec
        return {
            "type": "tool_call",
            "id": event.call.id,
            "name": event.call.name,
            "title": tool_title(event.call, spec),
            "kind": spec.kind if spec is not None else "other",
            "args": dict(event.call.args),
        }
    if isinstance(event, ToolCallRunning):
        return {"type": "tool_running", "id": event.call.id}
    if isinstance(event, ToolCallEnd):
        r = event.result
        return {
            "type": "tool_result",
            "id": event.call.id,
            "name": event.call.name,
            "status": "failed" if r.is_error else "completed",
            "refused": bool((r.meta or {}).get(REFUSED)),
            "output": r.text,
        }
    if isinstance(event, PlanUpdated):
        return {"type": "plan", "todos": [dict(t) for t in event.todos]}
    if isinstance(event, UsageUpdated):
        return {
            "type": "usage",
            "context_tokens": event.used,
            "context_window": event.size,
            "cost": event.cost,
        }
    if isinstance(event, Notice):
        return {"type": "notice", "severity": event.severity, "title": event.headline, "text": event.text}
    if isinstance(event, CompactionStarted):
        return {"type": "compaction_started", "id": event.id}
    if isinstance(event, CompactionFinished):
        return {"type": "compaction_finished", "id": event.id, "status": event.status, "error": event.error}
    if isinstance(event, ModeChanged):
        return {"type": "mode", "mode": event.mode}
    if isinstance(event, TitleChanged):
        return {"type": "title", "title": event.title}
    if isinstance(event, UserMessageAdded):
        return {"type": "user_message", "text": event.message.content}
    return None


def _subagent_object(event: SubagentStarted | SubagentEvent | SubagentFinished) -> dict[str, Any] | None:
    """A subagent's start and end, and its events as their usual objects naming the task's
    call (`parent_tool_call_id`) and the child's session (`session_id`; a grandchild's
    events keep their own: the innermost names win)."""
    link = {"parent_tool_call_id": event.parent_call_id, "session_id": event.session_id}
    if isinstance(event, SubagentEvent):
        obj = event_object(event.event)
        return None if obj is None else {"type": obj["type"], **link, **obj}
    if isinstance(event, SubagentStarted):
        return {
            "type": "subagent_started",
            **link,
            "name": event.name,
            "description": event.description,
            "cwd": event.cwd,
            "additional_directories": list(event.additional_directories),
        }
    return {
        "type": "subagent_finished",
        **link,
        "stop_reason": event.stop_reason,
        "turns": event.turns,
        "input_tokens": event.input_tokens,
        "output_tokens": event.output_tokens,
        "cost": event.cost,
        "error": event.error,
    }
