"""The session store: conversations that survive restarts, crashes and compaction.

    base.py      the interface: `Store` (a Protocol every backend implements), `SessionRecord`
    sqlite.py    `SQLiteStore`, the default backend (one file, WAL)
    postgres.py  `PostgresStore`: the same protocol in a PostgreSQL database (`store:`/CROW_STORE)
    direct.py    `DirectStore`: the same SQL without an event loop, for one-shot commands
    _worker.py   the one thread that owns a SQLite connection and runs every call on it
    _schema.py   the SQLite tables and pragmas, opening the file, the sqlite3 error mapping
    _queries.py  the SQL of each store operation (runs on the worker)
    _codec.py    message JSON, timestamps, list cursors (any backend)
    locks.py     who holds a session: process tokens, liveness, the lock rows

Only this package imports `sqlite3`; no sqlite3 exception leaves it (`StoreError`). Names
load lazily: `crow.store.direct` must not pay for asyncio.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crow.config import Config
    from crow.store._schema import SCHEMA_VERSION
    from crow.store.base import SessionRecord, Store
    from crow.store.sqlite import SQLiteStore

_EXPORTS = {
    "SCHEMA_VERSION": "crow.store._schema",
    "SQLiteStore": "crow.store.sqlite",
    "SessionRecord": "crow.store.base",
    "Store": "crow.store.base",
}
__all__ = ["SCHEMA_VERSION", "SQLiteStore", "SessionRecord", "Store", "store_for"]


def store_for(config: Config) -> Store:
    """The store `config` names, not yet opened: `store:` (CROW_STORE) a postgresql:// URL
    gives a `PostgresStore`, else the SQLite file in crow's home."""
    if config.store is not None:
        from crow.store.postgres import PostgresStore

        return PostgresStore(config.store, home=config.home)
    from crow.store.sqlite import SQLiteStore

    return SQLiteStore(config.db_path, home=config.home)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'crow.store' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
