"""Run a command with stdout on a pseudo-terminal (stdin closed to /dev/null): what a
program writes when it believes a person reads it, without a tmux server."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import termios
from pathlib import Path


def stdout_on_pty(
    argv: list[str], *, env: dict[str, str], cwd: Path | None = None, columns: int = 200, timeout: float = 60
) -> tuple[int, bytes]:
    """(exit status, everything written to the terminal), `columns` wide."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 30, columns, 0, 0))
    proc = subprocess.Popen(
        argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.DEVNULL
    )
    os.close(follower)
    out = b""
    try:
        while chunk := os.read(leader, 4096):
            out += chunk
    except OSError:  # EIO: the writer is gone
        pass
    finally:
        os.close(leader)
    return proc.wait(timeout=timeout), out
