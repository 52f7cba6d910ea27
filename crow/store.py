"""The session store: conversations that survive restarts, crashes and compaction.

One SQLite file (WAL, `synchronous=NORMAL`, foreign keys on) holds two tables:

    sessions  one row per session: metadata, `message_count` (the next seq),
              `context_head` (JSON list of messages) and `context_from` (a seq)
    entries   (session_id, seq) -> message JSON, in_context flag; append-only

A third, `session_locks`, names the crow process running a turn in a session (see
`crow.locks`): a session runs turns in one process at a time. Its `generation` counts lock
changes, so a process taking the lock knows whether another one wrote since it last read.

The transcript is every entry in seq order and is never rewritten. The model context
is `context_head` followed by the entries with `seq >= context_from AND in_context = 1`,
so a compaction (`set_context`) rewrites one row and leaves the transcript whole.

Every `append` is its own committed transaction, so a message is durable as soon as
`append` returns (a SIGKILL cannot lose it; with `synchronous=NORMAL` an OS crash or
power cut may lose the last commits). Its cost does not depend on the history length.

One connection, owned by one worker thread (like aiosqlite): the async methods queue a
job and await its result. A job always runs once queued, even if the awaiting task is
cancelled. No sqlite3 exception escapes: everything becomes `StoreError`. The async
side is asyncio (crow's ACP server runs on it).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from queue import SimpleQueue
from typing import Any, Protocol, TypeVar, runtime_checkable

from crow import locks
from crow.errors import StoreError
from crow.messages import Message
from crow.private import secure_store

__all__ = ["SCHEMA_VERSION", "SQLiteStore", "SessionRecord", "Store"]

log = logging.getLogger("crow.store")
T = TypeVar("T")
SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE sessions (
  id TEXT PRIMARY KEY, cwd TEXT NOT NULL, title TEXT NOT NULL DEFAULT '',
  created_at REAL NOT NULL, updated_at REAL NOT NULL, model TEXT, mode TEXT,
  todos TEXT NOT NULL DEFAULT '[]', files TEXT NOT NULL DEFAULT '{}',
  config TEXT NOT NULL DEFAULT '{}', message_count INTEGER NOT NULL DEFAULT 0,
  context_from INTEGER NOT NULL DEFAULT 0, context_head TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX sessions_by_time ON sessions (updated_at DESC, id);
CREATE INDEX sessions_by_cwd ON sessions (cwd, updated_at DESC, id);
CREATE TABLE entries (
  session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE, seq INTEGER NOT NULL,
  message TEXT NOT NULL, in_context INTEGER NOT NULL DEFAULT 1, PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
"""
_COLUMNS = "id, cwd, title, created_at, updated_at, model, mode, todos, files, config, message_count"
_UPDATABLE = frozenset({"title", "model", "mode", "todos", "files", "config"})
_JSON_FIELDS = frozenset({"todos", "files", "config"})


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """A session's metadata. Timestamps are ISO 8601 UTC strings ("" = now, on create)."""

    id: str
    cwd: str
    title: str = ""
    created_at: str = ""
    updated_at: str = ""
    model: str | None = None
    mode: str | None = None
    todos: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    message_count: int = 0


@runtime_checkable
class Store(Protocol):
    """What crow needs from a session store (SQLite today; a server database later)."""

    async def create_session(
        self, record: SessionRecord | None = None, /, **fields: Any
    ) -> SessionRecord: ...
    async def get_session(self, session_id: str) -> SessionRecord | None: ...
    async def update_session(self, session_id: str, **fields: Any) -> SessionRecord: ...
    async def delete_session(self, session_id: str) -> None: ...
    async def list_sessions(
        self, *, cwd: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[SessionRecord], str | None]: ...
    async def fork_session(self, source_id: str, new_id: str) -> SessionRecord: ...
    async def append(
        self, session_id: str, messages: Sequence[Message], *, in_context: bool = True
    ) -> None: ...
    async def set_context(self, session_id: str, messages: Sequence[Message]) -> None: ...
    async def load_context(self, session_id: str) -> list[Message]: ...
    async def load_transcript(self, session_id: str) -> list[Message]: ...
    async def lock_session(self, session_id: str) -> bool: ...
    async def unlock_session(self, session_id: str) -> None: ...
    async def aclose(self) -> None: ...


class SQLiteStore:
    """`async with SQLiteStore(path) as store:`; `path` may be ":memory:". The database is
    private to the user (`crow.private`); so is `home` (CROW_HOME) when given."""

    def __init__(self, path: str | os.PathLike[str], *, home: str | os.PathLike[str] | None = None) -> None:
        self._path = str(path)
        self._home = Path(home) if home is not None else None  # CROW_HOME: made private at open
        self._state = "new"  # -> "open" -> "closed"
        # The worker and the close job hold the slot and the queue, never the store, so an
        # unclosed store can still be collected (and warn).
        self._slot = _Slot()
        self._jobs: SimpleQueue[Callable[[], None] | None] = SimpleQueue()
        self._thread = threading.Thread(target=_work, args=(self._jobs,), name="crow-store", daemon=True)
        # Writes are small (one append is an INSERT and a COMMIT, ~0.05 ms in WAL mode) and
        # sit on the loop's hot path: they run inline on a second connection, because a hop
        # to the worker thread and back costs more than the write itself. Reads, which can
        # be large (a 5,000-message replay), stay on the worker. ":memory:" databases are
        # per connection, so they keep everything on the worker.
        self._writer = _Slot()
        self._inline = self._path != ":memory:"
        # Session locks: this store's token, the sessions it holds, and per session the lock
        # generation its in-memory state reflects (None: unknown, reload before a turn).
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
        self._thread.start()
        try:
            await self._run(self._connect)
            if self._inline:
                self._writer.conn = self._open_connection()
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
                await self._write(self._release_all)
            self._held.clear()
        was, self._state = self._state, "closed"
        _close(self._writer)
        if was == "open":
            try:
                await self._submit(_close, self._slot)
            finally:
                self._jobs.put(None)

    async def __aenter__(self) -> SQLiteStore:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __del__(self) -> None:
        if getattr(self, "_state", None) == "open":
            warnings.warn(f"unclosed SQLiteStore({self._path!r})", ResourceWarning, stacklevel=1, source=self)
            self._state = "closed"
            self._jobs.put(partial(_close, self._slot))
            _close(self._writer)
            self._jobs.put(None)

    # sessions
    async def create_session(self, record: SessionRecord | None = None, /, **fields: Any) -> SessionRecord:
        if record is None:
            record = SessionRecord(**fields)
        elif fields:
            raise TypeError("pass a SessionRecord or keyword fields, not both")
        return await self._write(self._create, record)

    async def get_session(self, session_id: str) -> SessionRecord | None:
        return await self._run(self._get, session_id)

    async def update_session(self, session_id: str, **fields: Any) -> SessionRecord:
        if unknown := set(fields) - _UPDATABLE:
            raise TypeError(f"cannot update session field(s) {sorted(unknown)}")
        return await self._write(self._update, session_id, fields)

    async def delete_session(self, session_id: str) -> None:
        await self._write(self._delete, session_id)

    async def list_sessions(
        self, *, cwd: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[SessionRecord], str | None]:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        after = _decode_cursor(cursor) if cursor else None
        return await self._run(self._list, cwd, limit, after)

    async def fork_session(self, source_id: str, new_id: str) -> SessionRecord:
        return await self._write(self._fork, source_id, new_id)

    # messages
    async def append(self, session_id: str, messages: Sequence[Message], *, in_context: bool = True) -> None:
        await self._write(self._append, session_id, list(messages), in_context)

    async def set_context(self, session_id: str, messages: Sequence[Message]) -> None:
        await self._write(self._set_context, session_id, list(messages))

    async def load_context(self, session_id: str) -> list[Message]:
        return await self._run(self._load_context, session_id)

    async def load_transcript(self, session_id: str) -> list[Message]:
        return await self._run(self._load_transcript, session_id)

    async def load_both(self, session_id: str) -> tuple[list[Message], list[Message]]:
        """(context, transcript) from one read: what a `session/load` needs."""
        return await self._run(self._load_both, session_id)

    # session locks: one turn at a time per session, across processes
    async def lock_session(self, session_id: str) -> bool:
        """Take `session_id` for a turn. Raises `SessionBusy` (naming the pid) when another
        live crow process holds it; a lock left by a process that is gone is taken over.
        Returns True when the session may have changed since this store last read or wrote
        it (another process ran a turn): the caller reloads its context."""
        stale = await self._write(self._lock, session_id, time.time())
        self._held.add(session_id)
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.get_running_loop().create_task(
                self._beat(), name="crow.store.heartbeat"
            )
        return stale

    async def unlock_session(self, session_id: str) -> None:
        self._held.discard(session_id)
        await self._write(self._unlock, session_id)

    async def _beat(self) -> None:
        """Refresh the heartbeat of held locks (what a process in another PID namespace,
        which cannot see ours, goes by): one small write every BEAT seconds while a turn runs."""
        while self._held and self._state == "open":
            await asyncio.sleep(locks.BEAT)
            if self._held and self._state == "open":
                try:
                    await self._write(self._touch, time.time())
                except StoreError as exc:
                    log.warning("cannot refresh session locks: %s", exc)

    # the worker thread and its hand-off; the inline writer
    @property
    def _conn(self) -> sqlite3.Connection:
        slot = self._writer if self._inline and threading.current_thread() is not self._thread else self._slot
        assert slot.conn is not None, "used before connect"
        return slot.conn

    async def _write(self, fn: Callable[..., T], *args: Any) -> T:
        if not self._inline:
            return await self._run(fn, *args)
        if self._state != "open":
            raise StoreError("store closed" if self._state == "closed" else "store not open")
        try:
            return fn(*args)
        except (sqlite3.Error, UnicodeEncodeError) as exc:  # text not valid Unicode: a clear error
            raise StoreError(f"{fn.__name__.lstrip('_')} failed: {exc}") from exc

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._state != "open":
            raise StoreError("store closed" if self._state == "closed" else "store not open")
        return await self._submit(fn, *args)

    async def _submit(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def job() -> None:
            result: Any = None
            error: BaseException | None = None
            try:
                result = fn(*args)
            except (sqlite3.Error, UnicodeEncodeError) as exc:
                error = StoreError(f"{fn.__name__.lstrip('_')} failed: {exc}")
                error.__cause__ = exc
            except BaseException as exc:
                error = exc
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # the event loop is gone; nobody is waiting
                pass

        self._jobs.put(job)
        return await future

    # everything below runs on the worker thread
    def _connect(self) -> None:
        if self._path != ":memory:" and not self._path.startswith("file:"):
            secure_store(Path(self._path), self._home)
        conn = self._open_connection()
        self._slot.conn = conn
        conn.execute("PRAGMA journal_mode = WAL")
        with self._tx() as c:
            version = c.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self._path} has schema version {version}; this crow "
                    f"knows up to {SCHEMA_VERSION} (upgrade crow)"
                )
            if version == 0:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        c.execute(statement)
                c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            c.execute(locks.TABLE)

    def _open_connection(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=True)
        conn.execute("PRAGMA busy_timeout = 5000")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _create(self, r: SessionRecord) -> SessionRecord:
        now = time.time()
        created = _from_iso(r.created_at) if r.created_at else now
        updated = _from_iso(r.updated_at) if r.updated_at else created
        with self._tx() as c:
            if c.execute("SELECT 1 FROM sessions WHERE id = ?", (r.id,)).fetchone():
                raise StoreError(f"session {r.id!r} already exists")
            c.execute(
                "INSERT INTO sessions (id, cwd, title, created_at, updated_at, model, mode,"
                " todos, files, config) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (r.id, r.cwd, r.title, created, updated, r.model, r.mode,
                 *map(_json, (r.todos, r.files, r.config))),
            )  # fmt: skip
            self._generations[r.id] = 0
            return self._record(c, r.id)

    def _get(self, session_id: str) -> SessionRecord | None:
        try:
            return self._record(self._conn, session_id)
        except StoreError:
            return None

    def _record(self, c: sqlite3.Connection, session_id: str) -> SessionRecord:
        return _to_record(self._get_row(c, _COLUMNS, session_id))

    def _update(self, session_id: str, fields: dict[str, Any]) -> SessionRecord:
        names = sorted(fields)
        values = [_json(fields[n]) if n in _JSON_FIELDS else fields[n] for n in names]
        assignments = "".join(f"{n} = ?, " for n in names)
        with self._tx() as c:
            cur = c.execute(
                f"UPDATE sessions SET {assignments}updated_at = ? WHERE id = ?",
                (*values, time.time(), session_id),
            )
            if cur.rowcount == 0:
                raise _unknown(session_id)
            return self._record(c, session_id)

    def _delete(self, session_id: str) -> None:
        with self._tx() as c:
            # Not while another live process runs a turn in it (SessionBusy): that turn and
            # every later prompt there would fail on a session gone under them.
            self._get_row(c, "1", session_id)  # an unknown id says so
            locks.take(c, session_id, self._token, time.time())
            if c.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount == 0:
                raise _unknown(session_id)

    def _list(
        self, cwd: str | None, limit: int, after: tuple[float, str] | None
    ) -> tuple[list[SessionRecord], str | None]:
        where, params = [], []
        if cwd is not None:
            where.append("cwd = ?")
            params.append(cwd)
        if after is not None:
            where.append("(updated_at < ? OR (updated_at = ? AND id > ?))")
            params += [after[0], after[0], after[1]]
        sql = f"SELECT {_COLUMNS} FROM sessions"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY updated_at DESC, id LIMIT ?"
        rows = self._conn.execute(sql, (*params, limit + 1)).fetchall()
        cursor = None
        if len(rows) > limit:
            rows = rows[:limit]
            cursor = _encode_cursor(rows[-1][4], rows[-1][0])
        return [_to_record(row) for row in rows], cursor

    def _fork(self, source_id: str, new_id: str) -> SessionRecord:
        now = time.time()
        with self._tx() as c:
            if c.execute("SELECT 1 FROM sessions WHERE id = ?", (new_id,)).fetchone():
                raise StoreError(f"session {new_id!r} already exists")
            copied = c.execute(
                "INSERT INTO sessions SELECT ?, cwd, title, ?, ?, model, mode, todos, files,"
                " config, message_count, context_from, context_head FROM sessions WHERE id = ?",
                (new_id, now, now, source_id),
            ).rowcount
            if copied == 0:
                raise _unknown(source_id)
            c.execute(
                "INSERT INTO entries SELECT ?, seq, message, in_context FROM entries WHERE session_id = ?",
                (new_id, source_id),
            )
            return self._record(c, new_id)

    def _append(self, session_id: str, messages: list[Message], in_context: bool) -> None:
        texts = [_dump(m) for m in messages]
        with self._tx() as c:
            start = self._get_row(c, "message_count", session_id)[0]
            flag = int(in_context)
            c.executemany(
                "INSERT INTO entries VALUES (?, ?, ?, ?)",
                [(session_id, start + i, t, flag) for i, t in enumerate(texts)],
            )
            c.execute(
                "UPDATE sessions SET message_count = ?, updated_at = ? WHERE id = ?",
                (start + len(texts), time.time(), session_id),
            )

    def _set_context(self, session_id: str, messages: list[Message]) -> None:
        wanted = [_dump(m) for m in messages]
        with self._tx() as c:
            start, count = self._get_row(c, "context_from, message_count", session_id)
            # Keep the longest tail of the in-context entries that `messages` ends with.
            kept, first = len(wanted), count
            cur = c.execute(
                "SELECT seq, message FROM entries WHERE session_id = ? AND seq >= ?"
                " AND in_context = 1 ORDER BY seq DESC",
                (session_id, start),
            )
            for seq, text in cur:
                if kept == 0 or wanted[kept - 1] != text:
                    break
                kept, first = kept - 1, seq
            cur.close()
            c.execute(
                "UPDATE sessions SET context_head = ?, context_from = ?, updated_at = ? WHERE id = ?",
                ("[" + ",".join(wanted[:kept]) + "]", first, time.time(), session_id),
            )

    def _load_context(self, session_id: str) -> list[Message]:
        conn = self._conn
        self._seen(conn, session_id)
        head, start = self._get_row(conn, "context_head, context_from", session_id)
        rows = conn.execute(
            "SELECT message FROM entries WHERE session_id = ? AND seq >= ? AND in_context = 1 ORDER BY seq",
            (session_id, start),
        )
        return [_load(d) for d in json.loads(head)] + [_load(json.loads(t)) for (t,) in rows]

    def _load_both(self, session_id: str) -> tuple[list[Message], list[Message]]:
        conn = self._conn
        self._seen(conn, session_id)
        head, start = self._get_row(conn, "context_head, context_from", session_id)
        rows = conn.execute(
            "SELECT seq, in_context, message FROM entries WHERE session_id = ? ORDER BY seq", (session_id,)
        ).fetchall()
        transcript = [_load(json.loads(t)) for (_, _, t) in rows]
        context = [_load(d) for d in json.loads(head)]
        context += [m for (seq, inc, _), m in zip(rows, transcript, strict=True) if seq >= start and inc]
        return context, transcript

    def _load_transcript(self, session_id: str) -> list[Message]:
        conn = self._conn
        self._get_row(conn, "1", session_id)
        rows = conn.execute("SELECT message FROM entries WHERE session_id = ? ORDER BY seq", (session_id,))
        return [_load(json.loads(t)) for (t,) in rows]

    def _seen(self, c: sqlite3.Connection, session_id: str) -> None:
        self._generations[session_id] = locks.seen(c, session_id, self._token)

    def _lock(self, session_id: str, now: float) -> bool:
        with self._tx() as c:
            self._get_row(c, "1", session_id)
            generation, took_over = locks.take(c, session_id, self._token, now)
        # A holder that is gone may have written anything since this store read.
        stale = took_over or self._generations.get(session_id) != generation
        self._generations[session_id] = generation + 1
        return stale

    def _unlock(self, session_id: str) -> None:
        with self._tx() as c:
            generation = locks.release(c, session_id, self._token)
        if generation is not None:  # else it was taken over meanwhile: the next lock reloads
            self._generations[session_id] = generation

    def _release_all(self) -> None:
        with self._tx() as c:
            locks.release_all(c, self._token)

    def _touch(self, now: float) -> None:
        with self._tx() as c:
            locks.touch(c, self._token, now)

    @staticmethod
    def _get_row(c: sqlite3.Connection, columns: str, session_id: str) -> tuple[Any, ...]:
        row = c.execute(f"SELECT {columns} FROM sessions WHERE id = ?", (session_id,)).fetchone()
        if row is None:
            raise _unknown(session_id)
        return tuple(row)


class _Slot:
    __slots__ = ("conn",)

    def __init__(self) -> None:
        self.conn: sqlite3.Connection | None = None


def _close(slot: _Slot) -> None:
    conn, slot.conn = slot.conn, None
    if conn is not None:
        with suppress(sqlite3.Error):
            conn.close()


def _work(jobs: SimpleQueue[Callable[[], None] | None]) -> None:
    while (job := jobs.get()) is not None:
        job()
        del job  # while waiting for the next job, hold no reference to the store


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller was cancelled; the job ran anyway
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _unknown(session_id: str) -> StoreError:
    return StoreError(f"unknown session {session_id!r}")


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise StoreError(f"not JSON-serializable: {exc}") from exc


def _dump(message: Message) -> str:
    """Canonical JSON, so equal messages have equal text (set_context compares text)."""
    return _json(message.to_dict())


def _load(d: dict[str, Any]) -> Message:
    try:
        return Message.from_dict(d)
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreError(f"corrupt message in store: {exc!r}") from exc


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


def _from_iso(text: str) -> float:
    try:
        when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise StoreError(f"bad timestamp {text!r}: {exc}") from exc
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def _to_record(row: Sequence[Any]) -> SessionRecord:
    sid, cwd, title, created, updated, model, mode, todos, files, config, count = row
    return SessionRecord(sid, cwd, title, _iso(created), _iso(updated), model, mode,
                         *map(json.loads, (todos, files, config)), count)  # fmt: skip


def _encode_cursor(updated_at: float, session_id: str) -> str:
    raw = json.dumps([updated_at.hex(), session_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        ts, sid = json.loads(raw)
        return float.fromhex(ts), str(sid)
    except (ValueError, TypeError) as exc:
        raise StoreError(f"invalid cursor {cursor!r}") from exc
