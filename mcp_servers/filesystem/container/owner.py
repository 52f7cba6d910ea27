"""Which crow owns a container, and removing the containers of crows that died.

Each container carries `crow.session`, `crow.host` (this machine's name), `crow.pid` and
`crow.started` (the process's start time in clock ticks since boot, from /proc: a pid
reused by another process after crow died does not keep its containers alive). A crow
killed with SIGKILL cannot remove its containers; the next crow on the same host removes
those whose owner is gone, before it creates its first one. Containers of another host,
or of a crow still running, are never touched; nor are containers without these labels.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import anyio

log = logging.getLogger("crow.container")

SESSION, HOST, PID, STARTED = "crow.session", "crow.host", "crow.pid", "crow.started"


def start_time(pid: int) -> str:
    """The process's start time (field 22 of /proc/PID/stat), "" where there is no /proc,
    None-like "" too when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return ""
    return fields[19].decode() if len(fields) > 19 else ""


def owner_labels(session_id: str) -> dict[str, str]:
    pid = os.getpid()
    return {SESSION: session_id, HOST: socket.gethostname(), PID: str(pid), STARTED: start_time(pid)}


def owner_alive(labels: dict[str, str]) -> bool:
    """Whether the crow named by a container's labels still runs (True when unsure)."""
    try:
        pid = int(labels.get(PID, ""))
    except ValueError:
        return True
    started = labels.get(STARTED, "")
    if started and os.path.isdir("/proc/self"):
        return start_time(pid) == started
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def orphans(containers: list[dict[str, Any]]) -> list[str]:
    """The ids among `containers` (engine listings) that a dead crow on this host left."""
    host = socket.gethostname()
    found = []
    for container in containers:
        labels = container.get("Labels") or {}
        if labels.get(HOST) == host and PID in labels and not owner_alive(labels):
            found.append(container["Id"])
    return found


async def remove_orphans(engine: Any) -> list[str]:
    gone = orphans(await engine.list_containers({SESSION: None}))
    for cid in gone:
        await engine.remove(cid)
    if gone:
        log.info("removed %d container(s) left by crow processes that ended: %s", len(gone), gone)
    return gone


_swept: dict[str, anyio.Event] = {}  # engine host -> done (once per process and engine)


async def sweep_once(engine: Any) -> None:
    """`remove_orphans` once per process and engine; callers meanwhile wait for it. A
    failure (the engine down) is logged and leaves it to the next caller."""
    done = _swept.get(engine.host)
    if done is not None:
        await done.wait()
        return
    done = _swept[engine.host] = anyio.Event()
    try:
        await remove_orphans(engine)
    except Exception as exc:
        del _swept[engine.host]
        log.warning("could not remove containers left by ended crow processes: %s", exc)
    finally:
        done.set()
