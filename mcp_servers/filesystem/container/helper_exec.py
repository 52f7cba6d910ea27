"""Commands in the container: the helper's `run` and `cancel` ops (see helper.py, whose
`source()` sends this file's text after its own).

A command is `bash -c` (else `sh -c`) in its own session, so it leads a process group;
whatever ends it (its exit, the timeout, a `cancel`) the whole group gets SIGTERM, then
SIGKILL after a grace (execute.py's KILL_GRACE, CANCEL_GRACE after a cancel), so
background jobs never outlive the call. Output is stdout and stderr merged, kept by
execute.py's own `_CappedBuffer` (head and tail, the same marker). The environment is the
helper's own (the image's) plus the variables the host gives, never crow's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # in the container these come from the tail `helper.source()` appends
    from mcp_servers.filesystem.execute import (
        CANCEL_GRACE,
        DRAIN_AFTER_EXIT,
        KILL_GRACE,
        OUTPUT_CAP,
        _CappedBuffer,
        _group_alive,
        _signal_group,
    )

JOBS: dict[int, Any] = {}  # running commands by request id
SEARCHES: dict[int, Any] = {}  # running greps by request id: (stop, done) events
JOBS_LOCK = threading.Lock()  # held from a spawn until its listing, and by the helper's end


def _shell() -> str:
    for folder in ("/bin", "/usr/bin", *os.environ.get("PATH", "").split(":")):
        if folder and os.access(os.path.join(folder, "bash"), os.X_OK):
            return os.path.join(folder, "bash")
    return "/bin/sh"


SHELL = _shell()


class _Job:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.cancelled = proc, False


def _kill_group(pgid: int, grace: float) -> None:
    """execute._kill_group's sequence: TERM the group, KILL it after `grace`, and return
    once nobody in it runs (or a second has passed)."""
    if _signal_group(pgid, signal.SIGTERM):
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.01)
        _signal_group(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.005)


def _pump(fd: int, buf: _CappedBuffer) -> None:
    try:
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            buf.feed(chunk)
    except OSError:
        return


def op_run(req: dict) -> dict:
    env = dict(os.environ)
    env.update(req.get("env") or {})
    with JOBS_LOCK:  # a command is either listed before the helper ends, or never started
        proc = subprocess.Popen(
            [SHELL, "-c", req["command"]], cwd=req["cwd"], env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        job = JOBS[req["id"]] = _Job(proc)
    buf = _CappedBuffer(OUTPUT_CAP)
    assert proc.stdout is not None
    reader = threading.Thread(target=_pump, args=(proc.stdout.fileno(), buf), daemon=True)
    reader.start()
    timed_out = False
    try:
        try:
            proc.wait(req["timeout"])
        except subprocess.TimeoutExpired:
            timed_out = True
        if not timed_out and not job.cancelled:
            reader.join(DRAIN_AFTER_EXIT)  # background jobs may hold the pipe: read what is there
        # Stray background jobs, a timeout or a cancel: the whole group goes.
        _kill_group(proc.pid, CANCEL_GRACE if job.cancelled else KILL_GRACE)
        proc.wait()
        reader.join(1.0)  # a process that left the group may hold the pipe: do not wait for it
    finally:
        JOBS.pop(req["id"], None)
    return {
        "output": buf.text(),
        "exit_code": None if timed_out or job.cancelled else proc.returncode,
        "timed_out": timed_out,
        "truncated": buf.dropped > 0,
    }


def op_cancel(req: dict) -> dict:
    """Kill a running command's group, or stop a grep; answered once nobody in the group
    runs (or the grep has stopped, within a second)."""
    job = JOBS.get(req["target"])
    if job is not None:
        job.cancelled = True
        _kill_group(job.proc.pid, CANCEL_GRACE)
    search = SEARCHES.get(req["target"])
    if search is not None:
        stop, done = search
        stop.set()
        done.wait(1.0)
    return {"cancelled": job is not None or search is not None}


def end_commands() -> None:
    """At the helper's end: every command it started is dead before it exits (and no new
    one starts: the lock stays held)."""
    JOBS_LOCK.acquire()
    for job in list(JOBS.values()):
        _kill_group(job.proc.pid, 0)
