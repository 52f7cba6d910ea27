"""`PostgresStore`: the session store in a PostgreSQL database (`store: postgresql://…` or
CROW_STORE), the same `Store` contract as `SQLiteStore`, plus `SideRecords`.

psycopg 3, async, over a pool of connections (`psycopg_pool`): every operation is one
transaction (an append one statement), acknowledged only once committed. A pooled
connection is checked as it is taken, so after a database restart a stale one is replaced
rather than failing a call; while the database is down a call waits `wait` seconds for a
connection and then raises `StoreError` (the turn fails with a notice; crow keeps serving).
A database that stops answering (a hung server, a cut network: no error ever comes) fails
the call after `answer_within` seconds the same way, its connection closed (`answered`).

Session locks are PostgreSQL advisory locks (`pg_try_advisory_lock` of a 64-bit hash of the
id) held on one connection of the store's own, outside the pool: a second process, or a
second store in this one, gets `SessionBusy` naming the holder from `session_locks`, where
the holder also counts a generation (whether another process wrote since this store last
read: crow/store/locks.py `seen`). A process that dies, or whose connection drops, loses its
locks at once (PostgreSQL frees them). If that connection drops while a turn runs, the store
reconnects and takes its locks again (a session taken meanwhile by another process is
logged, and reloaded before the next turn).

Only `StoreError` and `SessionBusy` leave it; no message shows the URL's password.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import warnings
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from crow.errors import SessionBusy, StoreError
from crow.messages import Message
from crow.store import _pg_queries as q
from crow.store import _pg_side as side
from crow.store._codec import decode_cursor, dump
from crow.store._pg_locks import SessionLocks, busy_here
from crow.store._pg_schema import describe, password_of, prepare, redact
from crow.store.base import UPDATABLE, SessionRecord

log = logging.getLogger("crow.store")
T = TypeVar("T")
Conn = psycopg.AsyncConnection[Any]


class PostgresStore:
    """`async with PostgresStore("postgresql://…") as store:`. `home` (CROW_HOME) is unused
    by the store itself (its files stay where they are); kept for `store_for`'s signature."""

    wait = 5.0  # seconds a call waits for a connection while the database is away
    answer_within = 30.0  # seconds an operation may wait for the server's answer
    max_size = 10

    def __init__(self, url: str, *, home: str | os.PathLike[str] | None = None) -> None:
        self._url = url
        self._home = Path(home) if home is not None else None
        self._where = describe(url)
        self._password = password_of(url)
        self._state = "new"  # -> "open" -> "closed"
        self._pool: AsyncConnectionPool[Conn] | None = None
        # Per session, the lock generation its in-memory state reflects (None: reload).
        self._generations: dict[str, int | None] = {}
        # This store's name in session_locks: unique per store, readable in a busy error.
        holder = f"pid {os.getpid()} on {socket.gethostname()} #{os.urandom(3).hex()}"
        self._holder = holder
        self._locks = SessionLocks(self._connect, self._error, holder, self._generations, self._answered)
        # Operations whose caller was cancelled: they still land, and later calls wait for
        # them (a cancelled append is in the transcript before the next load reads it).
        self._orphans: set[asyncio.Future[Any]] = set()
        self._probing = False  # a connection attempt saying why the pool gave none (_no_connection)

    # lifecycle
    async def open(self) -> PostgresStore:
        if self._state != "new":
            raise StoreError(f"store {self._state}" if self._state == "closed" else "store open")
        self._state = "open"
        try:
            conn = self._locks.conn = await self._connect()
            try:
                await prepare(conn, self._where)
            except psycopg.Error as exc:
                raise self._error("open", exc) from exc
            self._pool = AsyncConnectionPool(
                self._url, kwargs=self._options(), min_size=1, max_size=self.max_size, open=False,
                check=AsyncConnectionPool.check_connection, timeout=self.wait, name="crow.store",
                # The pool retries a lost server with a doubling delay until this long: left at
                # its 5 minutes, a 40 s outage kept failing calls 22 s after the server was back.
                # Given up sooner, the next call that needs a connection tries again at once.
                reconnect_timeout=self.wait,
            )  # fmt: skip
            try:
                await self._pool.open(wait=True, timeout=self.wait)
            except PoolTimeout as exc:
                raise await self._no_connection(exc) from exc
            except psycopg.Error as exc:
                raise self._unreachable(exc) from exc
        except BaseException:
            await self.aclose()
            raise
        return self

    async def aclose(self) -> None:
        """Close after every operation already issued; locks still held are released (by
        closing their connection, and in session_locks)."""
        was, self._state = self._state, "closed"
        if was != "open":
            return
        if self._orphans:
            await asyncio.gather(*self._orphans, return_exceptions=True)
        if self._locks.held and self._pool is not None:
            with suppress(StoreError, SessionBusy):
                await self._transact(_release_all, self._holder)
        self._locks.held.clear()
        if self._pool is not None:
            with suppress(Exception):
                await self._pool.close()
        await self._locks.close()

    async def __aenter__(self) -> PostgresStore:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __del__(self) -> None:
        if getattr(self, "_state", None) == "open":
            warnings.warn(f"unclosed PostgresStore({self._where})", ResourceWarning, 1, source=self)
            self._state = "closed"

    # sessions
    async def create_session(self, record: SessionRecord | None = None, /, **fields: Any) -> SessionRecord:
        if record is None:
            record = SessionRecord(**fields)
        elif fields:
            raise TypeError("pass a SessionRecord or keyword fields, not both")
        created = await self._run(q.create, record, tx=False)
        self._generations[created.id] = 0
        return created

    async def get_session(self, session_id: str) -> SessionRecord | None:
        return await self._run(q.get, session_id, tx=False)

    async def update_session(self, session_id: str, **fields: Any) -> SessionRecord:
        if unknown := set(fields) - UPDATABLE:
            raise TypeError(f"cannot update session field(s) {sorted(unknown)}")
        return await self._run(q.update, session_id, fields, self._fenced(session_id), tx=False)

    async def delete_session(self, session_id: str) -> list[str]:
        return await self._shielded(self._delete, session_id)

    async def list_sessions(
        self, *, cwd: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[SessionRecord], str | None]:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        after = decode_cursor(cursor) if cursor else None
        return await self._run(q.list_page, cwd, limit, after, tx=False)

    async def descendants(self, ids: Sequence[str]) -> list[SessionRecord]:
        return await self._run(q.descendants, list(ids), tx=False)

    async def match_ids(self, prefix: str, limit: int = 10) -> list[tuple[str, str]]:
        return await self._run(q.match_ids, prefix, limit)

    async def short_ids(self, ids: Sequence[str], minimum: int = 8) -> dict[str, str]:
        return await self._run(q.short_ids, list(ids), minimum, read=True)

    async def fork_session(self, source_id: str, new_id: str) -> SessionRecord:
        return await self._run(q.fork, source_id, new_id)

    # messages
    async def append(self, session_id: str, messages: Sequence[Message], *, in_context: bool = True) -> None:
        texts = [dump(m) for m in messages]
        await self._run(q.append, session_id, texts, in_context, self._fenced(session_id), tx=not texts)

    async def set_context(self, session_id: str, messages: Sequence[Message]) -> None:
        await self._run(q.set_context, session_id, [dump(m) for m in messages], self._fenced(session_id))

    async def rewind_context(self, session_id: str, messages: Sequence[Message], marker: Message) -> None:
        texts, fenced = [dump(m) for m in messages], self._fenced(session_id)
        await self._run(q.rewind, session_id, texts, dump(marker), fenced)

    def _fenced(self, session_id: str) -> str | None:
        """This store's holder name while it holds the session's lock (a turn's writes): the
        write checks the lock is still its own (crow/store/_pg_queries.py `_APPEND`)."""
        return self._holder if session_id in self._locks.held else None

    async def context_at(self, session_id: str, seq: int) -> list[Message]:
        return await self._run(q.context_at, session_id, seq, read=True)

    async def load_context(self, session_id: str) -> list[Message]:
        self._generations[session_id], context = await self._run(
            q.load_context, session_id, self._holder, read=True
        )
        return context

    async def load_transcript(self, session_id: str) -> list[Message]:
        return await self._run(q.load_transcript, session_id, read=True)

    async def load_both(self, session_id: str) -> tuple[list[Message], list[Message]]:
        self._generations[session_id], context, transcript = await self._run(
            q.load_both, session_id, self._holder, read=True
        )
        return context, transcript

    # side records (crow.store.base.SideRecords)
    async def project_rules(self, project: str) -> list[str]:
        return await self._run(side.project_rules, project, tx=False)

    async def add_project_rules(self, project: str, rules: Sequence[str]) -> None:
        await self._run(side.add_project_rules, project, list(rules), tx=False)

    async def save_checkpoint(self, session_id: str, turn_id: str, record: str) -> None:
        await self._run(side.save_checkpoint, session_id, turn_id, record, tx=False)

    async def load_checkpoint(self, session_id: str, turn_id: str) -> str | None:
        return await self._run(side.load_checkpoint, session_id, turn_id, tx=False)

    async def checkpoint_turns(self, session_id: str) -> list[str]:
        return await self._run(side.checkpoint_turns, session_id, tx=False)

    async def forget_checkpoints(self, session_id: str, turn_ids: Sequence[str] | None = None) -> None:
        turns = None if turn_ids is None else list(turn_ids)
        await self._run(side.forget_checkpoints, session_id, turns, tx=False)

    async def copy_checkpoints(self, source_id: str, new_id: str) -> None:
        await self._run(side.copy_checkpoints, source_id, new_id, tx=False)

    # session locks
    async def lock_session(self, session_id: str) -> bool:
        """Take `session_id` for a turn (see the module docstring). Returns True when the
        session may have changed since this store last read or wrote it: reload."""
        if session_id in self._locks.held:
            raise busy_here(session_id)
        self._check_open()
        task = asyncio.ensure_future(self._take(session_id))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():  # it may still take the lock, for nobody: release it after
                self._adopt(asyncio.ensure_future(self._release_after(task, session_id)))
            raise

    async def unlock_session(self, session_id: str) -> None:
        self._locks.held.discard(session_id)
        self._check_open()
        generation = await self._shielded(self._locks.release, session_id)
        if generation is not None:  # else it was taken over meanwhile: the next lock reloads
            self._generations[session_id] = generation

    async def _take(self, session_id: str) -> bool:
        generation, holder = await self._locks.take(session_id)
        took_over = holder is not None and holder != self._holder  # its turn may be half written
        if took_over:
            log.warning("session %s: took over from %s, whose connection is gone", session_id, holder)
        stale = took_over or self._generations.get(session_id) != generation
        self._generations[session_id] = generation + 1
        return stale

    async def _release_after(self, task: asyncio.Future[bool], session_id: str) -> None:
        with suppress(BaseException):
            await task
            await self._locks.release(session_id)
            self._generations[session_id] = None  # the lock moved: reload before the next turn

    async def _delete(self, session_id: str) -> list[str]:
        gone = await self._transact(q.under, session_id)
        if running := next((sid for sid in gone if sid in self._locks.held), None):  # a subagent's
            raise SessionBusy(
                f"busy: session {running} is running a turn in this crow process; try again when it ends",
                pid=os.getpid(),
            )
        # Not while another process runs a turn in one of them: hold their locks meanwhile.
        keys = await self._locks.hold(gone)
        try:
            await self._transact(q.delete, session_id)
        finally:
            await self._locks.let_go(keys)
        return gone

    # running operations
    def _check_open(self) -> None:
        if self._state != "open":
            raise StoreError("store closed" if self._state == "closed" else "store not open")

    def _adopt(self, future: asyncio.Future[Any]) -> None:
        self._orphans.add(future)
        future.add_done_callback(self._orphans.discard)

    async def _shielded(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Run `fn` to its end even when the caller is cancelled (it was issued: it lands)."""
        self._check_open()
        if self._orphans:
            await asyncio.gather(*list(self._orphans), return_exceptions=True)
        task = asyncio.ensure_future(fn(*args, **kwargs))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                self._adopt(task)
            raise

    async def _run(
        self,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        tx: bool = True,
        read: bool = False,
        bound: bool = True,
    ) -> T:
        """`fn(conn, *args)` on a pooled connection: in one transaction (`tx`; a consistent
        snapshot when `read`), else as one autocommitted statement; given up after
        `answer_within` seconds unless not `bound` (a migration's copy of a long session)."""
        return await self._shielded(self._transact, fn, *args, tx=tx, read=read, bound=bound)

    async def _transact(
        self,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        tx: bool = True,
        read: bool = False,
        bound: bool = True,
    ) -> T:
        if bound:
            return await self._answered(self._transact(fn, *args, tx=tx, read=read, bound=False))
        assert self._pool is not None
        try:
            async with self._pool.connection() as conn:
                if not tx:
                    return await fn(conn, *args)
                async with conn.transaction():
                    if read:
                        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    return await fn(conn, *args)
        except PoolTimeout as exc:
            raise await self._no_connection(exc) from exc
        except psycopg.Error as exc:
            raise self._error(fn.__name__, exc) from exc
        except UnicodeEncodeError as exc:  # text that is not valid Unicode
            raise StoreError(f"{fn.__name__} failed: {exc}") from exc

    async def _answered(self, work: Awaitable[T], within: float | None = None) -> T:
        """`work`, or StoreError once the server has not answered it for `within` seconds
        (`answer_within`). Then it is cancelled twice: psycopg meets the first by asking the server to
        cancel the query, which a hung server never does (10 s), and the second by closing
        the connection. What the server received before it hung may still be done once it
        runs again, as with a connection lost before the answer came."""
        within = self.answer_within if within is None else within
        task = asyncio.ensure_future(work)
        try:
            done, _ = await asyncio.wait({task}, timeout=within)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if done:
            return task.result()
        for _ in range(2):
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=1)
            if done:
                break
        if done and not task.cancelled() and task.exception() is None:
            return task.result()  # answered just then
        raise StoreError(
            f"cannot reach the PostgreSQL store at {self._where}: no answer within {within:g} s"
        )

    async def _connect(self) -> Conn:
        try:
            return await psycopg.AsyncConnection.connect(self._url, **self._options())
        except psycopg.Error as exc:
            raise self._unreachable(exc) from exc

    def _options(self) -> dict[str, Any]:
        from psycopg.conninfo import conninfo_to_dict

        options: dict[str, Any] = {"autocommit": True, "application_name": "crow"}
        with suppress(psycopg.Error):
            if "connect_timeout" not in conninfo_to_dict(self._url):
                options["connect_timeout"] = max(1, round(self.wait))
        return options

    async def _no_connection(self, timeout: PoolTimeout) -> StoreError:
        """The pool gave no connection in time: say why, as the server does to one more
        connection (refused, "too many connections", a password refused, ...); the pool
        itself only logs it. One that succeeds means this process's connections are busy.
        One probe at a time: hundreds of calls timing out together must not open as many."""
        if self._probing:
            return self._unreachable(timeout)
        self._probing = True
        try:  # briefly: the call already waited `wait` seconds
            probe = await asyncio.wait_for(psycopg.AsyncConnection.connect(self._url, **self._options()), 2)
        except psycopg.Error as exc:
            return self._unreachable(timeout, exc)
        except TimeoutError:
            return self._unreachable(timeout)
        finally:
            self._probing = False
        with suppress(psycopg.Error):
            await probe.close()
        return self._unreachable(timeout)

    def _unreachable(self, exc: BaseException, cause: BaseException | None = None) -> StoreError:
        why = " ".join(str(exc).split()) or type(exc).__name__  # libpq's lines, as one
        if isinstance(exc, PoolTimeout):
            why = f"no connection within {self.wait:g} s"
            if cause is not None:
                why += ": " + (" ".join(str(cause).split()) or type(cause).__name__)
        why = redact(why, self._password)
        return StoreError(f"cannot reach the PostgreSQL store at {self._where}: {why}")

    def _error(self, operation: str, exc: psycopg.Error) -> StoreError:
        if isinstance(exc, psycopg.OperationalError):  # the server went away, mostly
            return self._unreachable(exc)
        return StoreError(f"{operation} failed: {redact(str(exc).strip(), self._password)}")


async def _release_all(c: Conn, holder: str) -> None:
    await c.execute(
        "UPDATE session_locks SET holder = NULL, pid = NULL, generation = generation + 1 WHERE holder = %s",
        (holder,),
    )
