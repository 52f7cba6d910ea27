"""A PostgreSQL store that can get no connection (max_connections, a role's connection
limit reached by many crow processes): a clear error naming the server's reason, soon, never
a hang, and never the URL's password."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from crow.errors import StoreError
from crow.store.postgres import PostgresStore

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_no_connection_left_says_why(postgres: Any, pg_url: str) -> None:
    role, db = f"r_{uuid.uuid4().hex[:8]}", pg_url.split("@/")[1].split("?")[0]
    # The store's lock connection gets the one connection allowed; its pool none.
    postgres.psql(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 1; ALTER DATABASE {db} OWNER TO {role}")
    url = pg_url.replace("postgres@/", f"{role}:pa55-w0rd@/")  # trust: the password is unused
    store = PostgresStore(url)
    store.wait = 0.5
    with pytest.raises(StoreError) as refused:
        await store.open()
    said = str(refused.value)
    assert said.startswith("cannot reach the PostgreSQL store at ") and "no connection within 0.5 s: " in said
    assert f'too many connections for role "{role}"' in said
    assert "pa55-w0rd" not in said


async def test_a_pool_busy_in_this_process_says_so(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    store.wait, store.max_size = 0.5, 1
    async with store:
        assert store._pool is not None
        async with store._pool.connection():  # this process's one pooled connection, taken
            with pytest.raises(StoreError) as busy:
                await store.get_session("s")
    assert str(busy.value).endswith(": no connection within 0.5 s")
