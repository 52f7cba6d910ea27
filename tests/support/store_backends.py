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


class StoreFactory:
    """`factory()`: a new, unopened store on one database; `factory.code`: the Python
    expression that makes one (for a child process), its import included."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __call__(self) -> Any:
        scope: dict[str, Any] = {}
        exec(f"store = {self.code}", scope)
        return scope["store"]


@pytest.fixture(params=BACKENDS)
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Any]:
    """`new_store()`: a new, unopened store on this test's database (call it twice for two
    stores, as two processes would have)."""
    if request.param == "sqlite":
        return StoreFactory(f"__import__('crow.store').store.SQLiteStore({str(tmp_path / 'crow.db')!r})")
    url = request.getfixturevalue("pg_url")
    return StoreFactory(f"__import__('crow.store.postgres').store.postgres.PostgresStore({url!r})")


def is_postgres(store: Store) -> bool:
    return type(store).__name__ == "PostgresStore"
