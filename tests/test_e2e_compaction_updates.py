"""End to end: every compaction (automatic, `/compact`, `crow.compact`, after the model
refused an over-long context) reported as `compaction_update`s with its summary as a
`compaction_summary_chunk` to a client that advertised `session.compaction` (schema 1.25),
and nothing of it as agent text; without the capability, what crow did before. A cancel
during a compaction ends it `cancelled` with the context and transcript as they were.
Through the Python client and the TypeScript SDK client."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import acp
import pytest

from crow.messages import Message
from crow.store import SQLiteStore
from tests.conftest import crow_env, initialize_125, spawn_crow
from tests.llm_server import Fault, Reply, ScriptedLLM, Stall
from tests.support.ts_client import run_script

pytestmark = pytest.mark.anyio

OVERFLOW = "This model's maximum context length is 4096 tokens"
COMPACTION = ("compaction_update", "compaction_summary_chunk")


def sent(client: Any, *kinds: str) -> list[dict[str, Any]]:
    """The raw `session/update` payloads of these kinds crow wrote, in order."""
    return [
        m["params"]["update"]
        for direction, m in client.wire.messages
        if direction == "in"
        and m.get("method") == "session/update"
        and m["params"]["update"]["sessionUpdate"] in kinds
    ]


def said(updates: list[dict[str, Any]]) -> str:
    return "".join(u["content"]["text"] for u in updates if u["sessionUpdate"] == "agent_message_chunk")


def one_compaction(updates: list[dict[str, Any]], summary: str) -> str:
    """The id of the one completed compaction `updates` report, checking their order."""
    cid = updates[0]["compactionId"] if updates else None
    assert updates == [
        {"sessionUpdate": "compaction_update", "compactionId": cid, "status": "in_progress"},
        {
            "sessionUpdate": "compaction_summary_chunk",
            "compactionId": cid,
            "content": {"type": "text", "text": summary},
        },
        {"sessionUpdate": "compaction_update", "compactionId": cid, "status": "completed"},
    ], updates
    assert isinstance(cid, str) and cid
    return cid


async def start(conn: Any, workspace: Path, capable: bool) -> str:
    if capable:
        await initialize_125(conn)
    else:
        await conn.initialize(protocol_version=1)
    return (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id


async def history(conn: Any, sid: str, llm: ScriptedLLM, *, big: bool = False) -> None:
    """Three exchanges; `big`: the last answer reports a context near the 128k window."""
    llm.push(Reply(text="a0"), Reply(text="a1"), Reply(text="a2", usage=(120_000, 10) if big else None))
    for i in range(3):
        await conn.prompt(session_id=sid, prompt=[acp.text_block(f"q{i}")])


@contextlib.asynccontextmanager
async def after_history(
    llm: ScriptedLLM, home: Path, workspace: Path, capable: bool
) -> AsyncIterator[tuple[Any, str, Any, int]]:
    """crow, a session with three exchanges, and how many agent chunks they took."""
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace, capable)
        await history(conn, sid, llm)
        yield conn, sid, client, len(sent(client, "agent_message_chunk"))


async def stored(home: Path, session_id: str) -> list[Message]:
    async with SQLiteStore(home / "crow.db") as store:
        return await store.load_transcript(session_id)


def shown(transcript: list[Message]) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in transcript]


CAPABLE = pytest.mark.parametrize("capable", [True, False], ids=["compaction", "without"])


# ------------------------------------------------------------------ the four kinds


@CAPABLE
async def test_automatic_compaction(llm: ScriptedLLM, home: Path, workspace: Path, capable: bool) -> None:
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace, capable)
        await history(conn, sid, llm, big=True)
        answered = len(sent(client, "agent_message_chunk"))
        llm.push(Reply(text="SUMMARY-AUTO"), Reply(text="after"))
        await conn.prompt(session_id=sid, prompt=[acp.text_block("next")])
        told = said(sent(client, "agent_message_chunk")[answered:])
    assert any("SUMMARY-AUTO" in m["content"] for m in llm.requests[-1].messages), "it compacted"
    compaction = sent(client, *COMPACTION)
    if capable:
        one_compaction(compaction, "SUMMARY-AUTO")
    else:
        assert compaction == []
    assert told == "after", "nothing about the compaction is agent text"
    assert [r for r, _ in shown(await stored(home, sid))] == ["user", "assistant"] * 4


@CAPABLE
async def test_slash_compact(llm: ScriptedLLM, home: Path, workspace: Path, capable: bool) -> None:
    async with after_history(llm, home, workspace, capable) as (conn, sid, client, answered):
        llm.push(Reply(text="SUMMARY-SLASH"))
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("/compact keep numbers")])
        told = said(sent(client, "agent_message_chunk")[answered:])
    assert response.stop_reason == "end_turn" and "keep numbers" in llm.requests[-1].last_user_text
    if capable:
        cid = one_compaction(sent(client, *COMPACTION), "SUMMARY-SLASH")
        assert told == "" and sent(client, "notice") == [], "the compaction updates say it all"
    else:
        assert sent(client, *COMPACTION) == []
        assert told.startswith("Compacted the conversation: 6 → 4 messages")
    # stored: the command line, and what a client without these updates was told (as a
    # system record outside the context, never assistant text)
    transcript = await stored(home, sid)
    assert shown(transcript)[-2][1] == "/compact keep numbers"
    record = transcript[-1]
    assert record.role == "system" and record.content.startswith("Compacted the conversation: ")
    if capable:
        assert record.meta["notice"]["compaction"] == cid
    for replay_capable in (True, False):
        async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
            await (initialize_125(conn) if replay_capable else conn.initialize(protocol_version=1))
            await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        replayed = said(sent(client, "agent_message_chunk"))
        assert ("Compacted the conversation" in replayed) is not replay_capable


@CAPABLE
async def test_crow_compact_ext_method(llm: ScriptedLLM, home: Path, workspace: Path, capable: bool) -> None:
    async with after_history(llm, home, workspace, capable) as (conn, sid, client, answered):
        llm.push(Reply(text="SUMMARY-EXT"))
        result = await conn.ext_method("crow.compact", {"sessionId": sid})
        told = said(sent(client, "agent_message_chunk")[answered:])
    assert result["compacted"] is True and result["summary"] == "SUMMARY-EXT"
    if capable:
        assert one_compaction(sent(client, *COMPACTION), "SUMMARY-EXT") == result["compactionId"]
    else:
        assert sent(client, *COMPACTION) == []
    assert told == ""
    assert [r for r, _ in shown(await stored(home, sid))] == ["user", "assistant"] * 3


@CAPABLE
async def test_overflow_compaction(llm: ScriptedLLM, home: Path, workspace: Path, capable: bool) -> None:
    async with after_history(llm, home, workspace, capable) as (conn, sid, client, answered):
        llm.push(Fault(status=400, message=OVERFLOW), Reply(text="SUMMARY-OVERFLOW"), Reply(text="fits now"))
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("last")])
        told = said(sent(client, "agent_message_chunk")[answered:])
    assert response.stop_reason == "end_turn" and told == "fits now"
    assert any("SUMMARY-OVERFLOW" in m["content"] for m in llm.requests[-1].messages)
    if capable:
        one_compaction(sent(client, *COMPACTION), "SUMMARY-OVERFLOW")
    else:
        assert sent(client, *COMPACTION) == []


async def test_a_failed_compaction_says_why(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    async with after_history(llm, home, workspace, True) as (conn, sid, client, _):
        llm.push(Fault(status=400, message="no summaries today"))
        result = await conn.ext_method("crow.compact", {"sessionId": sid})
    assert result["compacted"] is False
    first, last = sent(client, *COMPACTION)
    assert first["status"] == "in_progress" and last["compactionId"] == first["compactionId"]
    assert last["status"] == "failed" and "no summaries today" in last["error"] == result["error"]


# ------------------------------------------------------------------ cancel


async def until(check: Any, seconds: float = 10) -> None:
    for _ in range(int(seconds * 100)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out waiting")


@pytest.mark.parametrize("how", ["crow.compact", "/compact"])
async def test_a_cancel_during_compaction_leaves_everything_as_it_was(
    llm: ScriptedLLM, home: Path, workspace: Path, how: str
) -> None:
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace, True)
        await history(conn, sid, llm)
        context = llm.requests[-1].messages
        asked = len(llm.requests)
        llm.push(Stall(seconds=30))  # the summary never comes
        if how == "crow.compact":
            task = asyncio.create_task(conn.ext_method("crow.compact", {"sessionId": sid}))
        else:
            task = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("/compact")]))
        await until(lambda: len(llm.requests) > asked and sent(client, "compaction_update"))
        await conn.cancel(session_id=sid)
        if how == "crow.compact":
            with pytest.raises(acp.RequestError) as cancelled:
                await task
            assert cancelled.value.code == -32800
        else:
            assert (await task).stop_reason == "cancelled"
        llm.push(Reply(text="after"))
        await conn.prompt(session_id=sid, prompt=[acp.text_block("next")])
    first, last = sent(client, *COMPACTION)
    assert (first["status"], last["status"]) == ("in_progress", "cancelled")
    assert last["compactionId"] == first["compactionId"] and "error" not in last
    # the context is as it was: the next request is the last one plus its answer and the prompt
    assert llm.requests[-1].messages == [
        *context,
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "next"},
    ]
    command = [("user", "/compact")] if how == "/compact" else []
    exchanges = [pair for i in range(3) for pair in (("user", f"q{i}"), ("assistant", f"a{i}"))]
    expected = [*exchanges, *command]
    assert shown(await stored(home, sid)) == [*expected, ("user", "next"), ("assistant", "after")]


# ------------------------------------------------------------------ the TypeScript SDK client


def ts_prompt(name: str, text: str) -> dict[str, Any]:
    return {
        "request": "session/prompt",
        "params": {"sessionId": "${s.sessionId}", "prompt": [{"type": "text", "text": text}]},
        "as": name,
    }


@CAPABLE
def test_ts_client_every_kind_of_compaction(
    llm: ScriptedLLM, home: Path, workspace: Path, capable: bool
) -> None:
    """One session: automatic, /compact, _crow.compact, then one after an overflow."""
    llm.push(Reply(text="a0"), Reply(text="a1"), Reply(text="a2", usage=(120_000, 10)))
    llm.push(Reply(text="SUMMARY-AUTO"), Reply(text="after"))  # the prompt "next"
    llm.push(Reply(text="SUMMARY-SLASH"))
    llm.push(Reply(text="SUMMARY-EXT"))
    llm.push(Fault(status=400, message=OVERFLOW), Reply(text="SUMMARY-OVERFLOW"), Reply(text="fits now"))
    steps = [
        {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "s"},
        *(ts_prompt(f"q{i}", f"q{i}") for i in range(3)),
        ts_prompt("auto", "next"),
        ts_prompt("slash", "/compact"),
        {"request": "_crow.compact", "params": {"sessionId": "${s.sessionId}"}, "as": "ext"},
        ts_prompt("overflow", "last"),
    ]
    script = {"capabilities": {"session": {"compaction": {}}} if capable else {}, "steps": steps}
    out = run_script(script, crow_env(llm, home), workspace)
    for name in ("auto", "slash", "overflow"):
        assert out["results"][name]["result"]["stopReason"] == "end_turn", out["results"][name]
    assert out["results"]["ext"]["result"]["compacted"] is True
    updates = [u["update"] for u in out["updates"]]
    compactions = [u for u in updates if u["sessionUpdate"] in COMPACTION]
    text = said(updates)
    if capable:
        ids = []
        for n, summary in enumerate(("SUMMARY-AUTO", "SUMMARY-SLASH", "SUMMARY-EXT", "SUMMARY-OVERFLOW")):
            ids.append(one_compaction(compactions[3 * n : 3 * n + 3], summary))
        assert len(compactions) == 12 and len(set(ids)) == 4, "one fresh id per compaction"
        assert ids[2] == out["results"]["ext"]["result"]["compactionId"]
        assert text == "a0a1a2afterfits now"
    else:
        assert compactions == []
        assert text.startswith("a0a1a2afterCompacted the conversation: ") and text.endswith("\nfits now")


def test_ts_client_cancel_request_during_compaction(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    llm.push(Reply(text="a0"), Reply(text="a1"), Stall(seconds=30), Reply(text="after"))
    steps = [
        {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "s"},
        ts_prompt("q0", "q0"),
        ts_prompt("q1", "q1"),
        {"request": "_crow.compact", "params": {"sessionId": "${s.sessionId}"}, "as": "ext", "wait": False},
        {"until": "compaction_update"},
        {"sleep": 200},
        {"notify": "$/cancel_request", "params": {"requestId": "${ext.id}"}},
        {"await": "ext"},
        ts_prompt("next", "next"),
    ]
    out = run_script(
        {"capabilities": {"session": {"compaction": {}}}, "steps": steps}, crow_env(llm, home), workspace
    )
    assert out["results"]["ext"]["error"]["code"] == -32800
    assert out["results"]["next"]["result"]["stopReason"] == "end_turn"
    statuses = [
        u["update"]["status"] for u in out["updates"] if u["update"]["sessionUpdate"] == "compaction_update"
    ]
    assert statuses == ["in_progress", "cancelled"]
    assert [(m["role"], m["content"]) for m in llm.requests[-1].messages if m["role"] != "system"] == [
        ("user", "q0"),
        ("assistant", "a0"),
        ("user", "q1"),
        ("assistant", "a1"),
        ("user", "next"),
    ]


async def test_a_cancel_during_automatic_compaction_cancels_the_turn_and_leaves_the_context(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace, True)
        await history(conn, sid, llm, big=True)  # the next prompt compacts first
        context = llm.requests[-1].messages
        asked = len(llm.requests)
        llm.push(Stall(seconds=30))
        task = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("next")]))
        await until(lambda: len(llm.requests) > asked and sent(client, "compaction_update"))
        await conn.cancel(session_id=sid)
        assert (await task).stop_reason == "cancelled"
        # the next prompt compacts again; that summary fails, so the context is the model's to see
        llm.push(Fault(status=400, message="no summaries today"), Reply(text="after"))
        await conn.prompt(session_id=sid, prompt=[acp.text_block("again")])
    statuses = [u["status"] for u in sent(client, "compaction_update")]
    assert statuses == ["in_progress", "cancelled", "in_progress", "failed"]
    assert llm.requests[-1].messages == [
        *context,
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "next"},
        {"role": "user", "content": "again"},
    ]
