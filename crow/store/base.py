"""What crow needs from a session store, whatever the database: `Store`, `SessionRecord`,
and the optional `SideRecords` (project rules and checkpoints kept in the database).

`crow.store.sqlite.SQLiteStore` and `crow.store.postgres.PostgresStore` implement `Store`,
both with `crow.store._codec`'s message and cursor formats; only `PostgresStore` implements
`SideRecords`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

if TYPE_CHECKING:
    from crow.messages import Message

# The record every store returns (re-exported here, where the protocol names it).
from crow.store.record import UPDATABLE, SessionRecord  # noqa: F401


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
    - A context rewrite keeps the context it replaced, so `context_at` can answer for any
      entry stored since.
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
    async def delete_session(self, session_id: str) -> list[str]:
        """Delete a session and its subagents' sessions (theirs too): the ids deleted, it first."""
    async def list_sessions(
        self, *, cwd: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[SessionRecord], str | None]:
        """A page of the top-level sessions, most recently updated first."""
    async def descendants(self, ids: Sequence[str]) -> list[SessionRecord]:
        """The sessions under `ids` (a page's): subagents' sessions, theirs, ..., oldest first."""
    async def fork_session(self, source_id: str, new_id: str) -> SessionRecord: ...
    async def match_ids(self, prefix: str, limit: int = 10) -> list[tuple[str, str]]:
        """(id, title) of the session `prefix` names exactly, else of up to `limit` whose id
        starts with it, in id order."""
    async def short_ids(self, ids: Sequence[str], minimum: int = 8) -> dict[str, str]:
        """Each id's shortest prefix, at least `minimum` long, no other session's id starts with."""

    async def append(
        self, session_id: str, messages: Sequence[Message], *, in_context: bool = True
    ) -> None: ...
    async def set_context(self, session_id: str, messages: Sequence[Message]) -> None: ...
    async def rewind_context(self, session_id: str, messages: Sequence[Message], marker: Message) -> None:
        """`set_context(messages)` and `append([marker], in_context=False)` as one write."""
    async def context_at(self, session_id: str, seq: int) -> list[Message]:
        """The context just before transcript entry `seq` was appended, across every
        rewrite since (each rewrite keeps what it replaced)."""
    async def load_context(self, session_id: str) -> list[Message]: ...
    async def load_transcript(self, session_id: str) -> list[Message]: ...
    async def load_both(self, session_id: str) -> tuple[list[Message], list[Message]]: ...

    async def lock_session(self, session_id: str) -> bool: ...
    async def unlock_session(self, session_id: str) -> None: ...


@runtime_checkable
class SideRecords(Protocol):
    """What a store may keep beside the sessions (`PostgresStore` does; `SQLiteStore` does
    not: there these stay files in CROW_HOME). Crow uses them when `isinstance(store,
    SideRecords)`. Errors are `StoreError`, as for `Store`."""

    async def project_rules(self, project: str) -> list[str]:
        """The allow rules granted for `project` (a project folder), in the order added."""
    async def add_project_rules(self, project: str, rules: Sequence[str]) -> None:
        """Add rules to `project`'s (each rule kept once)."""
    async def save_checkpoint(self, session_id: str, turn_id: str, record: str) -> None:
        """Keep `record` (JSON text) as the checkpoint of `turn_id`, replacing one saved before."""
    async def load_checkpoint(self, session_id: str, turn_id: str) -> str | None: ...
    async def checkpoint_turns(self, session_id: str) -> list[str]:
        """The turns with a checkpoint, oldest first."""
    async def forget_checkpoints(self, session_id: str, turn_ids: Sequence[str] | None = None) -> None:
        """Drop those turns' checkpoints (None: every one of the session's)."""
    async def copy_checkpoints(self, source_id: str, new_id: str) -> None:
        """Give `new_id` (a fork) a copy of `source_id`'s checkpoints, in their order."""
