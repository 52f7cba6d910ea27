"""A write whose answer never came back (the connection broke after the server had done
it): the session cannot tell whether the store holds it, so its next turn reads the store
again, and memory and store agree from then on. A real PostgreSQL server behind a relay
that loses the answer (tests/support/pg_relay.py); and each kind of session write, through
a store that does the write and then says it failed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crow.errors import StoreError
from crow.messages import Message, ToolCall, ai, close_dangling_tool_calls, human, tool_msg, validate
from crow.session import Session
from crow.store import SQLiteStore
from crow.store.postgres import PostgresStore
from tests.support.pg_relay import LosingRelay

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def relay(postgres: Any, tmp_path: Path) -> Iterator[LosingRelay]:
    folder = tmp_path / "relay"
    folder.mkdir()
    relay = LosingRelay(Path(postgres.sockdir) / f".s.PGSQL.{postgres.port}", folder)
    yield relay
    relay.close()


async def test_a_write_whose_answer_was_lost_is_read_back_at_the_next_turn(
    postgres: Any, pg_url: str, relay: LosingRelay
) -> None:
    through_relay = pg_url.replace(f"host={postgres.sockdir}", f"host={relay.path.parent}")
    async with PostgresStore(through_relay) as store, PostgresStore(pg_url) as direct:
        await store.create_session(id="s", cwd="/w")
        session = Session(id="s", cwd=Path("/w"), store=store)
        async with session.exclusive():
            await session.add(human("hello"), ai("hi"))
        relay.cut_after(b"LOST-ANSWER")
        async with session.exclusive():
            with pytest.raises(StoreError):
                await session.add(human("LOST-ANSWER: done, but crow never heard back"))
        assert relay.cuts == 1
        stored = [m.content for m in await direct.load_context("s")]
        assert stored == ["hello", "hi", "LOST-ANSWER: done, but crow never heard back"]
        async with session.exclusive():
            assert [m.content for m in session.messages] == stored
            await session.add(human("next"))
        assert [m.content for m in await direct.load_context("s")] == [*stored, "next"]


class LosingStore(SQLiteStore):
    """Does the write, then says it failed, once (`lose`: which write)."""

    lose = ""

    def _lost(self, what: str) -> None:
        if self.lose == what:
            self.lose = ""
            raise StoreError("cannot reach the store: connection lost (the write was done)")

    async def append(self, session_id: str, messages: Any, *, in_context: bool = True) -> None:
        await super().append(session_id, messages, in_context=in_context)
        self._lost("append")

    async def rewind_context(self, session_id: str, messages: Any, marker: Message) -> None:
        await super().rewind_context(session_id, messages, marker)
        self._lost("rewind")

    async def update_session(self, session_id: str, **fields: Any) -> None:
        await super().update_session(session_id, **fields)
        self._lost("update")


async def test_a_tool_result_stored_twice_after_a_lost_answer_is_kept_once(tmp_path: Path) -> None:
    # The result's write was done but said it failed; the failed turn's clean-up answered
    # the call again ("failed"). Read back, the call had two results: no provider takes that.
    async with LosingStore(tmp_path / "crow.db") as store:
        await store.create_session(id="s", cwd="/w")
        session = Session(id="s", cwd=Path("/w"), store=store)
        async with session.exclusive():
            await session.add(human("list"), Message("assistant", "", tool_calls=(ToolCall("c1", "ls", {}),)))
            store.lose = "append"
            with pytest.raises(StoreError):
                await session.add(tool_msg("c1", "ls", "a.py"))
            n = len(session.messages)  # the loop's clean-up (`Turn._close_dangling`)
            await session.add(*close_dangling_tool_calls(list(session.messages), "failed")[n:])
        async with session.exclusive():
            validate(session.messages)
            assert [m.content for m in session.messages] == ["list", "", "a.py"]
        assert [m.content for m in await store.load_context("s")] == ["list", "", "a.py"]


async def test_a_rewind_and_a_save_whose_answers_were_lost_are_read_back(tmp_path: Path) -> None:
    async with LosingStore(tmp_path / "crow.db") as store:
        await store.create_session(id="s", cwd="/w")
        session = Session(id="s", cwd=Path("/w"), store=store)
        async with session.exclusive():
            await session.add(human("one"), ai("two"))
        store.lose = "rewind"
        async with session.exclusive():
            with pytest.raises(StoreError):
                await session.rewind_context([], human("[rewound]"))
            assert [m.content for m in session.messages] == ["one", "two"]
        async with session.exclusive():
            assert list(session.messages) == await store.load_context("s") == []
        store.lose = "update"
        with pytest.raises(StoreError):
            await session.save(todos=[{"id": "1", "title": "t", "status": "pending"}])
        assert session.todos == []
        async with session.exclusive():
            assert session.todos == [{"id": "1", "title": "t", "status": "pending"}]


async def test_a_lost_mode_save_is_put_back_as_memory_has_it(tmp_path: Path) -> None:
    async with LosingStore(tmp_path / "crow.db") as store:
        await store.create_session(id="s", cwd="/w", mode="ask")
        session = Session(id="s", cwd=Path("/w"), store=store, mode="ask")
        store.lose = "update"
        with pytest.raises(StoreError):
            await session.save(mode="yolo")
        assert session.unsure
        async with session.exclusive():
            record = await store.get_session("s")
            assert record is not None and session.mode == record.mode == "ask"
