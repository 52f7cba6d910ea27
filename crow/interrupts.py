"""Ctrl-C while crow starts. Until a command handles it, SIGINT ends crow at once with
status 130: raised as KeyboardInterrupt it could land anywhere in crow's imports, where it
is printed instead of leaving quietly (inside importlib's callbacks: "Exception ignored in
... _get_module_lock"; in pydantic_core's start-up: a Rust panic). Nothing is lost: a start
has no turn to save, and the store's writes survive a crash. Only `os` and `signal` here:
the console script installs it before anything heavier is imported (crow/__main__.py).
"""

from __future__ import annotations

import os
import signal


def quit_on_interrupt() -> object:
    """SIGINT quits (status 130) from now; returns the handler it replaced (None outside
    the main thread, where a handler cannot be set and nothing changes)."""
    try:
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # inherited (`crow serve &` in a
            return None  # script): ignored it stays, as a program started so expects
        return signal.signal(signal.SIGINT, _quit)
    except ValueError:  # not the main thread
        return None


def interrupts_raise() -> None:
    """The command handles Ctrl-C from here (as KeyboardInterrupt, or asyncio.run's own)."""
    if signal.getsignal(signal.SIGINT) is _quit:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def give_back(replaced: object) -> None:
    """`cli.main` is done: a caller that ran it in-process gets its SIGINT handler back
    (whichever the command left: ours, asyncio's default, the chat's)."""
    if replaced is not None:
        try:
            signal.signal(signal.SIGINT, replaced)  # type: ignore[arg-type]
        except ValueError:  # not the main thread
            pass


def _quit(signum: int, frame: object) -> None:
    os._exit(130)
