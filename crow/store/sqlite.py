"""`SQLiteStore`: the session store in one SQLite file (WAL, `synchronous=NORMAL`, foreign
keys on), the default `Store`.

One connection, owned by one worker thread (`crow.store._worker`): every SQLite call runs
there, so the event loop never waits on the database (a 5,000-message fork, another
process's write lock). An operation is one hop: the loop queues a job and awaits it.

Every `append` is its own committed transaction, so a message is durable as soon as
`append` returns (a SIGKILL cannot lose it; with `synchronous=NORMAL` an OS crash or power
cut may lose the last commits).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import suppress
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from crow.errors import SessionBusy, StoreError
from crow.messages import Message
from crow.store import _queries as q
from crow.store import locks
from crow.store._codec import decode_cursor, dump
from crow.store._schema import connect
from crow.store._worker import Worker
from crow.store.base import UPDATABLE, SessionRecord

log = logging.getLogger("crow.store")
T = TypeVar("T")
# A write past this many bytes (an image: megabytes of JSON) is encoded and written on the
# worker thread: inline, a 1.4 MB row held the event loop 20-40 ms.
INLINE_BYTES = 64 * 1024


class SQLiteStore:
    """`async with SQLiteStore(path) as store:`; `path` may be ":memory:". The database is
    private to the user (`crow.private`); so is `home` (CROW_HOME) when given."""

    def __init__(self, path: str | os.PathLike[str], *, home: str | os.PathLike[str] | None = None) -> None:
        self._path = str(path)
        self._home = Path(home) if home is not None else None  # CROW_HOME: made private at open
        self._state = "new"  # -> "open" -> "closed"
        self._worker = Worker()
        # Session locks: this store's token, the sessions it holds, and per session the lock
        # generation its in-memory state reflects (None: unknown, reload before a turn).
        # All three live on the loop thread; the worker only runs SQL.
        self._token = ""
        self._held: set[str] = set()
        self._generations: dict[str, int | None] = {}
        self._heartbeat: asyncio.Task[None] | None = None

    # lifecycle
    async def open(self) -> SQLiteStore:
        if self._state != "new":
            raise StoreError(f"store {self._state}" if self._state == "closed" else "store open")
        self._state = "open"
        self._token = locks.process_token()
        try:
            await self._worker.open(partial(connect, self._path, self._home))
            # Checkpoints fsync: the worker runs them (`Worker.run_small`), never a commit.
            await self._run(_no_autocheckpoint)
        except BaseException:
            await self.aclose()
            raise
        return self

    async def aclose(self) -> None:
        """Close the connection (after every job queued before) and end the worker. Session
        locks still held (a turn cut short by the exit) are released first."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self._state == "open" and self._held:
            with suppress(StoreError):
                await self._run(q.release_all, self._token)
            self._held.clear()
        was, self._state = self._state, "closed"
        if was == "open":
            await self._worker.close()

    async def __aenter__(self) -> SQLiteStore:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __del__(self) -> None:
        if getattr(self, "_state", None) == "open":
            warnings.warn(f"unclosed SQLiteStore({self._path!r})", ResourceWarning, stacklevel=1, source=self)
            self._state = "closed"
            self._worker.close_soon()

    # sessions
    async def create_session(self, record: SessionRecord | None = None, /, **fields: Any) -> SessionRecord:
        if record is None:
            record = SessionRecord(**fields)
        elif fields:
            raise TypeError("pass a SessionRecord or keyword fields, not both")
        created = await self._run_small(q.create, record)  # a subagent's start waits on it
        self._generations[created.id] = 0
        return created

    async def get_session(self, session_id: str) -> SessionRecord | None:
        return await self._run(q.get, session_id)

    async def update_session(self, session_id: str, **fields: Any) -> SessionRecord:
        if unknown := set(fields) - UPDATABLE:
            raise TypeError(f"cannot update session field(s) {sorted(unknown)}")
        return await self._run_small(q.update, session_id, fields)

    async def delete_session(self, session_id: str) -> list[str]:
        return await self._run(q.delete, session_id, self._token, frozenset(self._held))

    async def list_sessions(
        self, *, cwd: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[SessionRecord], str | None]:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        after = decode_cursor(cursor) if cursor else None
        return await self._run(q.list_page, cwd, limit, after)

    async def descendants(self, ids: Sequence[str]) -> list[SessionRecord]:
        return await self._run(q.descendants, ids)

    async def match_ids(self, prefix: str, limit: int = 10) -> list[tuple[str, str]]:
        return await self._run(q.match_ids, prefix, limit)

    async def short_ids(self, ids: Sequence[str], minimum: int = 8) -> dict[str, str]:
        return await self._run(q.short_ids, ids, minimum)

    async def fork_session(self, source_id: str, new_id: str) -> SessionRecord:
        return await self._run(q.fork, source_id, new_id)

    # messages
    async def append(self, session_id: str, messages: Sequence[Message], *, in_context: bool = True) -> None:
        if any(m.images for m in messages):
            await self._run(_append_messages, session_id, messages, in_context)
            return
        rows = [dump(m) for m in messages]
        run = self._run_small if sum(map(len, rows)) <= INLINE_BYTES else self._run
        await run(q.append, session_id, rows, in_context)

    async def set_context(self, session_id: str, messages: Sequence[Message]) -> None:
        await self._run(q.set_context, session_id, [dump(m) for m in messages])

    async def rewind_context(self, session_id: str, messages: Sequence[Message], marker: Message) -> None:
        await self._run(q.rewind, session_id, [dump(m) for m in messages], dump(marker))

    async def context_at(self, session_id: str, seq: int) -> list[Message]:
        return await self._run(q.context_at, session_id, seq)

    async def load_context(self, session_id: str) -> list[Message]:
        self._generations[session_id], context = await self._run(q.load_context, session_id, self._token)
        return context

    async def load_transcript(self, session_id: str) -> list[Message]:
        return await self._run(q.load_transcript, session_id)

    async def load_both(self, session_id: str) -> tuple[list[Message], list[Message]]:
        """(context, transcript) from one read: what a `session/load` needs."""
        self._generations[session_id], context, transcript = await self._run(
            q.load_both, session_id, self._token
        )
        return context, transcript

    # session locks: one turn at a time per session, across processes
    async def lock_session(self, session_id: str) -> bool:
        """Take `session_id` for a turn. Raises `SessionBusy` (naming the pid) when another
        live crow process holds it; a lock left by a process that is gone is taken over.
        Returns True when the session may have changed since this store last read or wrote
        it (another process ran a turn): the caller reloads its context."""
        if session_id in self._held:
            # Another `Session` of this process runs a turn in it (one `Session` nests its
            # own uses without locking again): a running subagent's session, loaded again by
            # its id and prompted, would be a second writer of one history.
            raise SessionBusy(
                f"busy: session {session_id} is running a turn in this crow process (a subagent's,"
                " say); try again when it ends",
                pid=os.getpid(),
            )
        try:
            generation, took_over = await self._run_small(q.lock, session_id, self._token, time.time())
        except asyncio.CancelledError:
            # A queued job runs even when its caller is gone: a lock taken for nobody would
            # tell every other process "busy" until this one exits. Release it after it.
            if session_id not in self._held:
                await self._release_for_cancelled(session_id)
            raise
        # A holder that is gone may have written anything since this store read.
        stale = took_over or self._generations.get(session_id) != generation
        self._generations[session_id] = generation + 1
        self._held.add(session_id)
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.get_running_loop().create_task(
                self._beat(), name="crow.store.heartbeat"
            )
        return stale

    async def unlock_session(self, session_id: str) -> None:
        self._held.discard(session_id)
        generation = await self._run_small(q.unlock, session_id, self._token)
        if generation is not None:  # else it was taken over meanwhile: the next lock reloads
            self._generations[session_id] = generation

    async def _release_for_cancelled(self, session_id: str) -> None:
        import anyio  # only here: a cancel while a lock was being taken

        with anyio.CancelScope(shield=True), suppress(StoreError):
            await self._run(q.unlock, session_id, self._token)
        self._generations[session_id] = None  # the lock moved: reload before the next turn

    async def _beat(self) -> None:
        """Refresh the heartbeat of held locks (what a process in another PID namespace,
        which cannot see ours, goes by): one small write every BEAT seconds while a turn runs."""
        while self._held and self._state == "open":
            await asyncio.sleep(locks.BEAT)
            if self._held and self._state == "open":
                try:
                    await self._run(q.touch, self._token, time.time())
                except StoreError as exc:
                    log.warning("cannot refresh session locks: %s", exc)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._state != "open":
            raise StoreError("store closed" if self._state == "closed" else "store not open")
        return await self._worker.run(fn, *args)

    async def _run_small(self, fn: Callable[..., T], *args: Any) -> T:
        """A small write: at once when the worker is idle and the database free (no hop)."""
        if self._state != "open":
            raise StoreError("store closed" if self._state == "closed" else "store not open")
        return await self._worker.run_small(fn, *args)


def _append_messages(
    conn: sqlite3.Connection, session_id: str, messages: Sequence[Message], in_context: bool
) -> None:
    q.append(conn, session_id, [dump(m) for m in messages], in_context)


def _no_autocheckpoint(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA wal_autocheckpoint = 0")
