"""Run one shell command in its own process group, with a timeout and an output cap.

The command runs as ``<shell> -c COMMAND`` with ``start_new_session=True``, so it
leads a fresh process group. Whatever ends the run (normal exit, timeout, or the
caller's cancellation) the whole group gets SIGTERM, then SIGKILL after a short
grace, and the direct child is always reaped: no orphaned grandchildren, no
zombies. Background jobs (``server &``) therefore do not outlive the call. If this
process dies without cleaning up (SIGKILL, the OOM killer), a watchdog shell kills the
groups of the commands that were still running (see ``_Reaper``).

stdout and stderr arrive merged through one pipe. At most ``OUTPUT_CAP`` bytes are
kept: the first half and the last half, with a marker saying how much was dropped.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

import anyio
from anyio.abc import ByteReceiveStream, Process

OUTPUT_CAP = 100_000
KILL_GRACE = 2.0  # seconds between SIGTERM and SIGKILL
CANCEL_GRACE = 0.1  # the same after a cancel, which must answer within 200 ms
DRAIN_AFTER_EXIT = 0.3  # seconds to keep reading once the shell has exited


@dataclass(frozen=True, slots=True)
class ExecResult:
    """What a command produced. ``exit_code`` is None when it was killed on timeout."""

    output: str
    exit_code: int | None
    timed_out: bool = False
    truncated: bool = False
    terminal_id: str | None = None  # set when the command ran in an editor terminal


def default_shell() -> str:
    return shutil.which("bash") or "/bin/sh"


class _CappedBuffer:
    """Keeps the head and tail of a byte stream, counting what fell in between."""

    def __init__(self, cap: int) -> None:
        self.half = cap // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self.tail += chunk
        excess = len(self.tail) - self.half
        if excess > 0:
            del self.tail[:excess]
            self.dropped += excess

    def text(self) -> str:
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        if not self.dropped:
            return head + tail
        return f"{head}\n\n... [{self.dropped} bytes of output omitted] ...\n\n{tail}"


def _signal_group(pgid: int, sig: int) -> bool:
    """Signal the group; False once nobody is left in it."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _group_alive(pgid: int) -> bool:
    """Is any member still running? Zombies do not count: they are dead, only unreaped
    (orphans are reaped by init, which in containers may take its time)."""
    if not os.path.isdir("/proc/self"):
        return _signal_group(pgid, 0)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        # After the command name: state, ppid, pgrp.
        if int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


async def _kill_group(process: Process, pgid: int, grace: float = 2.0) -> None:
    """SIGTERM the group, SIGKILL it after a grace, and reap the direct child."""
    if _signal_group(pgid, signal.SIGTERM):
        with anyio.move_on_after(grace):
            while _group_alive(pgid):
                # Reap the leader as soon as it dies so it does not sit as a zombie
                # (a zombie keeps the group "alive" to kill(0)).
                if process.returncode is None:
                    with anyio.move_on_after(0.05):
                        await process.wait()
                else:
                    await anyio.sleep(0.05)
        _signal_group(pgid, signal.SIGKILL)
    await process.wait()


# Reads "+PGID" / "-PGID" lines; at end of input, kills the groups still listed.
_REAPER_SCRIPT = """
live=" "
while IFS= read -r line; do
  case "$line" in
    +*) live="$live${line#+} " ;;
    -*) g=${line#-}; case "$live" in *" $g "*) live="${live%% $g *} ${live#* $g }" ;; esac ;;
  esac
done
for g in $live; do kill -s KILL -- "-$g" 2>/dev/null; done
"""


class _Reaper:
    """A shell in its own session reading the groups of running commands from a pipe
    whose write end only this process holds. However this process ends, the kernel
    closes that end, and the shell kills the groups still listed: commands never outlive
    a crow that was SIGKILLed mid-call. Started at the first command."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._fd = -1
        self._live: set[int] = set()  # told again to a restarted watchdog

    def _start(self) -> None:
        read_fd, self._fd = os.pipe()  # not inheritable: commands never hold the write end
        try:
            self._proc = subprocess.Popen(
                ["/bin/sh", "-c", _REAPER_SCRIPT],
                stdin=read_fd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # outlives a kill of this process's group
            )
        finally:
            os.close(read_fd)
        atexit.register(self._close)

    def _close(self) -> None:
        """At a normal exit: end of input lets the watchdog finish; reap it."""
        proc, self._proc = self._proc, None
        if proc is not None:
            os.close(self._fd)
            self._fd = -1
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)

    def _send(self, line: str) -> None:
        try:
            if self._proc is None or self._proc.poll() is not None:
                if self._fd >= 0:
                    os.close(self._fd)
                self._start()
                line = "".join(f"+{g}\n" for g in self._live)  # the whole current list
            if line:
                os.write(self._fd, line.encode())
        except OSError:  # no /bin/sh, or out of processes: the command still runs
            pass

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def watch(self, pgid: int) -> None:
        self._live.add(pgid)
        self._send(f"+{pgid}\n")

    def forget(self, pgid: int) -> None:
        self._live.discard(pgid)
        self._send(f"-{pgid}\n")


_reaper = _Reaper()


async def _pump(stream: ByteReceiveStream, buf: _CappedBuffer, eof: anyio.Event) -> None:
    try:
        async for chunk in stream:
            buf.feed(chunk)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        pass
    finally:
        eof.set()


async def run_command(
    argv: list[str],
    cwd: str | os.PathLike[str],
    timeout: float,
    cap: int = OUTPUT_CAP,
    env: Mapping[str, str] | None = None,
) -> ExecResult:
    """Run ``argv`` in ``cwd`` with ``env`` (None: this process's environment); see the
    module docstring for the guarantees."""
    buf = _CappedBuffer(cap)
    # Shielded: a cancel landing mid-spawn would otherwise kill only the shell and orphan
    # whatever it had started; once we hold the process, the finally below kills the group.
    with anyio.CancelScope(shield=True):
        process = await anyio.open_process(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=None if env is None else dict(env),
            start_new_session=True,
        )
    pgid = process.pid  # the session leader's pid is the group id
    _reaper.watch(pgid)
    timed_out = False
    cancelled = False
    eof = anyio.Event()
    assert process.stdout is not None
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_pump, process.stdout, buf, eof)
            with anyio.move_on_after(timeout) as scope:
                await process.wait()
            if scope.cancelled_caught:
                timed_out = True
            else:
                # Background jobs may still hold the pipe open: read what is there, then stop.
                with anyio.move_on_after(DRAIN_AFTER_EXIT):
                    await eof.wait()
            tg.cancel_scope.cancel()
    except anyio.get_cancelled_exc_class():
        cancelled = True
        raise
    finally:
        # Runs on timeout, normal exit (stray background jobs) and cancellation alike. A
        # cancel must answer fast: no grace for a command that ignores SIGTERM.
        with anyio.CancelScope(shield=True):
            await _kill_group(process, pgid, grace=CANCEL_GRACE if cancelled else KILL_GRACE)
            _reaper.forget(pgid)
            await process.aclose()
    exit_code = None if timed_out else process.returncode
    return ExecResult(output=buf.text(), exit_code=exit_code, timed_out=timed_out, truncated=buf.dropped > 0)
