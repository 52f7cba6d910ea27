"""The pickers `crow chat` asks its questions with (prompt_toolkit): a list to choose one
option or several from, and a line of text. Each is a small application drawn below the
screen's last line (not full screen) and run in the session's event loop; it erases itself
when answered, the caller prints the answer.

Every text shown here is a plain fragment (no HTML or ANSI parsing), passed through
`crow.terminal.printable`: a question or an option cannot draw options of its own, hide
the command it asks about, or move the cursor."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from prompt_toolkit import PromptSession
from prompt_toolkit.application import Application
from prompt_toolkit.application.current import get_app_session
from prompt_toolkit.document import Document
from prompt_toolkit.formatted_text import FormattedText, StyleAndTextTuples
from prompt_toolkit.input.typeahead import clear_typeahead
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.layout import HSplit, Layout, Window
from prompt_toolkit.layout.controls import FormattedTextControl
from prompt_toolkit.shortcuts import print_formatted_text
from prompt_toolkit.validation import ValidationError, Validator

from crow.terminal import printable

HINT = "fg:ansibrightblack"


@dataclass(frozen=True, slots=True)
class Option:
    value: str
    label: str  # the model's text too, sometimes: shown through `printable`
    key: str | None = None  # one key that picks it at once


@dataclass(frozen=True, slots=True)
class Picked:
    """How a picker ended: "accept" (`value`: the option's value, a list of them, or the
    text), "escape" (Esc: the user declined) or "interrupt" (Ctrl-C)."""

    action: Literal["accept", "escape", "interrupt"]
    value: Any = None


def show(lines: Sequence[tuple[str, str]]) -> None:
    """Print (style, text) lines above the picker; the text goes through `printable`."""
    fragments: StyleAndTextTuples = []
    for style, text in lines:
        fragments += [(style, printable(text)), ("", "\n")]
    print_formatted_text(FormattedText(fragments), end="")


def one_line(text: str) -> str:
    """`text` as one line of a picker: a newline in an option would draw an option of its own."""
    return printable(text).replace("\n", "\\x0a")


def discard_typed_ahead() -> None:
    """Forget what was typed before the question appeared: it was meant for something else
    (the next prompt), not as this answer. Both the terminal's queue and what an earlier
    prompt_toolkit application read but left unused go."""
    clear_typeahead(get_app_session().input)
    try:
        fd = sys.stdin.fileno()
    except (OSError, ValueError):
        return
    if os.isatty(fd):
        import termios

        termios.tcflush(fd, termios.TCIFLUSH)


async def pick(title: str, options: Sequence[Option], *, many: bool = False, hint: str = "") -> Picked:
    """One of `options` (Enter, its number, its key), or several (`many`: Space toggles,
    Enter accepts the ticked ones)."""
    at = 0
    ticked: set[int] = set()
    bindings = KeyBindings()

    def done(event: KeyPressEvent, picked: Picked) -> None:
        event.app.exit(result=picked)

    def accept(event: KeyPressEvent, index: int) -> None:
        if many:
            done(event, Picked("accept", [o.value for n, o in enumerate(options) if n in ticked]))
        else:
            done(event, Picked("accept", options[index].value))

    def move(step: int) -> Callable[[KeyPressEvent], None]:
        def handler(event: KeyPressEvent) -> None:
            nonlocal at
            at = (at + step) % len(options)

        return handler

    for key in ("up", "c-p", "s-tab"):
        bindings.add(key)(move(-1))
    for key in ("down", "c-n", "tab"):
        bindings.add(key)(move(1))
    bindings.add("enter")(lambda event: accept(event, at))
    bindings.add("escape", eager=True)(lambda event: done(event, Picked("escape")))
    bindings.add("c-c")(lambda event: done(event, Picked("interrupt")))

    def toggle(index: int) -> None:
        nonlocal at
        at = index
        ticked.symmetric_difference_update({index})

    if many:
        bindings.add(" ")(lambda event: toggle(at))
    for index, option in enumerate(options[:9]):

        def by_number(event: KeyPressEvent, index: int = index) -> None:
            toggle(index) if many else accept(event, index)

        bindings.add(str(index + 1))(by_number)
        if option.key and not many:
            bindings.add(option.key)(lambda event, index=index: accept(event, index))

    def fragments() -> StyleAndTextTuples:
        out: StyleAndTextTuples = [("bold", one_line(title)), ("", "\n")] if title else []
        for n, option in enumerate(options):
            here = n == at
            box = ("[x] " if n in ticked else "[ ] ") if many else ""
            if here:
                out.append(("[SetCursorPosition]", ""))
            out.append(("bold fg:ansicyan" if here else "", f"{'❯' if here else ' '} {n + 1}. {box}"))
            out.append(("bold" if here else "", one_line(option.label)))
            if option.key and not many:
                out.append((HINT, f"  ({option.key})"))
            out.append(("", "\n"))
        out.append((HINT, hint or _hint(many)))
        return out

    control = FormattedTextControl(fragments, focusable=True, show_cursor=False, key_bindings=bindings)
    app: Application[Picked] = Application(
        layout=Layout(HSplit([Window(control, wrap_lines=True, dont_extend_height=True)])),
        full_screen=False,
        erase_when_done=True,
    )
    discard_typed_ahead()
    try:
        # Not prompt_toolkit's SIGINT handler: it would replace (and then remove) the chat's own.
        return await app.run_async(handle_sigint=False)
    except EOFError:  # the terminal's input closed: nobody left to answer
        return Picked("escape")


async def line(title: str, *, check: Callable[[str], str | None] | None = None) -> Picked:
    """A line of text; `check` says what is wrong with an answer (None: nothing)."""
    bindings = KeyBindings()

    @bindings.add("escape", eager=True)
    def _(event: KeyPressEvent) -> None:
        event.app.exit(exception=_Escaped())

    session: PromptSession[str] = PromptSession(erase_when_done=True)
    message = FormattedText([("bold", one_line(title)), (HINT, "  (Esc to decline)"), ("", "\n› ")])
    discard_typed_ahead()
    try:
        text = await session.prompt_async(
            message, key_bindings=bindings, validator=_Check(check) if check else None, handle_sigint=False
        )
    except KeyboardInterrupt:
        return Picked("interrupt")
    except (_Escaped, EOFError):
        return Picked("escape")
    return Picked("accept", text)


class _Escaped(Exception):
    pass


class _Check(Validator):
    def __init__(self, check: Callable[[str], str | None]) -> None:
        self.check = check

    def validate(self, document: Document) -> None:
        if (wrong := self.check(document.text)) is not None:
            raise ValidationError(message=wrong)


def _hint(many: bool) -> str:
    if many:
        return "↑↓ move · Space tick · Enter accept · Esc decline · Ctrl-C cancel the turn"
    return "↑↓ move · Enter choose · Esc cancel · Ctrl-C cancel the turn"
