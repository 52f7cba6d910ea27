"""`SessionLocks`: a PostgreSQL store's session locks, advisory locks held on one connection
of the store's own (not from the pool: a session-level advisory lock belongs to the
connection that took it).

The key of a session is a stable signed 64-bit hash of its id (`session_key`). Beside the
advisory lock, `session_locks` keeps who holds it (the name a busy error gives) and a
generation (crow/store/locks.py `seen`): a holder row still set when the lock is free means
its holder's connection went away mid-turn (taken over: reload). A connection that drops
is replaced at its next use, or by the keeper within `keep_every` seconds while locks are
held, and the locks held are taken again; one another process took meanwhile is logged and
its generation forgotten (reloaded before the next turn).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from typing import Any, TypeVar

import psycopg

from crow.errors import SessionBusy, StoreError

log = logging.getLogger("crow.store")
T = TypeVar("T")
Conn = psycopg.AsyncConnection[Any]

_TAKE = (
    "SELECT pg_try_advisory_lock(%s), l.holder, l.pid, EXISTS (SELECT 1 FROM sessions WHERE id = %s)"
    " FROM (SELECT 1) AS one LEFT JOIN session_locks l ON l.session_id = %s"
)
_MARK = (
    "INSERT INTO session_locks AS l VALUES (%s, %s, %s, 1) ON CONFLICT (session_id) DO UPDATE"
    " SET holder = excluded.holder, pid = excluded.pid, generation = l.generation + 1"
    " RETURNING generation - 1"
)
_UNMARK = (
    "UPDATE session_locks SET holder = NULL, pid = NULL, generation = generation + 1"
    " WHERE session_id = %s AND holder = %s RETURNING generation"
)


def session_key(session_id: str) -> int:
    """The advisory lock key of a session: a stable signed 64-bit hash of its id."""
    return int.from_bytes(hashlib.blake2b(session_id.encode(), digest_size=8).digest(), "big", signed=True)


def busy(session_id: str, holder: str | None, pid: int | None) -> SessionBusy:
    who = holder or "another crow process"
    return SessionBusy(
        f"busy: session {session_id} is running a turn in another crow process ({who});"
        " try again when it ends",
        pid=pid,
    )


def busy_here(session_id: str) -> SessionBusy:
    # Another `Session` of this process runs a turn in it (a running subagent's, loaded
    # again by its id): a second writer of one history. (An advisory lock is reentrant on
    # its connection: PostgreSQL would not refuse it.)
    return SessionBusy(
        f"busy: session {session_id} is running a turn in this crow process (a subagent's,"
        " say); try again when it ends",
        pid=os.getpid(),
    )


class SessionLocks:
    """The lock connection of one store. `connect()` opens a connection (raising
    `StoreError`), `error(op, exc)` maps a psycopg error; `generations` and `answered` (the
    bound on waiting for the server) are the store's."""

    keep_every = 5.0  # seconds between checks of the connection while a lock is held

    def __init__(
        self,
        connect: Callable[[], Awaitable[Conn]],
        error: Callable[[str, psycopg.Error], StoreError],
        holder: str,
        generations: dict[str, int | None],
        answered: Callable[..., Awaitable[Any]],
    ) -> None:
        self._connect, self._error, self.holder = connect, error, holder
        self._answered = answered  # the store's bound on waiting for the server
        self.generations = generations
        self.held: set[str] = set()
        self.conn: Conn | None = None
        self._mutex = asyncio.Lock()
        self._keeper: asyncio.Task[None] | None = None
        self._closed = False

    async def take(self, session_id: str) -> tuple[int, str | None]:
        """Take the lock: (the generation before, the holder the row named). Raises
        SessionBusy while another connection has it, StoreError for an unknown session."""
        key = session_key(session_id)

        async def take(conn: Conn) -> tuple[int, str | None]:
            if session_id in self.held:  # checked again here: two callers may race
                raise busy_here(session_id)
            got, holder, pid, exists = await self.execute(conn, _TAKE, (key, session_id, session_id))
            if not got:
                raise busy(session_id, holder, pid)
            try:
                if not exists:
                    raise StoreError(f"unknown session {session_id!r}")
                (generation,) = await self.execute(conn, _MARK, (session_id, self.holder, os.getpid()))
            except BaseException:
                with suppress(psycopg.Error, StoreError):
                    await conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
                raise
            self.held.add(session_id)  # before the mutex is let go: the next taker checks it
            return generation, holder

        taken = await self.run(take)
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.get_running_loop().create_task(self._keep(), name="crow.store.keeper")
        return taken

    async def release(self, session_id: str) -> int | None:
        """Release it: the new generation, or None when another holder took it meanwhile."""
        self.held.discard(session_id)

        async def release(conn: Conn) -> int | None:
            row = await self.execute(conn, _UNMARK, (session_id, self.holder))
            # After the row: the next holder reads it released, not taken over.
            await self.execute(conn, "SELECT pg_advisory_unlock(%s)", (session_key(session_id),))
            return row[0] if row else None

        return await self.run(release)

    async def hold(self, session_ids: Sequence[str]) -> list[int]:
        """Take every one of these sessions' locks (a delete), or none: SessionBusy."""
        keys = [session_key(sid) for sid in session_ids]

        async def take_all(conn: Conn) -> list[int]:
            for n, sid in enumerate(session_ids):
                got, holder, pid, _ = await self.execute(conn, _TAKE, (keys[n], sid, sid))
                if not got:
                    await self._unlock(conn, keys[:n])
                    raise busy(sid, holder, pid)
            return keys

        return await self.run(take_all)

    async def let_go(self, keys: Sequence[int]) -> None:
        with suppress(StoreError):  # a lost connection let them go already
            await self.run(self._unlock, keys)

    async def _unlock(self, conn: Conn, keys: Sequence[int]) -> None:
        for key in keys:
            await self.execute(conn, "SELECT pg_advisory_unlock(%s)", (key,))

    async def run(self, work: Callable[..., Awaitable[T]], *args: Any) -> T:
        """`work(conn, *args)` on the lock connection, alone. A connection found dead (before
        the keeper noticed) is replaced and `work` tried once more: its locks went with it."""
        # The wait for the mutex is inside the bound: calls queued behind one that waits on a
        # silent server must not each add their own bound after it.
        return await self._answered(self._alone(work, *args))  # type: ignore[no-any-return]

    async def _alone(self, work: Callable[..., Awaitable[T]], *args: Any) -> T:
        async with self._mutex:
            return await self._run(work, *args)

    async def _run(self, work: Callable[..., Awaitable[T]], *args: Any) -> T:
        conn = await self._connection()
        try:
            return await work(conn, *args)
        except StoreError:
            if not conn.broken:
                raise
        return await work(await self._connection(), *args)

    async def execute(self, conn: Conn, sql: str, params: Sequence[Any]) -> Any:
        """One statement: its first row (None for none)."""
        try:
            cur = await conn.execute(sql, params)
            return await cur.fetchone() if cur.description else None
        except psycopg.Error as exc:
            raise self._error("lock", exc) from exc

    async def _connection(self) -> Conn:
        """The connection, replaced when it broke: the locks held are taken again before
        anyone may use it."""
        conn = self.conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        self.conn = None
        if conn is not None:
            with suppress(Exception):
                await conn.close()
        conn = await self._connect()
        for sid in sorted(self.held):
            got, holder = await self.execute(
                conn,
                "SELECT pg_try_advisory_lock(%s), (SELECT holder FROM session_locks WHERE session_id = %s)",
                (session_key(sid), sid),
            )
            if not got or holder != self.holder:
                log.warning(
                    "session %s: its lock went with the connection to the PostgreSQL store, and %s"
                    " since; it is reloaded before its next turn",
                    sid, f"{holder} holds it" if not got else f"{holder or 'another process'} held it",
                )  # fmt: skip
                self.generations[sid] = None
            if got and holder != self.holder:
                await self.execute(
                    conn,
                    "UPDATE session_locks SET holder = %s, pid = %s WHERE session_id = %s",
                    (self.holder, os.getpid(), sid),
                )
        self.conn = conn
        return conn

    async def _keep(self) -> None:
        """While locks are held, check the connection now and then (see the docstring)."""
        while self.held and not self._closed:
            await asyncio.sleep(self.keep_every)
            if not self.held or self._closed:
                break
            try:
                await self.run(self.execute, "SELECT 1", ())
            except StoreError as exc:
                log.warning("session locks: %s (retrying)", exc)

    async def close(self) -> None:
        """Close the connection, and with it the locks it held."""
        self._closed = True
        if self._keeper is not None:
            self._keeper.cancel()
        if self.conn is not None:
            with suppress(Exception):
                # At once: the server frees them only once it has seen the close. Briefly: a
                # server that answers nothing must not hold crow's exit (closing frees them).
                await self._answered(self.conn.execute("SELECT pg_advisory_unlock_all()"), 2.0)
            with suppress(Exception):
                await self.conn.close()
