"""`crow chat` in a terminal (a pty): spawn -> the input prompt on screen (target < 0.5 s;
the agent warms up in the background, after the prompt), against a bare prompt_toolkit
prompt measured in the same run; and the CPU the waiting chat uses once its warm-up is
over (target 0 %: judged as < 0.5 %, i.e. under 15 ms of CPU in 3 s), and its wake-ups (no
timer should fire: < 1 a second).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pty
import select
import signal
import time
from pathlib import Path

from bench.common import CROW_CMD, PY, Ctx, Figure, agent_env, median, ms, not_measured

G = "chat"
PROMPT = "›".encode()
CURSOR_QUERY = b"\x1b[6n"  # prompt_toolkit asks where the cursor is; a terminal answers
IDLE_SECONDS = 3.0
SETTLED_CPU = 0.005  # seconds of CPU in one second: the warm-up is over
BARE_PROMPT = [PY, "-c", "from prompt_toolkit import prompt; prompt('› ')"]


class Pty:
    """A program on a pseudo-terminal, read as a terminal would (answering its cursor
    position queries)."""

    def __init__(self, cmd: list[str], env: dict[str, str], cwd: Path) -> None:
        self.started = time.perf_counter()
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child
            try:
                os.chdir(cwd)
                os.execve(cmd[0], cmd, {**env, "TERM": "xterm-256color"})
            finally:
                os._exit(127)
        self.seen = b""

    def wait_for(self, what: bytes, timeout: float = 30.0) -> float:
        """Seconds from the spawn until `what` was output."""
        end = time.monotonic() + timeout
        while what not in self.seen:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise RuntimeError(f"no {what!r} within {timeout}s; output: {self.seen[-300:]!r}")
            try:
                data = os.read(self.fd, 65536)
            except OSError as exc:
                raise RuntimeError(f"the program ended; output: {self.seen[-300:]!r}") from exc
            self.seen += data
            if CURSOR_QUERY in data:
                os.write(self.fd, b"\x1b[1;1R")
        return time.perf_counter() - self.started

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self.fd, b"\x04")  # Ctrl-D: the chat exits
        end = time.monotonic() + 10
        while time.monotonic() < end and os.waitpid(self.pid, os.WNOHANG) == (0, 0):
            with contextlib.suppress(OSError):
                if select.select([self.fd], [], [], 0.1)[0]:
                    os.read(self.fd, 65536)
        with contextlib.suppress(ChildProcessError, ProcessLookupError):
            if os.waitpid(self.pid, os.WNOHANG) == (0, 0):
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
        os.close(self.fd)


def cpu_and_wakeups(pid: int) -> tuple[float, int]:
    """CPU seconds used by all of `pid`'s threads, and their context switches."""
    cpu, switches = 0.0, 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            cpu += int((task / "schedstat").read_text().split()[0]) / 1e9
            for line in (task / "status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    switches += int(line.split()[1])
    return cpu, switches


def _start(cmd: list[str], env: dict[str, str], cwd: Path) -> float:
    term = Pty(cmd, env, cwd)
    try:
        return term.wait_for(PROMPT)
    finally:
        term.close()


def _idle(env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(CPU share, wake-ups a second) of a chat waiting at its prompt, warm-up over."""
    term = Pty(CROW_CMD, env, cwd)
    try:
        term.wait_for(PROMPT)
        end = time.monotonic() + 30
        before, _ = cpu_and_wakeups(term.pid)
        while time.monotonic() < end:  # the warm-up is over once a second costs ~no CPU
            time.sleep(1.0)
            now, _ = cpu_and_wakeups(term.pid)
            if now - before < SETTLED_CPU:
                break
            before = now
        cpu0, woke0 = cpu_and_wakeups(term.pid)
        time.sleep(IDLE_SECONDS)
        cpu1, woke1 = cpu_and_wakeups(term.pid)
        return (cpu1 - cpu0) / IDLE_SECONDS, (woke1 - woke0) / IDLE_SECONDS
    finally:
        term.close()


async def run(ctx: Ctx) -> list[Figure]:
    home, ws = ctx.home("home"), ctx.home("ws")
    env = agent_env(
        home, CROW_MODEL="openai:scripted", OPENAI_BASE_URL="http://127.0.0.1:9", OPENAI_API_KEY="x"
    )
    try:
        await asyncio.to_thread(_start, CROW_CMD, env, ws)  # warm the page cache, .pyc files
    except Exception as exc:
        return [not_measured(G, "spawn -> input prompt", f"crow chat failed to start: {exc}", "< 500 ms")]
    await asyncio.to_thread(_start, BARE_PROMPT, env, ws)
    n = ctx.reps(10, 3)
    crow: list[float] = []
    bare: list[float] = []
    for i in range(n):  # interleaved, alternating who goes first
        pair = [(CROW_CMD, crow), (BARE_PROMPT, bare)]
        for cmd, sink in pair if i % 2 else pair[::-1]:
            sink.append(await asyncio.to_thread(_start, cmd, env, ws))
    idle = [await asyncio.to_thread(_idle, env, ws) for _ in range(ctx.reps(3, 1))]
    share = median([cpu for cpu, _ in idle]) * 100
    return [
        Figure(G, "spawn -> input prompt (crow chat)", ms(median(crow)), baseline=ms(median(bare)),
               baseline_name="bare prompt_toolkit prompt", target="< 500 ms", check=("value", "<", 500),
               samples=n),
        Figure(G, f"CPU while waiting for input ({IDLE_SECONDS:.0f} s, warm-up over)", share, unit="%",
               target="0 % (< 0.5 %)", check=("value", "<", 0.5), samples=len(idle)),
        Figure(G, "wake-ups while waiting for input", median([w for _, w in idle]), unit="/s",
               target="< 1 /s (no timers)", check=("value", "<", 1),
               note="context switches of all its threads; prompt_toolkit's size polling alone is 2 /s",
               samples=len(idle)),
    ]  # fmt: skip
