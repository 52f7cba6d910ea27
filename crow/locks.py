"""Who holds a session: process tokens and liveness for the store's session locks.

A session runs turns in one crow process at a time; the store keeps the holder's token in
`session_locks`. A token names one store in one process:

    boot id | PID namespace | pid | process start time | nonce

A lock whose holder is gone is taken over. On the same kernel and PID namespace the answer
is exact: the pid must still run with the same start time (a SIGKILLed holder, or a reused
pid, is gone; a zombie too). Elsewhere (another PID namespace, no /proc) the holder's
heartbeat decides: a lock not refreshed for `LEASE` seconds is stale. A different boot id
means the machine restarted since: stale. SQLite's WAL mode works only between processes of
one machine, so every holder is on this kernel.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

LEASE = 60.0  # seconds without a heartbeat after which a holder we cannot see is gone
BEAT = LEASE / 3  # how often a holder refreshes its heartbeat


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks after boot), or None when it is not running."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat.rsplit(b")", 1)[1].split()  # the command name may hold spaces and ")"
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):  # a zombie holds nothing
        return None
    return fields[19].decode()


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def process_token() -> str:
    """A new token for this process (one per store: two stores of one process exclude each
    other too)."""
    pid = os.getpid()
    boot = _read("/proc/sys/kernel/random/boot_id")
    return "|".join((boot, _pid_namespace(), str(pid), start_time(pid) or "", uuid.uuid4().hex[:12]))


def holder_alive(token: str, heartbeat: float, now: float, mine: str) -> bool:
    """Whether the holder named by `token` may still be running (`mine` is our token)."""
    parts, ours = token.split("|"), mine.split("|")
    if len(parts) == 5:
        boot, namespace, pid, started, _ = parts
        if boot and ours[0] and boot != ours[0]:
            return False  # the machine restarted since the lock was taken
        if boot and namespace and (boot, namespace) == (ours[0], ours[1]) and pid.isdigit():
            return start_time(int(pid)) == started
    return now - heartbeat < LEASE
