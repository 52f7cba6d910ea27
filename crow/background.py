"""Background work with one owner: an anyio task group, entered lazily.

`Background.start(once, work)` runs `work()` in the task group; `once` is its outcome, which
any number of tasks await (`Once.wait`) without being able to cancel the work: a waiter that
is cancelled stops waiting, nothing more. A failure is kept and re-raised to every waiter
(a broken plugin fails every prompt that needs the warm-up, each with the plugin's error).
Only `Background.cancel(once)` (a session closed) and `Background.aclose()` cancel work, and
both return once it has stopped.

The task group is entered by one host task, created by the first `start`: the first anyio
task group imports anyio's asyncio backend (~17 ms), which must stay off the path of the ACP
`initialize` and `session/new` answers. Nothing here creates an anyio object before that host
runs, and it runs after the answer that started the work has gone out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any

import anyio

from crow.errors import CrowError

log = logging.getLogger("crow.background")

Work = Callable[[], Awaitable[None]]


class Once:
    """The outcome of one piece of background work, awaited by many."""

    def __init__(self, name: str, cancelled: CrowError) -> None:
        self.name = name
        self.started = False
        self._cancelled = cancelled  # what waiters get when the work is cancelled
        self._done = False
        self._error: BaseException | None = None
        self._traceback: Any = None  # the failure's own: raising it again must not grow it
        self._event: anyio.Event | None = None  # made by the first waiter (see the module doc)
        self._scope: anyio.CancelScope | None = None
        self._cancel = False
        self._callbacks: list[Callable[[], None]] = []

    def done(self) -> bool:
        return self._done

    async def wait(self) -> None:
        """Wait for the work and re-raise its failure; cancelling this waiter leaves the
        work running for the others."""
        if not self._done:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()
        if self._error is not None:
            raise self._error.with_traceback(self._traceback)

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call `callback()` when the work ends, however it ends (at once if it has)."""
        if self._done:
            callback()
        else:
            self._callbacks.append(callback)

    def _finish(self, error: BaseException | None) -> None:
        if self._done:
            return
        self._done, self._error = True, error
        self._traceback = error.__traceback__ if error is not None else None
        if self._event is not None:
            self._event.set()
        for callback in self._callbacks:
            try:
                callback()
            except Exception:
                log.exception("callback after %s failed", self.name)

    async def _run(self, work: Work) -> None:
        from anyio.lowlevel import checkpoint  # not at import: crow.agent loads before `initialize`

        error: BaseException | None = self._cancelled
        try:
            await checkpoint()  # the answer that started this work goes out first
            with anyio.CancelScope() as self._scope:
                if not self._cancel:
                    await work()
                    error = None
        except Exception as exc:  # kept for the waiters, never raised into the task group
            error = exc
        except asyncio.CancelledError:
            # Our own cancel can outlive its scope: anyio re-delivers it while the work winds
            # down (asyncio.gather cancelling MCP connections), and the scope lets the extra
            # one out. Raised here, a CancelledError ends the whole task group silently, and
            # every later session/new fails ("task group is not active").
            if not self._cancel:
                raise
        finally:  # also when the whole group is cancelled: no waiter is left hanging
            self._finish(error)


class Background:
    """One anyio task group for all of an agent's background work."""

    def __init__(self, closed: CrowError) -> None:
        self._closed_error = closed
        self._closed = False
        self._group: Any = None  # anyio TaskGroup, once the host has entered it
        self._host: asyncio.Task[None] | None = None
        self._pending: list[tuple[Once, Work]] = []

    def start(self, once: Once, work: Work) -> Once:
        """Run `work` in the task group; its outcome goes to `once` (no-op if started)."""
        if once.started:
            return once
        if self._closed:
            raise self._closed_error
        once.started = True
        if self._group is not None:
            self._group.start_soon(once._run, work, name=once.name)
            return once
        self._pending.append((once, work))
        if self._host is None:
            # The one task crow creates itself: it exists only to enter the task group
            # after the answer in flight (see the module doc); `aclose` awaits it.
            self._host = asyncio.get_running_loop().create_task(self._run_host(), name="crow.background")
        return once

    async def _run_host(self) -> None:
        # asyncio, not anyio, until the task group exists: the answer that created this
        # host goes out first, then the backend is imported.
        await asyncio.sleep(0)
        if self._closed:
            return
        async with anyio.create_task_group() as group:
            self._group = group
            for once, work in self._pending:
                group.start_soon(once._run, work, name=once.name)
            self._pending.clear()
            await anyio.sleep_forever()

    async def cancel(self, once: Once) -> None:
        """Cancel one piece of work and wait until it has stopped (its waiters get the
        `cancelled` error given to its Once)."""
        if once.done():
            return
        once._cancel = True
        if once._scope is not None:
            once._scope.cancel()
        if not once.started or any(o is once for o, _ in self._pending):
            self._pending = [(o, w) for o, w in self._pending if o is not once]
            once._finish(once._cancelled)
            return
        with anyio.CancelScope(shield=True), suppress(Exception):  # stopped is all we wait for
            await once.wait()

    async def aclose(self) -> None:
        """Cancel all work and wait until the task group has exited (idempotent)."""
        self._closed = True
        for once, _work in self._pending:
            once._finish(once._cancelled)
        self._pending.clear()
        if self._group is not None:
            self._group.cancel_scope.cancel()
        if self._host is not None and not self._host.done():
            with anyio.CancelScope(shield=True):  # a closer being cancelled still waits
                await asyncio.wait({self._host})  # never raises the host's outcome
