"""The store's one thread (aiosqlite's design): it opens the SQLite connection, runs every
call on it and closes it. The event loop only queues a job and awaits its future, so a
long statement or another process's write lock (`busy_timeout`) never stalls it.

A job is a plain function of the connection; it runs whole on the thread (one hop per
store operation, not one per statement). A job always runs once queued, even if the
awaiting task is cancelled. sqlite3 errors become `StoreError` (`_schema.call`).

A small write (`run_small`: an append, a lock) first tries without the hop, which costs
~0.09 ms on a 2-core VM, more than the write: only while no job is queued or running
(so nothing is overtaken and one thread at a time uses the connection), with
`busy_timeout` 0 (another process's write lock fails it at once, and it is queued like
any job) and with SQLite's automatic WAL checkpoint off (a checkpoint, which fsyncs, runs
on the thread every CHECKPOINT_EVERY such writes). So the loop still never waits on a
lock or a disk flush.

Calls keep the order they were made in. A small write made while jobs are queued waits
in a line on the loop until they have settled, then runs inline; a job made while small
writes wait joins the line behind them. A call in the line is issued: its caller
cancelled, it still runs in its turn, as a queued job does. Queued as jobs instead, small
writes made while writes kept coming (50 busy sessions) kept the queue from ever emptying
once a checkpoint had started it: a third of all writes hopped.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from functools import partial
from queue import SimpleQueue
from typing import Any, TypeVar

from crow.errors import StoreError
from crow.store._schema import call

T = TypeVar("T")
BUSY_TIMEOUT_MS = 5000  # what a queued job waits for another process's write lock
CHECKPOINT_EVERY = 200  # inline writes between two checkpoints on the thread
# (loop to answer on or None, future or None, function of the slot, its arguments, done)
_Job = tuple[
    asyncio.AbstractEventLoop | None,
    "asyncio.Future[Any] | None",
    Callable[..., Any],
    tuple[Any, ...],
    Callable[[], None] | None,  # told on the loop once the job has run
]


class _Slot:
    """The connection, touched by one thread at a time (the worker's, or the loop's for an
    inline write while the worker is idle), and its `busy_timeout` now (ms)."""

    __slots__ = ("busy_ms", "conn")

    def __init__(self) -> None:
        self.conn: sqlite3.Connection | None = None
        self.busy_ms = BUSY_TIMEOUT_MS  # `connect` sets it

    def busy_timeout(self, ms: int) -> None:
        """Set only when it changes: a turn's inline writes come in runs."""
        if self.conn is not None and self.busy_ms != ms:
            self.conn.execute(f"PRAGMA busy_timeout = {ms}")
            self.busy_ms = ms


class Worker:
    """`await worker.open(connect)`, `await worker.run(fn, *args)` (fn(conn, *args) on the
    thread), `await worker.close()`. The thread holds the queue and the slot, never the
    store, so an unclosed store can still be collected (and warn)."""

    def __init__(self, name: str = "crow-store") -> None:
        self._jobs: SimpleQueue[_Job | None] = SimpleQueue()
        self._slot = _Slot()
        self._thread = threading.Thread(target=_work, args=(self._jobs, self._slot), name=name, daemon=True)
        self._pending = 0  # jobs queued and not yet settled; touched on the loop thread only
        # Calls made while jobs were pending, in order: (small write, its step, its future).
        self._line: deque[tuple[bool, Callable[[asyncio.Future[Any]], None], asyncio.Future[Any]]] = deque()
        self._ended = False  # the end of the thread is queued: no job after it
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop `open` ran on
        self._inline_writes = 0

    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    async def open(self, connect: Callable[[], sqlite3.Connection]) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread.start()
        await self._submit(_open, connect)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await self.run_job(_with_connection, fn, args)

    async def run_small(self, fn: Callable[..., T], *args: Any) -> T:
        """A small write: done at once when the thread is idle and the database free, else
        after what was asked before it (see the module docstring)."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        if not (self._pending or self._line):
            self._small(fn, args, future)
            return future.result() if future.done() else await future
        return await self._in_line(True, partial(self._small, fn, args), future)

    def _small(self, fn: Callable[..., T], args: tuple[Any, ...], future: asyncio.Future[T]) -> None:
        """Run inline (its result into `future`), or queued as a job that settles `future`
        when a job is pending or another process holds the write lock."""
        conn = self._slot.conn
        if self._pending == 0 and conn is not None:
            self._slot.busy_timeout(0)  # the worker's jobs set it back (`_with_connection`)
            try:
                result = call(fn, conn, *args)
            except StoreError as exc:
                if not _busy(exc):
                    _settle(future, None, exc, None)
                    return
            else:
                self._inline_writes += 1
                if self._inline_writes % CHECKPOINT_EVERY == 0:
                    self._submit(_checkpoint).add_done_callback(_ignore)
                _settle(future, result, None, None)
                return
        self._queue(_with_connection, (fn, args), future)

    async def run_job(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(slot, *args)` on the thread, after every call made before it."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        if self._line:  # small writes made before it are waiting: it goes after them
            return await self._in_line(False, partial(self._queue, fn, args), future)
        self._queue(fn, args, future)
        return await future

    async def close(self) -> None:
        """Close the connection after every call made before, and end the thread: both
        queued in one step, so a cancelled caller cannot end the thread without the close."""
        if self._thread.is_alive() and not self._ended:
            await self._in_line(False, self._close_and_end, asyncio.get_running_loop().create_future())

    def _close_and_end(self, future: asyncio.Future[None]) -> None:
        if self._ended:  # a second close, made while the first waited its turn
            _settle(future, None, None, None)
            return
        self._queue(_close, (), future)
        self._jobs.put(None)
        self._ended = True

    def close_soon(self) -> None:
        """From `__del__` (no loop to await on): the close and the end, queued after the
        calls already made (through the loop while it runs), else at once."""
        if not self._thread.is_alive() or self._ended:
            return
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with suppress(RuntimeError):  # closed just now: queued at once below
                loop.call_soon_threadsafe(self._close_soon_in_line, loop)
                return
        self._jobs.put((None, None, _close, (), None))
        self._jobs.put(None)
        self._ended = True

    def _close_soon_in_line(self, loop: asyncio.AbstractEventLoop) -> None:
        future = loop.create_future()
        future.add_done_callback(_ignore)
        self._line.append((False, self._close_and_end, future))
        self._advance()

    def _submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue(fn, args, future)
        return future

    def _queue(self, fn: Callable[..., Any], args: tuple[Any, ...], future: asyncio.Future[Any]) -> None:
        """`fn(slot, *args)` to the thread, settling `future`."""
        if self._ended:  # the thread takes no more jobs: said, not waited for forever
            _settle(future, None, StoreError("store closed"), None)
            return
        self._pending += 1  # until the thread has run it, even if its caller is cancelled
        self._jobs.put((future.get_loop(), future, fn, args, self._job_done))

    def _job_done(self) -> None:
        self._pending -= 1
        self._advance()

    async def _in_line(
        self, small: bool, step: Callable[[asyncio.Future[Any]], None], future: asyncio.Future[T]
    ) -> T:
        """Queue `step` (which settles `future`, inline or through a job) behind the calls
        made before it. It is issued now: a cancelled caller stops waiting for it, and it
        still runs in its turn, as a queued job does."""
        self._line.append((small, step, future))
        self._advance()
        return await future

    def _advance(self) -> None:
        """Run the calls at the head of the line while they may run: a job at once (it is
        queued in order), a small write once no job is pending."""
        while self._line:
            small, step, future = self._line[0]
            if small and self._pending:
                return
            self._line.popleft()
            try:
                step(future)
            except BaseException as exc:
                _settle(future, None, exc, None)


def _work(jobs: SimpleQueue[_Job | None], slot: _Slot) -> None:
    while (job := jobs.get()) is not None:
        loop, future, fn, args, job_done = job
        del job  # while waiting for the next job, hold no reference to its arguments
        result: Any = None
        error: BaseException | None = None
        try:
            result = fn(slot, *args)
        except BaseException as exc:
            error = exc
        if loop is not None:
            with suppress(RuntimeError):  # the event loop is gone; nobody is waiting
                loop.call_soon_threadsafe(_settle, future, result, error, job_done)
        del loop, future, fn, args, result, error, job_done


def _settle(
    future: asyncio.Future[Any], result: Any, error: BaseException | None, job_done: Callable[[], None] | None
) -> None:
    """The call's caller hears first, then the calls waiting behind it may go (their
    callers resume after it, in the order the calls were made)."""
    if not future.done():  # else the caller was cancelled; the job ran anyway
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    if job_done is not None:
        job_done()


def _with_connection(slot: _Slot, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    if slot.conn is None:
        raise StoreError("store not open")
    try:
        slot.busy_timeout(BUSY_TIMEOUT_MS)
    except sqlite3.Error as exc:
        raise StoreError(f"{getattr(fn, '__name__', 'job')} failed: {exc}") from exc
    return call(fn, slot.conn, *args)


def _open(slot: _Slot, connect: Callable[[], sqlite3.Connection]) -> None:
    try:
        slot.conn = connect()
    except sqlite3.Error as exc:
        raise StoreError(f"connect failed: {exc}") from exc


def _close(slot: _Slot) -> None:
    conn, slot.conn = slot.conn, None
    if conn is not None:
        with suppress(sqlite3.Error):
            conn.close()


def _busy(exc: StoreError) -> bool:
    """Another connection holds the write lock (SQLITE_BUSY, SQLITE_LOCKED and their
    extended codes)."""
    cause = exc.__cause__
    return isinstance(cause, sqlite3.Error) and (getattr(cause, "sqlite_errorcode", 0) & 0xFF) in (5, 6)


def _checkpoint(slot: _Slot) -> None:
    if slot.conn is not None:
        slot.conn.execute("PRAGMA wal_checkpoint(PASSIVE)")


def _ignore(future: asyncio.Future[Any]) -> None:
    """A checkpoint nobody awaits: a failure is retried at the next one."""
    if not future.cancelled():
        future.exception()
