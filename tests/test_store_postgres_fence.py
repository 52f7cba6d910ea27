"""A PostgreSQL store whose session lock went with its connection, and was taken meanwhile
by another process: its turn there must not write into the new holder's (two writers of one
history)."""

from __future__ import annotations

import pytest

from crow.errors import StoreError
from crow.messages import ai, human
from crow.store.postgres import PostgresStore
from tests.test_store_postgres import sql

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"




def drop_lock_connection(url: str, store: PostgresStore) -> None:
    """Terminate the store's lock connection, and wait until its backend is gone (with it
    the advisory locks): pg_terminate_backend's timeout waits for that."""
    pid = store._locks.conn.info.backend_pid  # type: ignore[union-attr]
    assert sql(url, "SELECT pg_terminate_backend(%s, 30000)", (pid,)) == [(True,)]


async def test_a_turn_whose_lock_was_taken_over_cannot_write_into_the_new_holders(pg_url: str) -> None:
    async with PostgresStore(pg_url) as a, PostgresStore(pg_url) as b:
        await a.create_session(id="s", cwd="/w")
        await a.lock_session("s")
        await a.append("s", [human("a's prompt")])
        drop_lock_connection(pg_url, a)
        assert await b.lock_session("s") is True  # a's lock went with its connection
        await b.load_context("s")
        with pytest.raises(
            StoreError, match=r"session s: its lock was lost; pid \d+ on .* runs a turn in it now"
        ):
            await a.append("s", [ai("a's late answer")])
        with pytest.raises(StoreError, match="its lock was lost"):
            await a.set_context("s", [human("a's compaction")])
        with pytest.raises(StoreError, match="its lock was lost"):
            await a.rewind_context("s", [], human("a's rewind"))
        await b.update_session("s", todos=[{"content": "b's plan", "status": "pending"}])
        with pytest.raises(StoreError, match="its lock was lost"):
            await a.update_session("s", todos=[], cost=9.0)  # a's late todos and cost
        assert (await b.get_session("s")).todos == [{"content": "b's plan", "status": "pending"}]  # type: ignore[union-attr]
        await b.append("s", [ai("b's answer")])
        assert [m.content for m in await b.load_transcript("s")] == ["a's prompt", "b's answer"]
        assert [m.content for m in await b.load_context("s")] == ["a's prompt", "b's answer"]
        await a.unlock_session("s")  # a's turn ends: b's lock and writes stay
        await b.append("s", [ai("b's still")])
        await b.unlock_session("s")
        assert await a.lock_session("s") is True
        await a.append("s", [human("a again")])  # its own lock again: it writes


async def test_writes_without_the_lock_are_not_fenced(pg_url: str) -> None:
    async with PostgresStore(pg_url) as a, PostgresStore(pg_url) as b:
        await a.create_session(id="s", cwd="/w")
        await a.lock_session("s")
        await b.append("s", [human("b holds no lock: as on SQLite")])
        await b.update_session("s", title="b's title")
        await a.unlock_session("s")
        assert await b.lock_session("s") is True
        await a.append("s", [human("nor a")])
        assert len(await a.load_transcript("s")) == 2


async def test_a_refused_save_is_not_in_force_in_memory_either(pg_url: str) -> None:
    """A mode the store refused (the lock taken over meanwhile) must not stay in force in
    this process, as the editor was told it failed."""
    from pathlib import Path

    from crow.session import Session

    async with PostgresStore(pg_url) as a, PostgresStore(pg_url) as b:
        await a.create_session(id="s", cwd="/w")
        session = Session(id="s", cwd=Path("/w"), store=a)
        async with session.exclusive():
            mode, cost = session.mode, session.cost
            drop_lock_connection(pg_url, a)
            assert await b.lock_session("s") is True
            with pytest.raises(StoreError, match="its lock was lost"):
                await session.save(mode="yolo", cost=5.0)
            assert (session.mode, session.cost) == (mode, cost)
