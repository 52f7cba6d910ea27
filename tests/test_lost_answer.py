"""A write whose answer never came back (the connection broke after the server had done
it): the session cannot tell whether the store holds it, so its next turn reads the store
again, and memory and store agree from then on. A real PostgreSQL server behind a relay
that loses the answer (tests/support/pg_relay.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crow.errors import StoreError
from crow.messages import ai, human
from crow.session import Session
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
