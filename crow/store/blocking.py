"""`BlockingStore`: an async `Store`'s methods called without an event loop, for the
one-shot commands (`crow sessions list|show|delete|export` on a PostgreSQL store; on the
SQLite file they use `DirectStore`, which needs no loop at all)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from crow.store.base import Store


class BlockingStore:
    """`with BlockingStore(store) as s:`: `s.method(...)` runs `store.method(...)` to its
    end on one event loop kept for the whole block (the store's pool lives on it)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._runner = asyncio.Runner()

    def __enter__(self) -> BlockingStore:
        try:
            self._runner.run(self._store.open())
        except BaseException:
            self._runner.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self._runner.run(self._store.aclose())
        finally:
            self._runner.close()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._store, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._runner.run(method(*args, **kwargs))

        return call
