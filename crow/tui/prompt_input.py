"""The chat's input line (prompt_toolkit): multi-line editing, a private history file,
slash-command completion, and the keys a chat needs (Ctrl-C clears / asks to exit, Ctrl-O
expands the last turn).

Keys: Enter sends; Alt-Enter (Esc Enter) and Ctrl-J insert a new line, as does Enter after
a line ending in a backslash; Ctrl-C clears the line, and at an empty line shows a hint,
then exits when pressed again; Ctrl-D at an empty line exits; Tab completes a `/command`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import termios
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from prompt_toolkit import PromptSession
from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.formatted_text import HTML
from prompt_toolkit.history import FileHistory, History, InMemoryHistory, ThreadedHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.styles import Style

from crow.private import DIR_MODE, FILE_MODE, tighten
from crow.terminal import printable
from crow.tui.live import StderrNow

log = logging.getLogger("crow.chat")
HISTORY_FILE = "prompt_history"  # in CROW_HOME: the prompts typed in `crow chat`, 0600
EXIT_HINT = "Press Ctrl-C again to exit (or Ctrl-D)"
DESCRIPTION_WIDTH = 70  # a completion's description, cut to one short line

# (name without the slash, description) of every command the chat offers now.
CommandList = Callable[[], Iterable[tuple[str, str]]]


class PrivateHistory(FileHistory):
    """prompt_toolkit's history file, created 0600 (prompts hold pasted secrets) in a 0700
    folder; an existing looser file is tightened."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        tighten(path, FILE_MODE)
        super().__init__(path)

    def load_history_strings(self) -> Iterable[str]:
        try:
            return list(super().load_history_strings())
        except OSError as exc:  # unreadable: the chat starts with no history
            log.warning("cannot read the prompt history %s: %s", self.filename, exc)
            return []

    def store_string(self, string: str) -> None:
        # FileHistory's format: a comment line, then each line of the entry after a "+"
        entry = "\n#\n" + "".join(f"+{line}\n" for line in string.split("\n"))
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
        try:
            with os.fdopen(os.open(self.filename, flags, FILE_MODE), "ab") as f:
                f.write(entry.encode("utf-8", errors="replace"))  # one write: O_APPEND keeps it whole
        except OSError as exc:  # a full disk, a read-only home: the prompt is still sent
            log.warning("cannot keep the prompt in %s: %s", self.filename, exc)


def _history(path: Path) -> History:
    """The history file, read in a thread (off the start-up path); in memory only when
    the file cannot be had."""
    try:
        return ThreadedHistory(PrivateHistory(path))
    except OSError as exc:
        log.warning("prompt history is not kept: %s", exc)
        return InMemoryHistory()


class SlashCompleter(Completer):
    """`/name` completions (with descriptions) while the first word is being typed."""

    def __init__(self, commands: CommandList) -> None:
        self.commands = commands

    def get_completions(self, document: Document, complete_event: CompleteEvent) -> Iterator[Completion]:
        typed = document.text_before_cursor
        if not typed.startswith("/") or any(c.isspace() for c in typed):
            return
        for name, description in self.commands():
            if name.startswith(typed[1:]):
                line = printable(" ".join(description.split()))
                if len(line) > DESCRIPTION_WIDTH:
                    line = line[: DESCRIPTION_WIDTH - 1] + "…"
                yield Completion(
                    f"/{name}", start_position=-len(typed), display=printable(f"/{name}"), display_meta=line
                )


class ChatInput:
    """The chat's `PromptSession`. `read()` returns the text sent, or None when the user
    asked to leave (Ctrl-D, or Ctrl-C twice at an empty line)."""

    def __init__(self, home: Path, commands: CommandList, expand: Callable[[], None]) -> None:
        self._armed = False  # Ctrl-C was pressed at an empty line: the next one exits
        self.session: PromptSession[str] = PromptSession(
            history=_history(home / HISTORY_FILE),
            completer=SlashCompleter(commands),
            complete_while_typing=True,
            key_bindings=self._keys(expand),
            prompt_continuation=lambda width, line, wrap: " " * width,
            bottom_toolbar=None,
            style=Style.from_dict({"bottom-toolbar": "noreverse fg:ansiyellow"}),
        )
        # Idle means idle: prompt_toolkit polls the terminal's size every 0.5 s by default,
        # for where SIGWINCH cannot reach it (Windows, a thread); here it can.
        self.session.app.terminal_size_polling_interval = None
        self.session.default_buffer.on_text_changed += lambda _: self._disarm()

    async def read(self, *, armed: bool = False) -> str | None:
        """The next prompt; `armed`: one Ctrl-C already asked to leave (the hint is shown,
        one more exits)."""
        from prompt_toolkit.patch_stdout import patch_stdout

        self._disarm()
        if armed:
            self._arm()
        try:
            # Whatever else writes while the prompt is up (a log line of the warm-up) is
            # printed above it, not into it.
            with patch_stdout(raw=True):
                # SIGINT stays crow's (`interrupt`): a Ctrl-C key is a key here, in raw mode.
                return await self.session.prompt_async(HTML("<b>›</b> "), handle_sigint=False)
        except EOFError:
            return None

    def commands_changed(self) -> None:
        """The session's commands changed: while a `/command` is being typed, its
        completions are made again."""
        buffer = self.session.default_buffer
        typed = buffer.document.text_before_cursor
        if self.session.app.is_running and typed.startswith("/") and not any(c.isspace() for c in typed):
            buffer.start_completion(select_first=False)

    def interrupt(self) -> bool:
        """A SIGINT arrived (not the key): handled as Ctrl-C when the prompt is up."""
        app = self.session.app
        if not app.is_running:
            return False
        app.key_processor.send_sigint()
        return True

    def _arm(self) -> None:
        self._armed = True
        self.session.bottom_toolbar = EXIT_HINT

    def _disarm(self) -> None:
        if self._armed:
            self._armed = False
            self.session.bottom_toolbar = None

    def _keys(self, expand: Callable[[], None]) -> KeyBindings:
        kb = KeyBindings()

        @kb.add("enter")
        def _send(event: KeyPressEvent) -> None:
            buffer = event.current_buffer
            state = buffer.complete_state
            if state is not None and state.current_completion is not None:
                buffer.apply_completion(state.current_completion)  # the chosen /command is sent
            if buffer.document.is_cursor_at_the_end and buffer.text.endswith("\\"):
                buffer.delete_before_cursor()  # a trailing backslash continues the prompt
                buffer.insert_text("\n")
                return
            buffer.validate_and_handle()

        @kb.add("escape", "enter")
        @kb.add("c-j")
        def _newline(event: KeyPressEvent) -> None:
            event.current_buffer.insert_text("\n")

        @kb.add("c-c")
        @kb.add("<sigint>")
        def _interrupt(event: KeyPressEvent) -> None:
            buffer = event.current_buffer
            if buffer.text:
                buffer.reset()
            elif self._armed:
                event.app.exit(exception=EOFError())
            else:
                self._arm()

        @kb.add("c-o")
        def _expand(event: KeyPressEvent) -> None:
            from prompt_toolkit.application import run_in_terminal

            run_in_terminal(expand)

        return kb


def logs_through_sys_stderr() -> None:
    """The log handler writing to the terminal's stderr writes to `sys.stderr` as it is at
    each line (it kept the stream it was given), so that lines logged while the prompt is
    up land above it."""
    for handler in logging.getLogger().handlers:
        if type(handler) is logging.StreamHandler and handler.stream is sys.__stderr__:
            handler.setStream(StderrNow())  # type: ignore[arg-type]


@contextlib.contextmanager
def keys_unechoed(fd: int = 0) -> Iterator[None]:
    """While a turn runs: keys typed are not echoed over the answer, and are discarded at
    its end (a key meant for the output must not become the next prompt, or answer a
    question unseen). Ctrl-C still interrupts (ISIG stays on)."""
    try:
        saved: list[Any] = termios.tcgetattr(fd)
    except (termios.error, OSError):  # not a terminal
        yield
        return
    quiet = list(saved)
    quiet[3] &= ~(termios.ECHO | termios.ECHONL)
    with contextlib.suppress(termios.error, OSError):
        termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        with contextlib.suppress(termios.error, OSError):  # a closed terminal
            termios.tcsetattr(fd, termios.TCSAFLUSH, saved)  # FLUSH: typed-ahead keys dropped
