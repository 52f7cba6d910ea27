"""The live part of the screen while a turn runs, below what is printed for good: the
reasoning streaming (dimmed), the answer's unfinished block, the calls running, and the
status line (spinner, elapsed time, phase, tokens, cost).

rich's `Live` redraws it from its own thread at a bounded rate (`FPS`), so a fast stream
costs a few renders a second whatever its chunk rate, and the spinner turns while the
model is silent. Its height is bounded (half the terminal) so it can always be erased.
"""

from __future__ import annotations

import io
import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rich.markdown import Markdown
from rich.segment import Segment
from rich.text import Text

from crow.terminal import printable
from crow.tui.blocks import MarkdownBlocks
from crow.tui.text import clip, seconds, usage

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions

FPS = 12
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
TAIL_CHARS = 6000  # of the unfinished block rendered live (all of it is printed once done)
CODE_THEME = "ansi_dark"  # the terminal's own palette: readable on dark and light themes


def markdown(text: str) -> Markdown:
    """The model's Markdown as rich renders it: control characters escaped first, links
    shown with their address (a hidden OSC 8 target could pass for another)."""
    return Markdown(printable(text), code_theme=CODE_THEME, hyperlinks=False)


class Block:
    """A finished Markdown block without the blank lines rich puts around some (a list
    starts with one): the renderer spaces blocks itself."""

    def __init__(self, text: str) -> None:
        self.markdown = markdown(text)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Any]:
        lines = render_markdown(console, self.markdown, options)
        while lines and _blank(lines[0]):
            lines.pop(0)
        while lines and _blank(lines[-1]):
            lines.pop()
        for line in lines:
            yield from line
            yield Segment.line()


def render_markdown(console: Console, md: Markdown, options: ConsoleOptions) -> list[list[Segment]]:
    """`md`'s lines; its plain text should rich's Markdown fail on some input (the answer
    must show whatever the model wrote, and a failure in `Live`'s thread would be lost)."""
    try:
        return console.render_lines(md, options, pad=False)
    except Exception:
        return console.render_lines(Text(md.markup), options, pad=False)


def _blank(line: list[Segment]) -> bool:
    return all(not s.text.strip() and not (s.style and s.style.bgcolor) for s in line)


@dataclass
class TurnState:
    """What the live view shows; the renderer changes it, the view reads it."""

    started: float = field(default_factory=time.monotonic)
    phase: str = "Waiting for the model"
    answer: MarkdownBlocks = field(default_factory=MarkdownBlocks)
    thought: list[str] = field(default_factory=list)  # the reasoning streaming now
    running: dict[str, Text] = field(default_factory=dict)  # call id -> its running line
    nested: dict[str, list[Text]] = field(default_factory=dict)  # a task's call id -> its child's lines
    used: int = 0
    size: int = 0
    cost: float | None = None


class LiveView:
    """The renderable `Live` redraws: cheap when nothing changed (the tail's rendering
    is kept until the tail or the width changes)."""

    def __init__(self, state: TurnState) -> None:
        self.state = state
        self._cache: tuple[str, int, list[list[Segment]]] = ("", 0, [])

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Any]:
        s, width = self.state, options.max_width
        room = max(1, (options.height or console.height) // 2 - 1)
        lines: list[list[Segment]] = []
        if s.thought:
            text = "".join(s.thought)[-TAIL_CHARS:]
            for line in text.strip().splitlines()[-min(3, room) :]:
                lines.append(list(Text(clip(line, width), style="dim italic").render(console)))
        tail = s.answer.tail()
        if tail:
            lines += self._tail(console, options, tail, room)
        calls: list[Text] = []
        for call_id, line in list(s.running.items())[-3:]:
            calls += [line, *s.nested.get(call_id, ())]
        # the last calls first: a task's lines take the room the answer leaves
        for line in calls[-max(min(3, room), room - len(lines)) :]:
            lines.append(list(line.render(console)))
        lines.append(list(self._status(width).render(console)))
        for line in lines:
            yield from line
            yield Segment.line()

    def _tail(self, console: Console, options: ConsoleOptions, tail: str, room: int) -> list[list[Segment]]:
        key, width, rendered = self._cache
        if key != tail or width != options.max_width:
            shown = tail[-TAIL_CHARS:]
            opening = self.state.answer.fence_opening()
            if len(shown) < len(tail) and opening:
                shown = opening + "\n" + shown.partition("\n")[2]
            rendered = render_markdown(console, markdown(shown), options.update(height=None))
            self._cache = (tail, options.max_width, rendered)
        return rendered[-room:]

    def _status(self, width: int) -> Text:
        s = self.state
        took = time.monotonic() - s.started
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(SPINNER[int(took * 10) % len(SPINNER)] + " ", style="cyan")
        line.append(s.phase, style="bold")
        line.append(f" · {seconds(took)}", style="dim")
        if s.used or s.cost is not None:
            line.append(" · " + usage(s.used, s.size, s.cost), style="dim")
        line.truncate(width, overflow="ellipsis")
        return line


class LogsAbove(io.TextIOBase):
    """While the live part is drawn, crow's log lines on stderr print above it through the
    console (a bare write would land inside it and leave a torn status line behind);
    escaped like any untrusted text: a log line may name a hostile file."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._partial = ""
        self._handlers: list[tuple[logging.StreamHandler[Any], Any]] = []

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        if lines:
            self._console.print(Text(printable("\n".join(lines)), style="dim"))
        return len(text)

    def flush(self) -> None:
        if self._partial:
            self.write("\n")

    def take_over(self) -> None:
        """Point the root logger's stderr handlers here (`give_back` undoes it)."""
        for handler in logging.getLogger().handlers:
            if type(handler) is not logging.StreamHandler:  # a NullHandler has no stream
                continue
            stream = handler.stream
            if stream in (sys.stderr, sys.__stderr__) or isinstance(stream, StderrNow):
                self._handlers.append((handler, handler.setStream(self)))

    def give_back(self) -> None:
        self.flush()
        for handler, stream in self._handlers:
            handler.setStream(stream)
        self._handlers.clear()


class StderrNow:
    """`sys.stderr` as it is at each write: under prompt_toolkit's `patch_stdout` (the chat's
    prompt is up), its proxy, which prints above the prompt (`crow.tui.prompt_input`)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()
