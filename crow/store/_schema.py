"""The SQLite file: its tables, its pragmas, and opening it (on the worker thread).

sessions  one row per session: metadata, `message_count` (the next seq),
          `context_head` (JSON list of messages) and `context_from` (a seq),
          `additional_directories` (JSON list: the session's other workspace roots), `cost`
          (USD, NULL when a call's price was unknown), `thought_level` and `parent_id` (a
          subagent's: the session whose turn ran it; deleted with it)
entries   (session_id, seq) -> message JSON, in_context flag; append-only
context_history  each context a rewrite replaced: (session_id, until_seq, context_head,
          context_from), in force for the entries before `until_seq` (a rewind finds the
          context before any turn, across compactions: crow.rewind)
session_locks  (crow.store.locks) who runs a turn in a session, and a generation
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

from crow.errors import StoreError
from crow.private import secure_store
from crow.store import locks

T = TypeVar("T")
SCHEMA_VERSION = 5
# Written by every context rewrite (`_queries.set_context`), never by an append; rows in
# insertion order (rowid) with until_seq never decreasing.
_CONTEXT_HISTORY = (
    "CREATE TABLE context_history ("
    " session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,"
    " until_seq INTEGER NOT NULL, context_head TEXT NOT NULL, context_from INTEGER NOT NULL)",
    "CREATE INDEX context_history_by_seq ON context_history (session_id, until_seq)",
)
_SCHEMA = """
CREATE TABLE sessions (
  id TEXT PRIMARY KEY, cwd TEXT NOT NULL, title TEXT NOT NULL DEFAULT '',
  created_at REAL NOT NULL, updated_at REAL NOT NULL, model TEXT, mode TEXT,
  todos TEXT NOT NULL DEFAULT '[]', files TEXT NOT NULL DEFAULT '{}',
  config TEXT NOT NULL DEFAULT '{}', message_count INTEGER NOT NULL DEFAULT 0,
  context_from INTEGER NOT NULL DEFAULT 0, context_head TEXT NOT NULL DEFAULT '[]',
  additional_directories TEXT NOT NULL DEFAULT '[]', cost REAL DEFAULT 0, thought_level TEXT,
  parent_id TEXT REFERENCES sessions (id) ON DELETE CASCADE
);
CREATE INDEX sessions_by_parent ON sessions (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX sessions_by_time ON sessions (updated_at DESC, id);
CREATE INDEX sessions_by_cwd ON sessions (cwd, updated_at DESC, id);
CREATE TABLE entries (
  session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE, seq INTEGER NOT NULL,
  message TEXT NOT NULL, in_context INTEGER NOT NULL DEFAULT 1, PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
"""
# Each version's steps bring a store of the version before up to it, in one transaction:
# its sessions stay loadable (columns added with defaults), and an older crow then refuses
# the file.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    # 2: the session's other workspace roots.
    2: ("ALTER TABLE sessions ADD COLUMN additional_directories TEXT NOT NULL DEFAULT '[]'",),
    # 3: the session's cost in USD (NULL: unknown, as for every session with messages an
    # older crow stored: their calls were not priced) and its chosen thought level.
    3: (
        "ALTER TABLE sessions ADD COLUMN cost REAL DEFAULT 0",
        "UPDATE sessions SET cost = NULL WHERE message_count > 0",
        "ALTER TABLE sessions ADD COLUMN thought_level TEXT",
    ),
    # 4: the contexts that rewrites replaced, so a rewind can go back across a compaction
    # (a session's earlier rewrites are not known: crow.rewind takes back only turns whose
    # prompt a crow of this version stored, and those it finds).
    4: _CONTEXT_HISTORY,
    # 5: a subagent's parent session (crow's `task` tool): listed under it, deleted with it.
    5: (
        "ALTER TABLE sessions ADD COLUMN parent_id TEXT REFERENCES sessions (id) ON DELETE CASCADE",
        "CREATE INDEX sessions_by_parent ON sessions (parent_id) WHERE parent_id IS NOT NULL",
    ),
}


def call(fn: Callable[..., T], conn: sqlite3.Connection, *args: Any) -> T:
    """`fn(conn, *args)` with sqlite3's errors as `StoreError` ("append failed: ...")."""
    try:
        return fn(conn, *args)
    except (sqlite3.Error, UnicodeEncodeError) as exc:  # text not valid Unicode: a clear error
        raise StoreError(f"{fn.__name__.lstrip('_')} failed: {exc}") from exc


def connect(path: str, home: str | os.PathLike[str] | None) -> sqlite3.Connection:
    """Open (creating or checking the schema) the database at `path` (":memory:" too).
    The file is private to the user (`crow.private`); so is `home` (CROW_HOME) when given."""
    if path != ":memory:" and not path.startswith("file:"):
        secure_store(path, os.fspath(home) if home is not None else None)
    # Used by one thread at a time, not always the same: the worker, or the event loop's
    # while the worker is idle (`Worker.run_small`).
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        # Another process's write lock is waited for here, on the worker thread.
        conn.execute("PRAGMA busy_timeout = 5000")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA journal_mode = WAL")
        with transaction(conn) as c:
            version = c.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{path} has schema version {version}; this crow knows up to {SCHEMA_VERSION}"
                    " (upgrade crow)"
                )
            if version == 0:
                for statement in (*_SCHEMA.split(";"), *_CONTEXT_HISTORY):
                    if statement.strip():
                        c.execute(statement)
                c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            for step in range(version + 1, SCHEMA_VERSION + 1) if version else ():  # an older crow's
                for statement in _MIGRATIONS[step]:
                    c.execute(statement)
                c.execute(f"PRAGMA user_version = {step}")
            c.execute(locks.TABLE)
    except BaseException:
        conn.close()
        raise
    return conn


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A write transaction: BEGIN IMMEDIATE takes the write lock up front, so two writers
    wait for each other (busy_timeout) instead of failing on an upgrade deadlock."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        with suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
