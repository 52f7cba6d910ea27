"""End to end on a PostgreSQL store: the lock connection of a crow process running a turn
is dropped (pg_terminate_backend, as a network blip or an idle-session timeout would), and
another crow process takes the session and runs a turn in it. The first turn's later writes
are refused (that turn fails with the reason): one history, one writer at a time."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import acp
import pytest

from tests.llm_server import Reply, ScriptedLLM
from tests.test_postgres_e2e import one_session_in_two_crows, replay, until

pytestmark = pytest.mark.anyio


async def test_a_turn_whose_lock_connection_dropped_cannot_write_into_the_next_holders_turn(
    llm: ScriptedLLM, postgres: Any, pg_url: str, tmp_path: Path, workspace: Path
) -> None:
    db = pg_url.split("@/")[1].split("?")[0]
    async with one_session_in_two_crows(llm, pg_url, tmp_path, workspace, "one's " * 150) as crows:
        (one, two), sid = crows, crows.sid
        conn2, client2, turn = two.conn, two.client, one.turn
        assert turn is not None
        # one's lock connection goes (and its advisory lock with it: the timeout waits)
        dropped = postgres.psql(
            "SELECT pg_terminate_backend(pid, 30000) FROM pg_locks WHERE locktype = 'advisory'"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            db,
        )
        assert dropped.split() == ["t"]
        llm.push(Reply(text="two's " * 400, chunk_delay=0.01))  # still running when one's ends
        client2.updates.clear()
        theirs = asyncio.create_task(conn2.prompt(session_id=sid, prompt=[acp.text_block("me too")]))
        await until(lambda: client2.of_type("AgentMessageChunk"))  # two runs a turn there
        with pytest.raises(acp.RequestError, match=f"session {sid}: its lock was lost; pid "):
            await asyncio.wait_for(turn, 120)
        assert (await asyncio.wait_for(theirs, 120)).stop_reason == "end_turn"
        replayed = await replay(conn2, client2, sid, workspace)
    said = [u["content"]["text"] for _, u in replayed if "content" in u and "text" in u["content"]]
    assert said == ["hello", "first", "long one", "me too", "two's " * 400]
