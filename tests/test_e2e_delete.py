"""End to end: `session/delete` (schema 1.25) through the Python client and the TypeScript SDK
client: idle, while a turn runs, unknown ids, another crow process running a turn in it, and
every later use of a deleted id."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import acp
import anyio
import pytest

from tests.conftest import CROW, crow_env, initialize_125, raw_request, spawn_crow
from tests.llm_server import Reply, ScriptedLLM
from tests.support.ts_client import run_script
from tests.test_e2e_cancel_request import SLOW, until_text

pytestmark = pytest.mark.anyio



def rows(home: Path, session_id: str) -> dict[str, int]:
    """What the database holds for `session_id`, table by table."""
    with sqlite3.connect(home / "crow.db") as db:
        return {
            table: db.execute(f"SELECT count(*) FROM {table} WHERE {col} = ?", (session_id,)).fetchone()[0]
            for table, col in (("sessions", "id"), ("entries", "session_id"), ("session_locks", "session_id"))
        }


async def error_of(call: Any) -> acp.RequestError:
    with pytest.raises(acp.RequestError) as info:
        await call
    return info.value


async def new_session(conn: Any, workspace: Path) -> str:
    return (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id


async def test_delete_is_advertised_and_removes_an_idle_session_for_good(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        init = await initialize_125(conn)
        assert init["agentCapabilities"]["sessionCapabilities"]["delete"] == {}
        sid = await new_session(conn, workspace)
        kept = await new_session(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("remember me")])
        await conn.prompt(session_id=kept, prompt=[acp.text_block("keep me")])
        assert rows(home, sid)["entries"] == 2

        assert await raw_request(conn, "session/delete", {"sessionId": sid}) == {}

        assert rows(home, sid) == {"sessions": 0, "entries": 0, "session_locks": 0}
        listed = await conn.list_sessions()
        assert [s.session_id for s in listed.sessions] == [kept]
        for call in (
            conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[]),
            conn.resume_session(cwd=str(workspace), session_id=sid, mcp_servers=[]),
            conn.ext_method("crow.compact", {"sessionId": sid}),
            conn.prompt(session_id=sid, prompt=[acp.text_block("still there?")]),
            raw_request(conn, "session/delete", {"sessionId": sid}),  # a second delete
        ):
            error = await error_of(call)
            assert error.code == -32002 and sid in str(error), error
        # the other session is untouched and usable
        await conn.prompt(session_id=kept, prompt=[acp.text_block("still here")])
        assert rows(home, kept)["entries"] == 4


async def test_deleting_an_unknown_id_is_resource_not_found(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        await initialize_125(conn)
        sid = await new_session(conn, workspace)
        for bad in ("no-such-session", "", "../" * 50, "x" * 10_000):
            error = await error_of(raw_request(conn, "session/delete", {"sessionId": bad}))
            assert error.code == -32002 and "unknown session" in str(error), (bad[:20], error)
        error = await error_of(raw_request(conn, "session/delete", {}))
        assert error.code == -32602  # no sessionId at all
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
        assert response.stop_reason == "end_turn"


async def test_a_new_session_deleted_at_once_leaves_nothing(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """Deleted before its background setup (store record, tools) has finished."""
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        await initialize_125(conn)
        sid = await new_session(conn, workspace)
        assert await raw_request(conn, "session/delete", {"sessionId": sid}) == {}
        assert (await conn.list_sessions()).sessions == []
        assert rows(home, sid)["sessions"] == 0
        error = await error_of(conn.prompt(session_id=sid, prompt=[acp.text_block("hi")]))
        assert error.code == -32002


async def test_delete_while_a_turn_runs_cancels_it_first(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(SLOW)
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await initialize_125(conn)
        sid = await new_session(conn, workspace)
        turn = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("talk")]))
        await until_text(client, sid)
        assert not turn.done()
        assert await raw_request(conn, "session/delete", {"sessionId": sid}) == {}
        assert turn.done(), "the turn settled before the delete was answered"
        assert (await turn).stop_reason == "cancelled"
        assert rows(home, sid) == {"sessions": 0, "entries": 0, "session_locks": 0}
        # crow goes on: a new session prompts as before
        other = await new_session(conn, workspace)
        assert (await conn.prompt(session_id=other, prompt=[acp.text_block("hi")])).stop_reason == "end_turn"


async def test_a_session_running_a_turn_in_another_crow_is_not_deleted(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Reply(text=SLOW.text))  # the first exchange: SLOW's words, at once
    env = crow_env(llm, home)
    async with spawn_crow(env) as (conn, _proc, client):
        await initialize_125(conn)
        sid = await new_session(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("first")])  # stored
        llm.push(SLOW)
        turn = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("second")]))
        for _ in range(200):
            if rows(home, sid)["entries"] >= 3 and client.text(sid).count("w1 ") >= 2:
                break
            await asyncio.sleep(0.05)
        async with spawn_crow(env, stderr_path=home / "other.log") as (other, _p, _c):
            await initialize_125(other)
            error = await error_of(raw_request(other, "session/delete", {"sessionId": sid}))
            assert error.code == -32001 and "busy" in str(error) and "another crow process" in str(error)
            assert rows(home, sid)["sessions"] == 1
            assert [s.session_id for s in (await other.list_sessions()).sessions] == [sid]
        # the command line deletes through the same store operation: refused alike
        cli = await anyio.run_process([*CROW, "sessions", "delete", sid], env=env, check=False)
        assert cli.returncode == 2 and b"busy" in cli.stderr and b"another crow process" in cli.stderr
        assert rows(home, sid)["sessions"] == 1
        await conn.cancel(session_id=sid)
        assert (await turn).stop_reason == "cancelled"
        # nothing was lost: the first exchange is still there, and the session goes on
        llm.push(Reply(text="after"))
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("third")])
        assert response.stop_reason == "end_turn"
        assert "first" in str(llm.requests[-1].messages)


def test_delete_through_the_typescript_client(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    llm.rule(lambda r: "slow" in r.last_user_text, SLOW)
    out = run_script(
        {
            "steps": [
                {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "a"},
                {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "b"},
                {
                    "request": "session/prompt",
                    "params": {"sessionId": "${a.sessionId}", "prompt": [{"type": "text", "text": "hi"}]},
                    "as": "pa",
                },
                {"request": "session/delete", "params": {"sessionId": "${a.sessionId}"}, "as": "del_idle"},
                {"request": "session/list", "params": {}, "as": "list"},
                {
                    "request": "session/load",
                    "params": {"sessionId": "${a.sessionId}", "cwd": str(workspace), "mcpServers": []},
                    "as": "load",
                },
                {"request": "session/delete", "params": {"sessionId": "nope"}, "as": "del_unknown"},
                {
                    "request": "session/prompt",
                    "params": {"sessionId": "${b.sessionId}", "prompt": [{"type": "text", "text": "slow"}]},
                    "as": "pb",
                    "wait": False,
                },
                {"until": "agent_message_chunk"},
                {"sleep": 300},
                {"request": "session/delete", "params": {"sessionId": "${b.sessionId}"}, "as": "del_running"},
                {"await": "pb"},
                {"request": "session/list", "params": {}, "as": "list_after"},
            ]
        },
        crow_env(llm, home),
        workspace,
    )
    res = out["results"]
    init = res["initialize"]["result"]["agentCapabilities"]
    assert init["sessionCapabilities"]["delete"] == {}
    b = res["b"]["result"]["sessionId"]
    assert res["del_idle"] == {"result": {}}
    assert [s["sessionId"] for s in res["list"]["result"]["sessions"]] == [b]
    assert res["load"]["error"]["code"] == -32002
    # crow answers -32002 (the Python tests read it on the wire); the TS SDK turns -32002 from
    # session/delete into success, as ACP recommends (treatSessionNotFoundAsSuccess)
    assert res["del_unknown"] == {"result": {}}
    assert res["del_running"] == {"result": {}}
    assert res["pb"]["result"]["stopReason"] == "cancelled"
    assert res["list_after"]["result"]["sessions"] == []


async def test_delete_and_load_of_one_id_at_once_leave_crow_usable(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """A client deleting a session while (or just before) it loads it again: each request gets
    an answer (the load may win or find it gone), and crow still opens sessions afterwards.
    Sent together right after `session/new`, the load used to find the store not yet open
    (-32603), and the background task group died: every later session/new failed."""
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        await initialize_125(conn)
        for first in ("session/delete", "session/load") * 5:
            sid = await new_session(conn, workspace)
            calls = {
                "session/delete": raw_request(conn, "session/delete", {"sessionId": sid}),
                "session/load": raw_request(
                    conn, "session/load", {"sessionId": sid, "cwd": str(workspace), "mcpServers": []}
                ),
            }
            order = [first, *(m for m in calls if m != first)]
            answers = await asyncio.gather(*(calls[m] for m in order), return_exceptions=True)
            for method, answer in zip(order, answers, strict=True):
                if isinstance(answer, acp.RequestError):
                    assert method == "session/load" and answer.code == -32002, (method, answer)
                else:
                    assert not isinstance(answer, BaseException), (method, answer)
            assert rows(home, sid) == {"sessions": 0, "entries": 0, "session_locks": 0}
            later = await new_session(conn, workspace)
            await conn.prompt(session_id=later, prompt=[acp.text_block("still here")])
