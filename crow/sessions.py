"""Sessions coming into memory, under the project config of their cwd: a new one
(`new_session`), or a stored one read back (`read_session`: its record and model context,
and the transcript for a replay) and `repair`ed when a crash or an older crow left it
unsendable. The agent restores one `Session` per id (`LockPerKey`)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import anyio

from crow.errors import SessionBusy, SessionError
from crow.messages import Message, Messages, valid_text
from crow.pricing import known_cost
from crow.roots import beside, checked_directories
from crow.session import Session
from crow.trust import PROJECT, SessionProject


def new_session(
    cwd: str | Path,
    session_id: str | None,
    project_for: Callable[[Path], SessionProject],
    dirs: Sequence[object] = (),
) -> Session:
    """A new session in `cwd` with the other roots `dirs` (checked first: `RootsError`)."""
    path = Path(cwd)
    if not path.is_absolute():
        raise SessionError(f"cwd must be an absolute path, got {str(cwd)!r}")
    if valid_text(str(cwd)) != str(cwd):  # it could not be stored: refuse, not fail later
        raise SessionError(f"cwd must be valid Unicode, got {str(cwd)!r}")
    roots = checked_directories(dirs)
    project = project_for(path)
    session = Session(
        id=session_id or uuid.uuid4().hex,
        cwd=path,
        mode=project.config.mode,
        model=project.config.model or "",
        config=project.config,
        additional_directories=beside(path, roots),
    )
    session.state[PROJECT] = project
    return session


async def read_session(
    store: Any,
    session_id: str,
    cwd: str | None,
    project_for: Callable[[Path], SessionProject],
    with_transcript: bool,
) -> tuple[Session, list[Message] | None]:
    """The session as stored (`cwd` overrides the stored one) and, if asked, its transcript."""
    record = await store.get_session(session_id) if store else None
    if record is None:
        raise SessionError(f"unknown session {session_id!r}")
    transcript: list[Message] | None = None
    if with_transcript:
        stored, transcript = await store.load_both(session_id)
    else:
        stored = await store.load_context(session_id)
    path = Path(cwd or record.cwd)
    project = project_for(path)
    session = Session(
        id=session_id,
        cwd=path,
        mode=record.mode or project.config.mode,
        model=record.model or "",
        title=record.title or "",
        cost=known_cost(record.cost),
        thought_level=record.thought_level or "",
        todos=list(record.todos or []),
        files=dict(record.files or {}),
        messages=Messages(stored),
        config=project.config,
        store=store,
        additional_directories=beside(path, list(record.additional_directories)),
        parent_id=record.parent_id,
    )
    session.state[PROJECT] = project
    return session, transcript


async def repair(session: Session, transcript: list[Message] | None) -> None:
    """A crash left tool calls without results, or an older crow stored an image no provider
    takes: repair, durably, holding the session; not while another crow process runs a turn
    in it (its results are on the way). The answers added join `transcript` too."""
    if not Session.needs_repair(session.messages):
        return
    with suppress(SessionBusy):
        async with session.exclusive():
            added = await session.repair()
            if transcript is not None:
                transcript.extend(added)


class LockPerKey:
    """One anyio lock per key, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, anyio.Lock] = {}

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock = self._locks.setdefault(key, anyio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.locked():  # a waiter would own it by now
                self._locks.pop(key, None)
