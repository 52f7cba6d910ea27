"""End to end: `/compact` whose model cannot be called fails the prompt as a failed turn
does (schema 1.25): a refused key answers auth_required (-32000, cause `auth`) so the
editor can offer `authenticate`, a failed summary call -32000 with its cause; the
compaction is reported `failed`, the context and transcript are as they were, and the
session goes on. Nothing to compact is no failure. The Python client, then the
TypeScript SDK client."""

from __future__ import annotations

from pathlib import Path

import acp
import pytest

from tests.conftest import crow_env, spawn_crow
from tests.llm_server import Fault, Reply, ScriptedLLM
from tests.support.ts_client import run_script
from tests.test_e2e_compaction_updates import COMPACTION, after_history, sent, shown, start, stored, ts_prompt

pytestmark = pytest.mark.anyio

EXCHANGES = [pair for i in range(3) for pair in (("user", f"q{i}"), ("assistant", f"a{i}"))]


@pytest.mark.parametrize(
    ("fault", "cause"),
    [(Fault(status=401, message="bad key"), "auth"), (Fault(status=400, message="no summaries"), "provider")],
    ids=["refused-key", "failed-call"],
)
async def test_a_compact_whose_summary_call_fails_answers_an_error(
    llm: ScriptedLLM, home: Path, workspace: Path, fault: Fault, cause: str
) -> None:
    async with after_history(llm, home, workspace, True) as (conn, sid, client, _):
        context = llm.requests[-1].messages
        llm.push(fault)
        with pytest.raises(acp.RequestError) as failed:
            await conn.prompt(session_id=sid, prompt=[acp.text_block("/compact")])
        assert failed.value.code == -32000
        assert failed.value.data["cause"] == cause
        first, last = sent(client, *COMPACTION)
        assert (first["status"], last["status"]) == ("in_progress", "failed")
        llm.push(Reply(text="after"))
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("next")])
        assert response.stop_reason == "end_turn"
    assert llm.requests[-1].messages == [
        *context,
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "next"},
    ]
    assert [m for m in shown(await stored(home, sid)) if m[0] != "system"] == [
        *EXCHANGES,
        ("user", "/compact"),
        ("user", "next"),
        ("assistant", "after"),
    ]


async def test_a_compact_without_a_key_answers_auth_required(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    async with after_history(llm, home, workspace, True) as (_conn, sid, _client, _):
        pass
    env = crow_env(None, home, CROW_MODEL="anthropic:claude-test", ANTHROPIC_BASE_URL=llm.root_url)
    async with spawn_crow(env) as (conn, _proc, _client):
        await start(conn, workspace, True)
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        with pytest.raises(acp.RequestError) as failed:
            await conn.prompt(session_id=sid, prompt=[acp.text_block("/compact")])
        assert failed.value.code == -32000 and failed.value.data["cause"] == "auth"


async def test_a_compact_with_nothing_to_compact_ends_the_turn(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        sid = await start(conn, workspace, True)
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("/compact")])
        assert response.stop_reason == "end_turn"


def test_ts_client_a_compact_with_a_refused_key(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    llm.push(Reply(text="a0"), Reply(text="a1"), Reply(text="a2"), Fault(status=401, message="bad key"))
    llm.push(Reply(text="after"))
    steps = [
        {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "s"},
        *(ts_prompt(f"q{i}", f"q{i}") for i in range(3)),
        ts_prompt("compact", "/compact"),
        ts_prompt("next", "next"),
    ]
    script = {"capabilities": {"session": {"compaction": {}, "notices": {}}}, "steps": steps}
    out = run_script(script, crow_env(llm, home), workspace)
    error = out["results"]["compact"]["error"]
    assert error["code"] == -32000 and error["data"]["cause"] == "auth", error
    assert out["results"]["next"]["result"]["stopReason"] == "end_turn"
    statuses = [
        u["update"]["status"] for u in out["updates"] if u["update"]["sessionUpdate"] == "compaction_update"
    ]
    assert statuses == ["in_progress", "failed"]
