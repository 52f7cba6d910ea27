"""What crow needs from a session store, whatever the database: `Store`, `SessionRecord`.

`crow.store.sqlite.SQLiteStore` implements it today; a server database (PostgreSQL) would
be a second module beside it implementing the same protocol, reusing `crow.store._codec`
for the message and cursor formats.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

if TYPE_CHECKING:
    from crow.messages import Message

# The fields `update_session` may change; the rest are the store's to keep.
UPDATABLE = frozenset({"title", "model", "mode", "todos", "files", "config"})


class SessionRecord:
    """A session's metadata, immutable. Timestamps are ISO 8601 UTC strings ("" = now, on
    create). A plain class rather than a frozen dataclass: `crow sessions list` loads this
    module, and `dataclasses` would add ~4 ms of imports (inspect, ast) to it."""

    __slots__ = _FIELDS = (
        "id", "cwd", "title", "created_at", "updated_at", "model", "mode", "todos", "files", "config",
        "message_count",
    )  # fmt: skip
    id: str
    cwd: str
    title: str
    created_at: str
    updated_at: str
    model: str | None
    mode: str | None
    todos: list[dict[str, Any]]
    files: dict[str, str]
    config: dict[str, Any]
    message_count: int

    def __init__(
        self,
        id: str,
        cwd: str,
        title: str = "",
        created_at: str = "",
        updated_at: str = "",
        model: str | None = None,
        mode: str | None = None,
        todos: list[dict[str, Any]] | None = None,
        files: dict[str, str] | None = None,
        config: dict[str, Any] | None = None,
        message_count: int = 0,
    ) -> None:
        todos, files = todos if todos is not None else [], files if files is not None else {}
        config = config if config is not None else {}
        values = (id, cwd, title, created_at, updated_at, model, mode, todos, files, config, message_count)
        for name, value in zip(self._FIELDS, values, strict=True):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"SessionRecord is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"SessionRecord is immutable: cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        if type(other) is not SessionRecord:
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self._FIELDS)

    __hash__ = None  # type: ignore[assignment]  # mutable fields (todos, files, config)

    def __repr__(self) -> str:
        return f"SessionRecord({', '.join(f'{n}={getattr(self, n)!r}' for n in self._FIELDS)})"


@runtime_checkable
class Store(Protocol):
    """A session store. Two records per session: the transcript (every message, append-only)
    and the model context (`set_context` rewrites it; the transcript stays whole).

    Contract every backend keeps:
    - `async with store:` opens and closes it; a call after close raises `StoreError`.
    - No database exception escapes: every failure is a `StoreError` (an unknown session
      names its id).
    - The event loop never waits on the database: a call may take long (another process's
      write lock, a 5,000-message fork) without delaying other tasks.
    - A write awaited to completion is durable; a write whose caller is cancelled after it
      was issued still lands.
    - `lock_session` makes one process at a time the writer of a session (raising
      `SessionBusy` naming the holder), and says whether another one wrote since this store
      last read the session.
    """

    async def open(self) -> Self: ...
    async def aclose(self) -> None: ...
    async def __aenter__(self) -> Self: ...
    async def __aexit__(self, *exc_info: object) -> None: ...

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
    async def load_both(self, session_id: str) -> tuple[list[Message], list[Message]]: ...

    async def lock_session(self, session_id: str) -> bool: ...
    async def unlock_session(self, session_id: str) -> None: ...
