"""A fork on PostgreSQL copies the source's row, entries and context history in separate
statements: a write to the source landing between them (its running turn's append, on
another pooled connection) must not make a copy whose message count disagrees with its
entries (every later append to it would collide on a seq)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from crow.messages import ai, human
from crow.store import _pg_queries as q
from crow.store.postgres import PostgresStore

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Between:
    """A connection that, once the fork's session row is copied, lets `racer` run until it
    is done or waits on a row lock (the fork's): then the fork goes on."""

    def __init__(self, conn: Any, racer: Any, url: str) -> None:
        self._conn, self._racer, self._url = conn, racer, url
        self.task: asyncio.Future[None] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    async def execute(self, sql: str, params: Any = ()) -> Any:
        cur = await self._conn.execute(sql, params)
        if sql.startswith("INSERT INTO sessions") and self.task is None:
            self.task = asyncio.ensure_future(self._racer())
            for _ in range(6000):  # polled: a lock wait is seen only in pg_stat_activity
                if self.task.done() or await self._waiting():
                    break
                await asyncio.sleep(0.005)
        return cur

    async def _waiting(self) -> bool:
        async with await psycopg.AsyncConnection.connect(self._url, autocommit=True) as probe:
            cur = await probe.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"
            )
            return (await cur.fetchone())[0] > 0  # type: ignore[index]


async def test_a_fork_racing_an_append_to_its_source_is_whole(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with PostgresStore(pg_url) as store:
        await store.create_session(id="s", cwd="/w")
        await store.append("s", [human("q"), ai("a")])
        between: list[_Between] = []
        fork = q.fork

        async def racing_fork(c: Any, source_id: str, new_id: str) -> Any:
            between.append(_Between(c, lambda: store.append("s", [human("racing")]), pg_url))
            return await fork(between[0], source_id, new_id)

        monkeypatch.setattr(q, "fork", racing_fork)
        made = await store.fork_session("s", "f")
        await between[0].task  # type: ignore[misc]
        copied = await store.load_transcript("f")
        assert made.message_count == len(copied), "the copy's count and entries agree"
        await store.append("f", [human("the fork goes on")])  # no seq collision
        assert [m.content for m in await store.load_transcript("f")][-1] == "the fork goes on"
        assert [m.content for m in await store.load_transcript("s")] == ["q", "a", "racing"]
