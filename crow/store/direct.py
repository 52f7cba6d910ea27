"""The store for a one-shot command with no event loop (`crow sessions list|show|delete|
export`): the same SQL as `SQLiteStore` (`crow.store._queries`), run on the calling thread
over one connection. Importing it imports neither asyncio nor the runtime, so `crow
sessions list` costs about what `crow --help` does.

Never use it inside crow's event loop: there `SQLiteStore` keeps SQLite off the loop.
"""

from __future__ import annotations

import os
import sqlite3
from typing import TYPE_CHECKING, Any, TypeVar

from crow.errors import StoreError
from crow.store import _queries as q
from crow.store import locks
from crow.store._codec import decode_cursor
from crow.store._schema import call, connect

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from crow.messages import Message
    from crow.store.record import SessionRecord

T = TypeVar("T")


class DirectStore:
    """`with DirectStore(path, home=home) as store:`; the methods are `Store`'s, not async.
    A delete takes the session's lock like `SQLiteStore`'s: refused (`SessionBusy`) while
    another crow process runs a turn in it."""

    def __init__(self, path: str | os.PathLike[str], *, home: str | os.PathLike[str] | None = None) -> None:
        self._path = str(path)
        self._home = home
        self._conn: sqlite3.Connection | None = None

    def __enter__(self) -> DirectStore:
        try:
            self._conn = connect(self._path, self._home)
        except sqlite3.Error as exc:
            raise StoreError(f"connect failed: {exc}") from exc
        return self

    def __exit__(self, *exc_info: object) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def get_session(self, session_id: str) -> SessionRecord | None:
        return self._call(q.get, session_id)

    def list_sessions(
        self, *, cwd: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[SessionRecord], str | None]:
        return self._call(q.list_page, cwd, limit, decode_cursor(cursor) if cursor else None)

    def descendants(self, ids: Sequence[str]) -> list[SessionRecord]:
        return self._call(q.descendants, ids)

    def match_ids(self, prefix: str, limit: int = 10) -> list[tuple[str, str]]:
        return self._call(q.match_ids, prefix, limit)

    def short_ids(self, ids: Sequence[str], minimum: int = 8) -> dict[str, str]:
        return self._call(q.short_ids, ids, minimum)

    def delete_session(self, session_id: str) -> list[str]:
        return self._call(q.delete, session_id, locks.process_token())

    def load_transcript(self, session_id: str) -> list[Message]:
        return self._call(q.load_transcript, session_id)

    def load_context(self, session_id: str) -> list[Message]:
        return self._call(q.load_context, session_id, "")[1]

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._conn is None:
            raise StoreError("store not open")
        return call(fn, self._conn, *args)
