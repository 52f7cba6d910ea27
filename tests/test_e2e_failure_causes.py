"""End to end: the README's `data.cause` of a failed turn for the kinds no other test
answers: retries used up on 429s (`rate_limit`), and a context the model still refuses
after compacting (`context_length`). Each answers -32000 once the history is stored; the
session goes on."""

from __future__ import annotations

from pathlib import Path

import acp
import pytest

from tests.conftest import crow_env, spawn_crow
from tests.llm_server import Fault, Reply, ScriptedLLM
from tests.test_e2e_compaction_updates import OVERFLOW, history, start

pytestmark = pytest.mark.anyio


async def test_retries_used_up_on_rate_limits_answer_cause_rate_limit(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Fault(status=429, retry_after=0.01, times=3), Reply(text="works now"))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        sid = await start(conn, workspace, True)
        with pytest.raises(acp.RequestError) as failed:
            await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
        assert failed.value.code == -32000 and failed.value.data["cause"] == "rate_limit"
        ok = await conn.prompt(session_id=sid, prompt=[acp.text_block("again")])
        assert ok.stop_reason == "end_turn"


async def test_a_context_refused_after_compacting_answers_cause_context_length(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        sid = await start(conn, workspace, True)
        await history(conn, sid, llm)
        llm.push(
            Fault(status=400, message=OVERFLOW), Reply(text="SUMMARY"), Fault(status=400, message=OVERFLOW)
        )
        with pytest.raises(acp.RequestError) as failed:
            await conn.prompt(session_id=sid, prompt=[acp.text_block("too long")])
        assert failed.value.code == -32000 and failed.value.data["cause"] == "context_length"
        llm.push(Reply(text="fits"))
        ok = await conn.prompt(session_id=sid, prompt=[acp.text_block("again")])
        assert ok.stop_reason == "end_turn"
