"""The session store: conversations that survive restarts, crashes and compaction.

    base.py      the interface: `Store` (a Protocol every backend implements), `SessionRecord`
    sqlite.py    `SQLiteStore`, the default backend (one file, WAL)
    _worker.py   the one thread that owns a SQLite connection and runs every call on it
    _schema.py   the SQLite tables and pragmas, opening and checking the file
    _queries.py  the SQL of each store operation (runs on the worker)
    _codec.py    message JSON, timestamps, list cursors (any backend)
    locks.py     who holds a session: process tokens, liveness, the lock rows

Only this package imports `sqlite3`; no sqlite3 exception leaves it (`StoreError`).
"""

from crow.store._schema import SCHEMA_VERSION
from crow.store.base import SessionRecord, Store
from crow.store.sqlite import SQLiteStore

__all__ = ["SCHEMA_VERSION", "SQLiteStore", "SessionRecord", "Store"]
