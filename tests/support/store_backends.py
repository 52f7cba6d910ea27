"""Both session stores for the contract tests: the `new_store` fixture is a factory of
unopened stores on one database (a SQLite file, or a fresh PostgreSQL database of the
`postgres` cluster), parametrized over the two backends. Import it into a test module
(`from tests.support.store_backends import new_store`) to run its tests on both."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crow.store.base import Store

BACKENDS = ["sqlite", "postgres"]


@pytest.fixture(params=BACKENDS)
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Any]:
    """`new_store()`: a new, unopened store on this test's database (call it twice for two
    stores, as two processes would have)."""
    if request.param == "sqlite":
        from crow.store import SQLiteStore

        db = tmp_path / "crow.db"
        return lambda: SQLiteStore(db)
    from crow.store.postgres import PostgresStore

    url = request.getfixturevalue("pg_url")
    return lambda: PostgresStore(url)


def is_postgres(store: Store) -> bool:
    return type(store).__name__ == "PostgresStore"
