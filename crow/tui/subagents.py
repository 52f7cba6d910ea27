"""Subagents (crow's `task` tool) as the terminal shows them, for `crow.tui.render.Renderer`.

A task is its parent's tool call, shown like any other, named by its agent (`reviewer:
Find the bug`). While the child runs, the live part shows under the task's running line
what the child does: its last finished call, the calls running now and the latest line
of its answer, so children running side by side stay apart. When the task ends its group
is printed once, under the task's line: the child's calls (one line each: status,
title, time; a failure's first line), its warnings, then one summary line (how it ended,
model calls, tokens, cost, time). Outputs and diffs fold (Ctrl-O shows them); the child's
answer is the task's result, folded like the plan tool's. Nothing of a child changes the
parent's answer, plan or status line. Every text of a child goes through `printable`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.text import Text

from crow.events import (
    Event,
    Notice,
    SubagentEvent,
    SubagentFinished,
    SubagentStarted,
    TextDelta,
    ToolCallEnd,
    ToolCallRunning,
    ToolCallStart,
)
from crow.tui import tools
from crow.tui.text import child_ended, child_figures, clip

if TYPE_CHECKING:
    from rich.console import RenderableType

    from crow.llm.base import ToolSpec
    from crow.messages import ToolCall, ToolResult
    from crow.tui.live import TurnState

NESTED_SHOWN = 10  # a finished child's lines printed under its task; the rest fold
INDENT = "  "
_NOTICE = {"warning": ("⚠ ", "yellow"), "error": ("✗ ", "red")}  # a child's info notices stay out


@dataclass
class Child:
    """One child's progress, kept until its task's line is printed."""

    name: str
    description: str
    started: float = field(default_factory=time.monotonic)
    running: dict[str, tuple[ToolCall, ToolSpec | None, float]] = field(default_factory=dict)
    done: list[tuple[ToolCall, ToolSpec | None, ToolResult, float] | Notice] = field(default_factory=list)
    latest: str = ""  # the tail of the child's answer streaming now (the live part's preview)
    finished: SubagentFinished | None = None
    took: float = 0.0

    @property
    def label(self) -> str:
        """`reviewer: ` before the task's title (printable, short)."""
        return clip(" ".join(self.name.split()), 24) + ": "  # one line, whatever the name holds

    def tag(self, width: int) -> str:
        """`reviewer: Find it`, what an expanded output is headed with."""
        return self.label + clip(" ".join(self.description.split()), max(1, width - cell_len(self.label)))


class Children:
    """The children of the running turn by their task's call id. `calls` is the renderer's
    (call id -> call, spec, start): a task's line is drawn from it."""

    def __init__(self, calls: dict[str, tuple[ToolCall, ToolSpec | None, float]]) -> None:
        self._calls = calls
        self._by_task: dict[str, Child] = {}

    def clear(self) -> None:
        self._by_task.clear()

    def see(
        self, event: SubagentStarted | SubagentEvent | SubagentFinished, state: TurnState | None, width: int
    ) -> None:
        task = event.parent_call_id
        if isinstance(event, SubagentStarted):
            self._by_task[task] = Child(event.name, event.description)
        child = self._by_task.get(task)
        if child is None:
            return  # a child of a task the turn did not show starting
        if isinstance(event, SubagentEvent):
            if not _follow(child, event.event):
                return
        elif isinstance(event, SubagentFinished):
            child.finished, child.took = event, time.monotonic() - child.started
            child.latest = ""
        if state is not None and task in state.running:
            self._draw_live(task, child, state, width)

    def label(self, task: str) -> str | None:
        child = self._by_task.get(task)
        return child.label if child is not None else None

    def pop(
        self, task: str, width: int, expand_key: str
    ) -> tuple[list[RenderableType], list[tuple[Text, RenderableType]]]:
        """What prints under task `task`'s line as it ends (the child's calls, notices and
        summary) and what folds for expand() (headed, whole); nothing for another call."""
        child = self._by_task.pop(task, None)
        if child is None:
            return [], []
        room = max(1, width - len(INDENT))
        lines: list[RenderableType] = []
        folded: list[tuple[Text, RenderableType]] = []
        for item in child.done:
            if isinstance(item, Notice):
                mark, style = _NOTICE[item.severity]
                lines.append(_nested(Text(mark + clip(item.headline, max(1, room - 2)), style=style)))
                continue
            call, spec, result, took = item
            line = tools.tool_line(call, spec, result, took, room)
            lines.append(_nested(line))
            if tools.status_of(result)[1] == "failed" and result.text.strip():
                first = next(ln for ln in result.text.splitlines() if ln.strip())
                lines.append(_nested(Text("  │ " + clip(first, max(1, room - 4)), style="red")))
            whole, _ = tools.tool_body(result, spec, width, full=True)
            if whole is not None:
                head = Text(child.tag(width) + " › ", style="dim bold")
                folded.append((head.append_text(line), whole))
        for call, spec, _ in child.running.values():  # a call the child never ended (cannot happen)
            lines.append(_nested(tools.running_line(call, spec, room)))
        if len(lines) > NESTED_SHOWN:
            hidden = len(lines) - NESTED_SHOWN + 1
            lines = lines[: NESTED_SHOWN - 1]
            lines.append(_nested(Text(f"… {hidden} more lines ({expand_key} to expand)", style="dim italic")))
        lines += [_nested(line) for line in _summary(child, room)]
        return lines, folded

    def _draw_live(self, task: str, child: Child, state: TurnState, width: int) -> None:
        """The task's running line named by its agent, and under it what the child does."""
        if task in self._calls:
            call, spec, _ = self._calls[task]
            state.running[task] = tools.running_line(call, spec, width, label=child.label)
        room = max(1, width - len(INDENT))
        nested: list[Text] = []
        last = next((d for d in reversed(child.done) if not isinstance(d, Notice)), None)
        if last is not None:
            call, spec, result, took = last
            nested.append(_nested(tools.tool_line(call, spec, result, took, room)))
        for call, spec, _ in list(child.running.values())[-2:]:
            nested.append(_nested(tools.running_line(call, spec, room)))
        if child.latest.strip():
            line = child.latest.strip().splitlines()[-1]
            nested.append(_nested(Text("│ " + clip(line, max(1, room - 2)), style="dim italic")))
        state.nested[task] = nested


def _follow(child: Child, event: Event) -> bool:
    """`event` of the child into its progress; False when it changes nothing shown (its
    plan, usage, title, mode: the parent's own stay as they are)."""
    if isinstance(event, TextDelta):
        child.latest = (child.latest + event.text)[-400:]
    elif isinstance(event, ToolCallStart):
        child.running[event.call.id] = (event.call, event.spec, time.monotonic())
        child.latest = ""
    elif isinstance(event, ToolCallEnd):
        call, spec, since = child.running.pop(event.call.id, (event.call, None, time.monotonic()))
        child.done.append((call, spec, event.result, time.monotonic() - since))
    elif isinstance(event, Notice) and event.severity in _NOTICE and event.compaction is None:
        child.done.append(event)
    else:
        return isinstance(event, ToolCallRunning)
    return True


def _nested(line: Text) -> Text:
    shown = Text(INDENT, no_wrap=True, overflow="ellipsis")
    return shown.append_text(line)


def _summary(child: Child, width: int) -> list[Text]:
    """`↳ ✓ done · 3 model calls · 12.4k tokens in, 800 out · $0.012 · 3.1 s`, and a
    failure's first line under it."""
    end = child.finished
    line = Text(no_wrap=True, overflow="ellipsis")
    if end is None:  # its task ended without the child's end (cannot happen)
        return [line.append("↳ ended", style="dim")]
    said, style = child_ended(end)
    line.append("↳ " + said, style=style)
    line.append(" · " + child_figures(end, child.took), style="dim")
    line.truncate(width, overflow="ellipsis")
    if style != "red":
        return [line]
    first = next((ln for ln in str(end.error).splitlines() if ln.strip()), "")
    return [line, Text("  │ " + clip(first.strip(), max(1, width - 4)), style="red", no_wrap=True)]
