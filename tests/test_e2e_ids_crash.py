"""End to end: message ids after crow is killed (SIGKILL) mid-stream. The restarted crow's
loads show the same ids every time, one per message, the answers' ids as they were shown
live; the next turn's messages get ids of their own."""

from __future__ import annotations

from pathlib import Path

import acp
import anyio
import pytest

from tests.conftest import crow_env, spawn_crow
from tests.llm_server import Reply, ScriptedLLM
from tests.test_e2e_ids import ChunkWatch, by_id, chunks, load_twice, start

pytestmark = pytest.mark.anyio


async def test_ids_after_a_kill_mid_stream_are_stable_and_unique(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(
        Reply(text="the first answer", chunk_size=100),
        Reply(text="one two three four five six seven eight nine ten", chunk_delay=0.2),
    )
    env = crow_env(llm, home)
    client = ChunkWatch(3)
    async with spawn_crow(env, client=client) as (conn, proc, _client):
        sid = await start(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("one")])
        async with anyio.create_task_group() as tg:
            tg.start_soon(conn.prompt, sid, [acp.text_block("count")])
            with anyio.fail_after(20):
                await client.streaming.wait()  # the first answer's chunk and one of the second
            proc.kill()
            tg.cancel_scope.cancel()
    live = by_id(chunks(client.updates))
    (first, _), (killed, _) = live.items()
    llm.reset()
    loads = await load_twice(env, workspace, sid)
    assert list(loads[0].items()) == list(loads[1].items()), "two loads show the same ids"
    shown = list(loads[0].items())
    assert [parts for _, parts in shown][:3] == [
        {"user": "one"},
        {"agent": "the first answer"},
        {"user": "count"},
    ]
    assert shown[1][0] == first
    assert len({mid for mid, _ in shown}) == len(shown), "every message has an id of its own"

    llm.push(Reply(text="after the crash"))
    async with spawn_crow(env) as (conn, _proc, client2):
        await conn.initialize(protocol_version=1)
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        before = len(client2.updates)
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("again")])
        assert response.stop_reason == "end_turn"
        ((new_id, parts),) = by_id(chunks(client2.updates[before:])).items()
    assert parts == {"agent": "after the crash"}
    assert new_id not in {mid for mid, _ in shown} | {killed}
    final = await load_twice(env, workspace, sid)
    assert list(final[0].items()) == list(final[1].items())
    ids = [mid for mid, _ in final[0].items()]
    assert len(set(ids)) == len(ids) and ids[: len(shown)] == [mid for mid, _ in shown]
