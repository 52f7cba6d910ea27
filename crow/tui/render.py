"""The loop's events as a terminal shows them (rich). One `Renderer` per front end; it is
the turn's `emit` sink.

The interface (what `crow.tui.chat` and `crow.cli_run` call):
- `await renderer.emit(event)`: show one event;
- `start_turn()` / `end_turn(result, cancelled=...)`: the live status line's life;
- `with renderer.paused():` nothing live on screen while the terminal asks a question;
- `expand()`: print what the last turn folded (reasoning, whole tool outputs);
- `info(text)` / `error(text)`: the front end's own lines.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from rich.console import Console

from crow.events import Event, Notice, TextDelta, ThoughtDelta, ToolCallEnd, ToolCallStart
from crow.terminal import printable

if TYPE_CHECKING:
    from crow.loop import TurnResult


class Renderer:
    def __init__(self, console: Console | None = None, *, cwd: str = ".") -> None:
        self.console = console or Console(highlight=False)
        self.cwd = cwd
        self._in_text = False

    async def emit(self, event: Event) -> None:
        out = self.console
        if isinstance(event, TextDelta):
            out.file.write(printable(event.text))
            out.file.flush()
            self._in_text = True
            return
        if self._in_text:
            out.file.write("\n")
            self._in_text = False
        if isinstance(event, ThoughtDelta):
            out.print(printable(event.text), style="dim", end="")
        elif isinstance(event, ToolCallStart):
            out.print(f"→ {printable(event.call.name)}", markup=False)
        elif isinstance(event, ToolCallEnd):
            out.print(("✗ " if event.result.is_error else "✓ ") + printable(event.call.name), markup=False)
        elif isinstance(event, Notice):
            out.print(printable(event.full_text), style="yellow", markup=False)

    def start_turn(self) -> None:
        self._in_text = False

    def end_turn(self, result: TurnResult | None, *, cancelled: bool = False) -> None:
        if self._in_text:
            self.console.file.write("\n")
            self._in_text = False
        if cancelled:
            self.error("Cancelled.")

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        yield

    def expand(self) -> bool:
        return False

    def info(self, text: str) -> None:
        self.console.print(printable(text), style="dim", markup=False)

    def error(self, text: str) -> None:
        self.console.print(printable(text), style="red", markup=False)
