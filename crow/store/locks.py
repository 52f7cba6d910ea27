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

The functions below run inside the store's write transactions (`crow.store` owns the
connection); `generation` counts lock changes, so a process taking the lock knows whether
another one wrote since it last read the session.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from crow.errors import SessionBusy

log = logging.getLogger("crow.store")

# Created when missing (not a schema version): an older crow ignores it and still opens the file.
TABLE = """
CREATE TABLE IF NOT EXISTS session_locks (
  session_id TEXT PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE, owner TEXT,
  pid INTEGER, heartbeat REAL NOT NULL DEFAULT 0, generation INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID
"""
LEASE = 60.0  # seconds without a heartbeat after which a holder we cannot see is gone
BEAT = LEASE / 3  # how often a holder refreshes its heartbeat


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks after boot), or None when it is not running."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
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
    return "|".join((boot, _pid_namespace(), str(pid), start_time(pid) or "", os.urandom(6).hex()))


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


def take_free(c: Any, session_id: str, token: str, now: float) -> int | None:
    """Take the lock when nobody holds it, in one statement (no transaction around it: a
    turn's lock and unlock were five statements and three): the generation before, or None
    when it is held or has no row yet (then `take`, in a transaction, decides). fetchall:
    the statement runs to its end, its write lock released."""
    rows = c.execute(
        "UPDATE session_locks SET owner = ?, pid = ?, heartbeat = ?, generation = generation + 1"
        " WHERE session_id = ? AND owner IS NULL RETURNING generation",
        (token, os.getpid(), now, session_id),
    ).fetchall()
    return rows[0][0] - 1 if rows else None


def take(c: Any, session_id: str, token: str, now: float) -> tuple[int, bool]:
    """Take the lock for `token`: (the generation before, whether a gone holder's lock was
    taken over). Raises SessionBusy, naming the pid, while a live holder has it."""
    row = c.execute(
        "SELECT owner, pid, heartbeat, generation FROM session_locks WHERE session_id = ?", (session_id,)
    ).fetchone()
    generation, took_over = 0, False
    if row is not None:
        owner, pid, beat, generation = row
        if owner and owner != token:
            if holder_alive(owner, beat, now, token):
                raise SessionBusy(
                    f"busy: session {session_id} is running a turn in another crow process (pid {pid});"
                    " try again when it ends",
                    pid=pid,
                )
            took_over = True
            log.warning("session %s: took over the lock of crow process %s, which is gone", session_id, pid)
    c.execute(
        "INSERT INTO session_locks VALUES (?, ?, ?, ?, ?) ON CONFLICT (session_id) DO UPDATE SET"
        " owner = excluded.owner, pid = excluded.pid, heartbeat = excluded.heartbeat,"
        " generation = excluded.generation",
        (session_id, token, os.getpid(), now, generation + 1),
    )
    return generation, took_over


def release(c: Any, session_id: str, token: str) -> int | None:
    """Release `token`'s lock: the new generation, or None when it was taken over meanwhile."""
    rows = c.execute(
        "UPDATE session_locks SET owner = NULL, pid = NULL, generation = generation + 1"
        " WHERE session_id = ? AND owner = ? RETURNING generation",
        (session_id, token),
    ).fetchall()
    return rows[0][0] if rows else None


def release_all(c: Any, token: str) -> None:
    c.execute(
        "UPDATE session_locks SET owner = NULL, pid = NULL, generation = generation + 1 WHERE owner = ?",
        (token,),
    )


def touch(c: Any, token: str, now: float) -> None:
    c.execute("UPDATE session_locks SET heartbeat = ? WHERE owner = ?", (now, token))


def seen(c: Any, session_id: str, token: str) -> int | None:
    """The generation of a session being read (read it before the messages: a turn that
    starts after bumps it). None while another process holds it: a turn in progress was
    read, so the next lock reloads."""
    row = c.execute(
        "SELECT generation, owner FROM session_locks WHERE session_id = ?", (session_id,)
    ).fetchone()
    if row is None:
        return 0
    return None if row[1] is not None and row[1] != token else row[0]
