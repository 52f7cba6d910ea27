"""A real terminal for tests: a program in its own tmux server (a private socket), typed
into with `send-keys` and read with `capture-pane` (the screen as a person sees it)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest


def need_tmux() -> None:
    """Skip (with the reason) where tmux is missing; CI installs it, so there it fails."""
    if shutil.which("tmux") is None:
        if os.environ.get("CI"):
            raise AssertionError("tmux is not installed (.ci/run installs it)")
        pytest.skip("tmux is not installed")


class Terminal:
    """`cmd` running in a `width`x`height` tmux pane. `exit_status()` is the program's status
    once it ended (the pane stays, so its last screen can still be read)."""

    def __init__(
        self,
        cmd: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        socket: Path,
        width: int = 120,
        height: int = 40,
    ) -> None:
        need_tmux()
        self.socket = str(socket)
        self.env = {**env, "TERM": "xterm-256color"}
        self.env.pop("TMUX", None)
        # The command's env is set inside the pane: tmux's server keeps its own otherwise.
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        line = f"cd {shlex.quote(str(cwd))} && exec env -i {exports} {shlex.join(cmd)}"
        # Set before the program starts: one that ends at once still leaves its pane.
        conf = socket.with_suffix(".conf")
        conf.write_text("set -g remain-on-exit on\nset -g history-limit 10000\nset -g status off\n")
        self._tmux("-f", str(conf), "new-session", "-d", "-x", str(width), "-y", str(height), line)

    def _tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-S", self.socket, *args], env=self.env, capture_output=True, text=True, timeout=10
        )
        if done.returncode != 0:
            raise AssertionError(f"tmux {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def send(self, *keys: str) -> None:
        """tmux key names (`Enter`, `C-c`, `C-d`, `Up`, `Escape`) or literal text (`-l`)."""
        for key in keys:
            if key in KEY_NAMES or key.startswith(("C-", "M-")):
                self._tmux("send-keys", "-t", "0", key)
            else:
                self._tmux("send-keys", "-t", "0", "-l", key)

    def type(self, text: str) -> None:
        """`text` then Enter."""
        self.send(text, "Enter")

    def screen(self, history: bool = True) -> str:
        """What the pane shows (with its scrollback when `history`), trailing blanks cut."""
        args = ["capture-pane", "-p", "-t", "0", "-J"]
        if history:
            args += ["-S", "-"]
        return "\n".join(line.rstrip() for line in self._tmux(*args).splitlines()).rstrip()

    def wait_for(self, what: str | Callable[[str], bool], timeout: float = 15.0) -> str:
        """The screen once `what` appears on it (a text, or a test of the screen)."""
        test = (lambda s: what in s) if isinstance(what, str) else what
        end = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if test(screen):
                return screen
            if time.monotonic() > end:
                raise AssertionError(f"waited {timeout}s for {what!r}; the screen:\n{screen}")
            time.sleep(0.05)

    def exit_status(self) -> int | None:
        """The program's exit status (-N when signal N killed it), None while it runs."""
        fmt = "#{pane_dead}:#{pane_dead_status}:#{pane_dead_signal}"
        dead, status, signal = (self._tmux("list-panes", "-t", "0", "-F", fmt).strip() + "::").split(":")[:3]
        if dead != "1":
            return None
        if status or signal:
            return int(status) if status else -int(signal)
        return self._unreaped_status()

    def _unreaped_status(self) -> int | None:
        """tmux can see the terminal close and then leave the exited program a zombie for
        seconds without its status: read it where Linux keeps it (/proc/PID/stat, field
        52, a wait status). None while the program still runs."""
        try:
            stat = Path(f"/proc/{self.pid()}/stat").read_text()
        except (OSError, ValueError):
            return None
        fields = stat.rsplit(")", 1)[1].split()  # from field 3 (the state) on
        if fields[0] != "Z" or len(fields) < 50:
            return None
        code = int(fields[49])
        return code >> 8 if code & 0x7F == 0 else -(code & 0x7F)

    def wait_exit(self, timeout: float = 10.0) -> int:
        end = time.monotonic() + timeout
        while (status := self.exit_status()) is None:
            if time.monotonic() > end:
                raise AssertionError(f"still running after {timeout}s; the screen:\n{self.screen()}")
            time.sleep(0.05)
        return status

    def pid(self) -> int:
        return int(self._tmux("list-panes", "-t", "0", "-F", "#{pane_pid}").split()[0])

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True, timeout=10)


KEY_NAMES = {
    "Enter",
    "Escape",
    "Up",
    "Down",
    "Left",
    "Right",
    "Tab",
    "BTab",
    "BSpace",
    "Space",
    "Home",
    "End",
}
