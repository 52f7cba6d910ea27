"""The loop's events as a terminal shows them (rich). One `Renderer` per front end; it is
the turn's `emit` sink.

The interface (what `crow.tui.chat` and `crow.cli_run` call):
- `await renderer.emit(event)`: show one event;
- `start_turn()` / `end_turn(result, cancelled=...)`: the live status line's life;
- `with renderer.paused():` nothing live on screen while the terminal asks a question;
- `expand()`: print what the last turn folded (reasoning, whole tool outputs);
- `info(text)` / `error(text)`: the front end's own lines.

What is final goes to the scrollback once (a finished Markdown block, a tool's line, a
plan); only the unfinished part stays live (`crow.tui.live`). Every text from the model,
a tool or a file goes through `crow.terminal.printable` and is never read as rich markup.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.padding import Padding
from rich.text import Text

from crow.events import (
    CommandsChanged,
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
from crow.terminal import printable
from crow.tui import tools
from crow.tui.live import FPS, Block, LiveView, LogsAbove, TurnState
from crow.tui.subagents import Children
from crow.tui.text import clip, seconds, usage

if TYPE_CHECKING:
    from crow.llm.base import ToolSpec
    from crow.loop import TurnResult
    from crow.messages import ToolCall

EXPAND_KEY = "Ctrl-O"
_NOTICE = {"info": ("ℹ ", "cyan"), "warning": ("⚠ ", "yellow"), "error": ("✗ ", "red")}
_PLAN = {"in_progress": ("◐", "yellow"), "done": ("☑", "green"), "completed": ("☑", "green")}
_STOPPED = {
    "max_turn_requests": "the turn reached its limit of model requests",
    "max_tokens": "the answer reached the model's output limit",
    "refusal": "the model refused",
}


class Renderer:
    def __init__(
        self, console: Console | None = None, *, cwd: str = ".", expand_key: str = EXPAND_KEY
    ) -> None:
        self.console = console or Console(highlight=False)
        self.cwd = cwd
        self.expand_key = expand_key
        self._state: TurnState | None = None  # while a turn runs
        self._live: _Live | None = None
        self._logs = LogsAbove(self.console)
        self._pauses = 0
        self._held: list[RenderableType] = []  # printed while paused: shown after
        self._message_id: str | None = None  # the answer message streaming now
        self._after = ""  # what was printed last: "", "text", "tool", "other"
        self._thought_since = 0.0  # when the reasoning streaming now began
        self._calls: dict[str, tuple[ToolCall, ToolSpec | None, float]] = {}
        self._children = Children(self._calls)  # subagents (crow.tui.subagents), by task call
        self._plan: list[tuple[str, str]] | None = None
        self._folded: list[tuple[Text, RenderableType]] = []  # the last turn's, for expand()

    # -------------------------------------------------------------- the turn

    def start_turn(self) -> None:
        self._stop_live()  # a turn that never ended: its live part goes
        self._state = TurnState()
        self._message_id = None
        self._after = ""
        self._calls.clear()
        self._children.clear()
        self._folded = []
        self._start_live()

    def end_turn(self, result: TurnResult | None, *, cancelled: bool = False) -> None:
        state = self._state or TurnState()
        self._settle()
        self._stop_live()
        self._state = None
        took = seconds(time.monotonic() - state.started)
        figures = f" · {usage(state.used, state.size, state.cost)}" if state.used or state.cost else ""
        stop = result.stop_reason if result is not None else None
        if cancelled or stop == "cancelled":
            line = Text(f"■ Cancelled after {took}", style="yellow")
        elif result is not None and result.error:
            line = Text(f"✗ Failed after {took}: ", style="red")
            line.append(printable(_first_sentence(result.error)))  # the notice above said it all
        elif stop in _STOPPED:
            line = Text(f"⚠ Stopped after {took}: {_STOPPED[str(stop)]}", style="yellow")
        else:
            line = Text(f"✓ {took}", style="green")
        line.append(figures, style="dim")
        self._print(line, gap=True)

    async def emit(self, event: Event) -> None:
        if self._live is not None and self._live.failure is not None:
            raise self._live.failure  # the terminal is gone: the turn hears it here
        state = self._state
        if isinstance(event, TextDelta):
            self._text(event)
        elif isinstance(event, ThoughtDelta):
            self._thought(event)
        elif isinstance(event, UsageUpdated):
            if state is not None:
                state.used, state.size, state.cost = event.used, event.size, event.cost
        elif isinstance(event, ToolCallStart):
            self._settle()
            self._calls[event.call.id] = (event.call, event.spec, time.monotonic())
            if state is not None:
                state.running[event.call.id] = tools.running_line(event.call, event.spec, self.console.width)
        elif isinstance(event, ToolCallRunning):
            if state is not None and event.call.id in self._calls:
                call, spec, _ = self._calls[event.call.id]
                state.phase = "Running " + printable(tools.title_of(call, spec))
        elif isinstance(event, ToolCallEnd):
            self._tool_end(event)
        elif isinstance(event, SubagentStarted | SubagentEvent | SubagentFinished):
            self._children.see(event, state, self.console.width)  # the parent's answer stays as it is
        elif not isinstance(event, CommandsChanged):  # the chat's completion reads those
            self._settle()
            self._other(event)

    # -------------------------------------------------------------- the answer

    def _text(self, event: TextDelta) -> None:
        self._fold_thought()
        if event.message_id != self._message_id:
            self._flush_answer()  # a new message is a new block
            self._message_id = event.message_id
        if self._state is None:  # no turn: nothing live, the text as it comes
            self._print(Text(printable(event.text), end=""))
            return
        self._state.phase = "Writing"
        done = self._state.answer.feed(event.text)
        if done:
            self._print_blocks(done)

    def _flush_answer(self) -> None:
        if self._state is not None:
            rest = self._state.answer.flush()
            if rest:
                self._print_blocks([rest])

    def _print_blocks(self, blocks: list[str]) -> None:
        shown: list[RenderableType] = []
        for block in blocks:
            if self._after or shown:
                shown.append(Text())
            shown.append(Block(block))
        self._print(*shown)
        self._after = "text"

    def _thought(self, event: ThoughtDelta) -> None:
        now = time.monotonic()
        if self._state is None:
            self._print(Text(printable(event.text), style="dim", end=""))
            return
        if not self._state.thought:
            self._flush_answer()
            self._thought_since = now
            self._state.phase = "Thinking"
        self._state.thought.append(event.text)

    def _fold_thought(self) -> None:
        """The reasoning that streamed, folded to one line (its text kept for expand())."""
        state = self._state
        if state is None or not state.thought:
            return
        text = "".join(state.thought).replace("\r\n", "\n").strip()  # a "\r" shows as "\x0d"
        state.thought = []
        state.phase = "Waiting for the model"
        if not text:
            return
        took = seconds(time.monotonic() - self._thought_since)  # until the answer or a call begins
        line = Text(f"∴ Thought for {took} ({self.expand_key} to expand)", style="dim italic")
        self._folded.append((Text("∴ Thought", style="dim bold"), Text(printable(text), style="dim italic")))
        self._print(line, gap=self._after == "text")
        self._after = "other"

    def _settle(self) -> None:
        """Before something else is printed: the reasoning folded, the answer's tail out."""
        self._fold_thought()
        self._flush_answer()
        self._message_id = None

    # -------------------------------------------------------------- tools and the rest

    def _tool_end(self, event: ToolCallEnd) -> None:
        self._settle()
        call, spec, since = self._calls.pop(event.call.id, (event.call, None, time.monotonic()))
        if self._state is not None:
            self._state.running.pop(event.call.id, None)
            self._state.nested.pop(event.call.id, None)
            self._state.phase = "Waiting for the model"
        width = self.console.width
        label = self._children.label(event.call.id)  # a task: its agent's name
        line = tools.tool_line(call, spec, event.result, time.monotonic() - since, width, label)
        nested, child_folded = self._children.pop(event.call.id, width, self.expand_key)
        body, folded = tools.tool_body(event.result, spec, width)
        if folded:
            whole, _ = tools.tool_body(event.result, spec, width, full=True)
            self._folded.append((line, whole or Text()))
        self._folded += child_folded
        self._print(line, *nested, *([body] if body is not None else []), gap=self._after == "text")
        self._after = "tool"

    def _other(self, event: Event) -> None:
        if isinstance(event, PlanUpdated):
            self._plan_updated(event.todos)
        elif isinstance(event, Notice):
            if event.compaction is None:  # /compact's own report: CompactionFinished says it
                mark, style = _NOTICE.get(event.severity, _NOTICE["info"])
                line = Text(mark, style=style)
                line.append(printable(event.headline), style=style if event.severity != "info" else "")
                detail = Text(printable(event.detail or ""), style=style if event.severity == "error" else "")
                shown = (line, Padding(detail, (0, 0, 0, 2))) if event.detail else (line,)
                self._print(*shown, gap=self._after == "text")  # the detail indented, wrapped lines too
        elif isinstance(event, CompactionStarted):
            if self._state is not None:
                self._state.phase = "Compacting the context"
            self._print(Text("⟳ Compacting the context…", style="dim"))
        elif isinstance(event, CompactionFinished):
            if self._state is not None:
                self._state.phase = "Waiting for the model"
            if event.status == "completed":
                self._print(Text("⟳ Context compacted", style="dim"))
            elif event.status == "cancelled":
                self._print(Text("⟳ Compaction cancelled: the context is unchanged", style="yellow"))
            else:
                line = Text("✗ Compaction failed (the context is unchanged): ", style="red")
                self._print(line.append(printable(event.error or "unknown error")))
        elif isinstance(event, ModeChanged):
            self._print(Text("Mode: ", style="dim").append(printable(event.mode), style="bold"))
        elif isinstance(event, TitleChanged):
            self._print(Text("Session: ", style="dim").append(clip(event.title, 200), style="dim bold"))
        elif isinstance(event, UserMessageAdded):
            from crow.command_catalog import shown_line

            self._print(Text("› ", style="bold cyan").append(printable(shown_line(event.message))))
        self._after = "other"

    def _plan_updated(self, todos: Sequence[Mapping[str, Any]]) -> None:
        plan = [
            (str(t.get("title") or t.get("content") or ""), str(t.get("status") or "pending")) for t in todos
        ]
        if plan == self._plan:
            return
        self._plan = plan
        lines = Text()
        for n, (title, status) in enumerate(plan):
            mark, style = _PLAN.get(status, ("☐", ""))
            lines.append(("\n" if n else "") + mark + " ", style=style)
            # one line per item: a newline in a title would draw an item (`☑ …`) of its own
            lines.append(printable(title).replace("\n", "\\x0a"), style="dim" if style == "green" else "")
        self._print(Text("Plan", style="bold"), lines, gap=self._after == "text")

    # -------------------------------------------------------------- the screen

    def _print(self, *shown: RenderableType, gap: bool = False) -> None:
        if gap:
            shown = (Text(), *shown)
        if self._pauses:
            self._held.extend(shown)
        else:
            self.console.print(Group(*shown))

    def _start_live(self) -> None:
        if self._live is None and self._state is not None and not self._pauses and self.console.is_terminal:
            self._live = _Live(
                LiveView(self._state),
                console=self.console,
                refresh_per_second=FPS,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
                vertical_overflow="crop",
            )
            self._live.start()
            self._logs.take_over()

    def _stop_live(self) -> None:
        live, self._live = self._live, None
        if live is not None:
            self._logs.give_back()
            live.stop()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Nothing live on the screen inside (a question is asked); what the turn prints
        meanwhile shows after. Nested pauses resume at the outermost's end."""
        self._pauses += 1
        self._stop_live()
        try:
            yield
        finally:
            self._pauses -= 1
            if not self._pauses:
                held, self._held = self._held, []
                if held:
                    self.console.print(Group(*held))
                self._start_live()

    def expand(self) -> bool:
        """Print what the last turn folded (its reasoning, whole outputs and diffs); False
        when it folded nothing."""
        if not self._folded:
            return False
        for head, whole in self._folded:
            self._print(head, whole, gap=True)
        return True

    def info(self, text: str) -> None:
        self.console.print(Text(printable(text), style="dim"))

    def error(self, text: str) -> None:
        self.console.print(Text(printable(text), style="red"))


class _Live(Live):
    """rich's `Live`, keeping what failed its refresh thread's write (EIO) for
    `Renderer.emit` to raise in the turn: in that thread it would end unheard. Not how a
    terminal's hangup is noticed: once it hung up, `isatty()` fails, and rich, taking its
    output for a file, stops drawing rather than write (`crow.tui.chat` watches for it)."""

    failure: OSError | None = None

    def refresh(self) -> None:
        try:
            super().refresh()
        except OSError as exc:
            self.failure = exc


def _first_sentence(text: str) -> str:
    """A failure's first sentence, for the turn's one-line summary (its notice has the rest)."""
    import re

    return re.split(r"(?<=[.!?])\s", text.strip(), maxsplit=1)[0].splitlines()[0] if text.strip() else text
