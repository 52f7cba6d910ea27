"""End to end: `$/cancel_request` (schema 1.25) through the Python client and the TypeScript
SDK client. A prompt cancelled by its request id ends as `session/cancel` ends it
(`cancelled`, the history settled); an id that names nothing in flight is ignored."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import acp
import pytest

from tests.conftest import crow_env, initialize_125, spawn_crow
from tests.llm_server import Reply, ScriptedLLM
from tests.support.ts_client import run_script

pytestmark = pytest.mark.anyio

SLOW = Reply(text=" ".join(f"w{i}" for i in range(200)), chunk_delay=0.05)  # ~10 s of words


def start(conn: Any, coro_of: Any) -> tuple[int, asyncio.Task[Any]]:
    """Send a request now; its JSON-RPC id (what `$/cancel_request` names) and its task."""
    rid = conn._conn._next_request_id
    task = asyncio.create_task(coro_of())
    return rid, task


async def cancel_request(conn: Any, rid: Any) -> None:
    await conn._conn.send_notification("$/cancel_request", {"requestId": rid})


async def until_text(client: Any, sid: str, after: int = 0) -> None:
    """Until the model's text in `sid` runs past its first `after` characters (a replay's)."""
    for _ in range(200):
        if len(client.text(sid)) > after:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("no text from the model")


async def test_a_prompt_cancelled_by_its_request_id_ends_cancelled(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(SLOW)
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await initialize_125(conn)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        rid, turn = start(conn, lambda: conn.prompt(session_id=sid, prompt=[acp.text_block("talk")]))
        await until_text(client, sid)
        await cancel_request(conn, rid + 1000)  # names nothing: ignored, the turn goes on
        await asyncio.sleep(0.2)
        assert not turn.done()
        await cancel_request(conn, rid)
        response = await asyncio.wait_for(turn, 10)
        assert response.stop_reason == "cancelled"
        shown = client.text(sid)
        assert "w199" not in shown
        # the history is settled: what was shown is kept, marked; the session goes on
        llm.push(Reply(text="again"))
        again = await conn.prompt(session_id=sid, prompt=[acp.text_block("go on")])
        assert again.stop_reason == "end_turn"
        sent = llm.requests[-1].messages
        assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
        assert sent[2]["content"].startswith(shown.split(" w")[0]) and "interrupted" in sent[2]["content"]


async def test_cancel_request_for_unknown_or_finished_ids_changes_nothing(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        await initialize_125(conn)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        done_rid = conn._conn._next_request_id
        assert (await conn.prompt(session_id=sid, prompt=[acp.text_block("one")])).stop_reason == "end_turn"
        for rid in (done_rid, 10_000, "not-a-request", -1):
            await cancel_request(conn, rid)
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("two")])
        assert response.stop_reason == "end_turn"
        assert len(llm.requests) == 2


async def test_a_compaction_cancelled_by_its_request_id_answers_request_cancelled(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        await initialize_125(conn)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        for text in ("one", "two", "three"):
            await conn.prompt(session_id=sid, prompt=[acp.text_block(text)])
        llm.push(SLOW)  # the summary
        rid, compact = start(conn, lambda: conn.ext_method("crow.compact", {"sessionId": sid}))
        await asyncio.to_thread(llm.wait_for_requests, 4, 10)  # the summary is being written
        await cancel_request(conn, rid)
        with pytest.raises(acp.RequestError) as info:
            await asyncio.wait_for(compact, 10)
        assert info.value.code == -32800
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("four")])
        assert response.stop_reason == "end_turn"
        assert [m["content"] for m in llm.requests[-1].messages if m["role"] == "user"] == [
            "one",
            "two",
            "three",
            "four",
        ], "the context is as it was"


def test_cancel_request_through_the_typescript_client(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    llm.rule(lambda r: "slow" in r.last_user_text, SLOW)
    prompt = {"sessionId": "${s.sessionId}", "prompt": [{"type": "text", "text": "slow"}]}
    out = run_script(
        {
            "steps": [
                {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "s"},
                {"request": "session/prompt", "params": prompt, "as": "p", "wait": False},
                {"until": "agent_message_chunk"},
                {"notify": "$/cancel_request", "params": {"requestId": 424242}},
                {"sleep": 200},
                {"notify": "$/cancel_request", "params": {"requestId": "${p.id}"}},
                {"await": "p"},
                {
                    "request": "session/prompt",
                    "params": {**prompt, "prompt": [{"type": "text", "text": "quick"}]},
                    "as": "after",
                },
            ]
        },
        crow_env(llm, home),
        workspace,
    )
    res = out["results"]
    assert res["p"] == {"result": {"stopReason": "cancelled"}}
    assert res["after"]["result"]["stopReason"] == "end_turn"
