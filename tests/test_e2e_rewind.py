"""End to end: taking back turns over ACP (`/undo`, `_crow.rewind`) and on the store (`crow
sessions rewind`), proved at the scripted model server (what the model is sent next) and by
`session/load` (what is replayed), through the Python client and the TypeScript SDK client."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import acp
import pytest

from tests.conftest import crow_env, initialize_125, raw_request, spawn_crow
from tests.llm_server import Reply, ScriptedLLM, Stall, ToolCallSpec
from tests.support.ts_client import run_script
from tests.test_e2e_compaction_updates import sent

pytestmark = pytest.mark.anyio

SUMMARY_MARK = "the conversation is about to be compacted"


@pytest.fixture
def echoing(llm: ScriptedLLM) -> ScriptedLLM:
    """Answers `a:<prompt>`, and `SUMMARY` to a compaction's request."""
    llm.default = lambda r: Reply(
        text="SUMMARY" if SUMMARY_MARK in r.last_user_text else f"a:{r.last_user_text}"
    )
    return llm


def seen(llm: ScriptedLLM) -> list[tuple[str, str]]:
    """What the last model request carried, system prompt aside."""
    return [(m["role"], m["content"]) for m in llm.requests[-1].messages if m["role"] != "system"]


def texts(updates: list[dict[str, Any]], kind: str) -> list[str]:
    return [u["content"]["text"] for u in updates if u["sessionUpdate"] == kind]


async def start(conn: Any, workspace: Path, notices: bool) -> str:
    await (initialize_125(conn) if notices else conn.initialize(protocol_version=1))
    return (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id


async def ask(conn: Any, sid: str, *prompts: str) -> None:
    for text in prompts:
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block(text)])
        assert response.stop_reason == "end_turn"


async def replayed(
    llm: ScriptedLLM, home: Path, workspace: Path, sid: str, notices: bool
) -> list[dict[str, Any]]:
    """What a fresh crow replays of `sid` at session/load."""
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await (initialize_125(conn) if notices else conn.initialize(protocol_version=1))
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        return sent(client, "user_message_chunk", "agent_message_chunk", "notice")


NOTICES = pytest.mark.parametrize("notices", [True, False], ids=["notices", "text"])


@NOTICES
async def test_undo_drops_the_turn_from_what_the_model_sees_and_from_a_replay(
    echoing: ScriptedLLM, home: Path, workspace: Path, notices: bool
) -> None:
    async with spawn_crow(crow_env(echoing, home)) as (conn, _proc, client):
        sid = await start(conn, workspace, notices)
        await ask(conn, sid, "q0", "q1")
        asked = len(echoing.requests)
        await ask(conn, sid, "/undo")
        assert len(echoing.requests) == asked, "an undo calls no model"
        live = sent(client, "notice", "agent_message_chunk")[-1]
        await ask(conn, sid, "q2")
        assert seen(echoing) == [("user", "q0"), ("assistant", "a:q0"), ("user", "q2")]
    report = "Undid the last turn (“q1”): the conversation is back to before it."
    if notices:
        assert (live["sessionUpdate"], live["title"]) == ("notice", "Undid the last turn")
        assert live["description"].startswith("(“q1”): the conversation is back to before it.")
    else:
        assert live["sessionUpdate"] == "agent_message_chunk" and live["content"]["text"].startswith(report)
    shown = await replayed(echoing, home, workspace, sid, notices)
    assert texts(shown, "user_message_chunk") == ["q0", "/undo", "q2"]
    agent_text = texts(shown, "agent_message_chunk")
    assert agent_text[0] == "a:q0" and agent_text[1].startswith(report) and agent_text[2:] == ["a:q2"]
    assert texts(shown, "notice") == [], "a report is replayed as history (text), never as news"


async def test_crow_rewind_takes_back_two_turns(echoing: ScriptedLLM, home: Path, workspace: Path) -> None:
    async with spawn_crow(crow_env(echoing, home)) as (conn, _proc, client):
        sid = await start(conn, workspace, True)
        await ask(conn, sid, "q0", "q1", "q2")
        result = await conn.ext_method("crow.rewind", {"sessionId": sid, "turns": 2})
        told = sent(client, "notice")[-1]
        await ask(conn, sid, "next")
        assert seen(echoing) == [("user", "q0"), ("assistant", "a:q0"), ("user", "next")]
    assert result["turns"] == 2 and [p["text"] for p in result["prompts"]] == ["q1", "q2"]
    assert (result["restored"], result["removed"], result["skipped"]) == ([], [], [])
    assert result["message"].startswith("Undid the last 2 turns (“q1”, “q2”): the conversation is back")
    assert told["title"] == "Undid the last 2 turns" and told["severity"] == "info"


async def test_rewind_across_a_compaction(echoing: ScriptedLLM, home: Path, workspace: Path) -> None:
    async with spawn_crow(crow_env(echoing, home)) as (conn, _proc, _client):
        sid = await start(conn, workspace, True)
        await ask(conn, sid, "q0", "q1", "q2")
        compacted = await conn.ext_method("crow.compact", {"sessionId": sid})
        assert compacted["compacted"] is True
        await ask(conn, sid, "q3")
        assert any("SUMMARY" in text for _, text in seen(echoing)), "the model saw the compacted context"
        result = await conn.ext_method("crow.rewind", {"sessionId": sid, "turns": 2})
        assert [p["text"] for p in result["prompts"]] == ["q2", "q3"]
        await ask(conn, sid, "next")
        assert seen(echoing) == [
            ("user", "q0"),
            ("assistant", "a:q0"),
            ("user", "q1"),
            ("assistant", "a:q1"),
            ("user", "next"),
        ], "the context before q2, as it was before the compaction"


async def test_nothing_to_undo_and_bad_requests(echoing: ScriptedLLM, home: Path, workspace: Path) -> None:
    async with spawn_crow(crow_env(echoing, home)) as (conn, _proc, client):
        sid = await start(conn, workspace, False)
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("/undo")])
        assert response.stop_reason == "end_turn"
        assert texts(sent(client, "agent_message_chunk"), "agent_message_chunk") == [
            "Nothing to undo: this session has no turn to take back.\n"
        ]
        with pytest.raises(acp.RequestError) as nothing:
            await conn.ext_method("crow.rewind", {"sessionId": sid})
        assert nothing.value.code == -32000 and nothing.value.data == {"turns": 1, "available": 0}
        assert str(nothing.value).startswith("Nothing to undo")
        await ask(conn, sid, "q0")
        with pytest.raises(acp.RequestError) as too_many:
            await conn.ext_method("crow.rewind", {"sessionId": sid, "turns": 3})
        assert too_many.value.data == {"turns": 3, "available": 1}
        for turns in (0, -2, "2", True, 1.5, None):
            with pytest.raises(acp.RequestError) as bad:
                await conn.ext_method("crow.rewind", {"sessionId": sid, "turns": turns})
            assert bad.value.code == -32602 and "turns must be a whole number" in str(bad.value.data), turns
        with pytest.raises(acp.RequestError) as unknown:
            await conn.ext_method("crow.rewind", {"sessionId": "no-such-session"})
        assert unknown.value.code == -32002
        with pytest.raises(acp.RequestError) as missing:
            await conn.ext_method("crow.rewind", {"turns": 1})
        assert missing.value.code == -32602
        await ask(conn, sid, "q1")  # still usable, and nothing was taken back
        assert seen(echoing) == [("user", "q0"), ("assistant", "a:q0"), ("user", "q1")]


async def slow_turn(conn: Any, sid: str, llm: ScriptedLLM) -> asyncio.Task[Any]:
    """A turn (prompt "slow") whose model call is under way and hangs for 30 s."""
    asked = len(llm.requests)
    llm.push(Stall(seconds=30))
    turn = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("slow")]))
    for _ in range(1000):
        if len(llm.requests) > asked:
            break
        await asyncio.sleep(0.01)
    return turn


async def test_a_rewind_while_a_turn_runs_is_busy(echoing: ScriptedLLM, home: Path, workspace: Path) -> None:
    async with spawn_crow(crow_env(echoing, home)) as (conn, _proc, _client):
        sid = await start(conn, workspace, True)
        await ask(conn, sid, "q0")
        turn = await slow_turn(conn, sid, echoing)
        with pytest.raises(acp.RequestError) as busy:
            await raw_request(conn, "_crow.rewind", {"sessionId": sid, "turns": 1})
        assert busy.value.code == -32001 and "busy with a prompt" in str(busy.value)
        assert not turn.done()
        await conn.cancel(session_id=sid)
        assert (await turn).stop_reason == "cancelled"
        result = await conn.ext_method("crow.rewind", {"sessionId": sid})
        assert [p["text"] for p in result["prompts"]] == ["slow"]


def crow_cli(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crow", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )


async def test_crow_sessions_rewind_works_on_the_store(
    echoing: ScriptedLLM, home: Path, workspace: Path
) -> None:
    env = crow_env(echoing, home)
    async with spawn_crow(env) as (conn, _proc, _client):
        sid = await start(conn, workspace, False)
        await ask(conn, sid, "q0", "q1", "q2")
    done = crow_cli(env, workspace, "sessions", "rewind", sid, "2")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["turns"] == 2 and [p["text"] for p in answer["prompts"]] == ["q1", "q2"]
    assert done.stderr.startswith("Undid the last 2 turns (“q1”, “q2”)")
    refused = crow_cli(env, workspace, "sessions", "rewind", sid, "5")
    assert refused.returncode == 1 and refused.stdout == ""
    assert "Cannot take back 5 turns: this session has 1; nothing was undone." in refused.stderr
    for bad in (["sessions", "rewind", sid, "two"], ["sessions", "rewind"], ["sessions", "show", sid, "2"]):
        assert crow_cli(env, workspace, *bad).returncode == 2, bad
    assert crow_cli(env, workspace, "sessions", "rewind", "nope").stderr == "crow: unknown session 'nope'\n"
    shown = await replayed(echoing, home, workspace, sid, False)
    assert texts(shown, "user_message_chunk") == ["q0"]
    show = crow_cli(env, workspace, "sessions", "show", sid).stdout
    assert "[Human]\nq0" in show and "[Human]\nq1" not in show and "a:q2" not in show
    assert show.rstrip().endswith("[System]\n" + done.stderr.rstrip())  # the report, where q1 and q2 were
    export = json.loads(crow_cli(env, workspace, "sessions", "export", sid).stdout)
    assert [m["content"] for m in export["transcript"] if m["role"] == "user"] == ["q0", "q1", "q2"]
    async with spawn_crow(env) as (conn, _proc, _client):
        await conn.initialize(protocol_version=1)
        await conn.resume_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        await ask(conn, sid, "next")
    assert seen(echoing) == [("user", "q0"), ("assistant", "a:q0"), ("user", "next")]


async def test_a_live_crow_sees_a_rewind_made_from_the_shell(
    echoing: ScriptedLLM, home: Path, workspace: Path
) -> None:
    env = crow_env(echoing, home)
    async with spawn_crow(env) as (conn, _proc, _client):
        sid = await start(conn, workspace, False)
        await ask(conn, sid, "q0", "q1")
        done = await asyncio.to_thread(crow_cli, env, workspace, "sessions", "rewind", sid)
        assert done.returncode == 0, done.stderr
        await ask(conn, sid, "q2")  # the session in this crow's memory is read again first
        assert seen(echoing) == [("user", "q0"), ("assistant", "a:q0"), ("user", "q2")]


async def test_crow_sessions_rewind_is_refused_while_a_crow_runs_a_turn(
    echoing: ScriptedLLM, home: Path, workspace: Path
) -> None:
    env = crow_env(echoing, home)
    async with spawn_crow(env) as (conn, proc, _client):
        sid = await start(conn, workspace, False)
        await ask(conn, sid, "q0")
        turn = await slow_turn(conn, sid, echoing)
        done = await asyncio.to_thread(crow_cli, env, workspace, "sessions", "rewind", sid)
        assert not turn.done(), "the turn ended first: nothing was tested"
        assert (
            done.returncode == 2 and f"running a turn in another crow process (pid {proc.pid})" in done.stderr
        )
        await conn.cancel(session_id=sid)
        await turn
        await ask(conn, sid, "q1")
        assert seen(echoing)[:2] == [("user", "q0"), ("assistant", "a:q0")], "nothing was taken back"


def test_ts_client_undo_rewind_and_load(echoing: ScriptedLLM, home: Path, workspace: Path) -> None:
    def prompt(name: str, text: str) -> dict[str, Any]:
        params = {"sessionId": "${s.sessionId}", "prompt": [{"type": "text", "text": text}]}
        return {"request": "session/prompt", "params": params, "as": name}

    steps = [
        {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "s"},
        *(prompt(f"q{i}", f"q{i}") for i in range(4)),
        prompt("undo", "/undo"),
        {"request": "_crow.compact", "params": {"sessionId": "${s.sessionId}"}, "as": "compact"},
        {"request": "_crow.rewind", "params": {"sessionId": "${s.sessionId}", "turns": 2}, "as": "rewind"},
        prompt("next", "next"),
        {
            "request": "session/load",
            "params": {"sessionId": "${s.sessionId}", "cwd": str(workspace), "mcpServers": []},
        },
    ]
    out = run_script(
        {"capabilities": {"session": {"notices": {}}}, "steps": steps}, crow_env(echoing, home), workspace
    )
    assert out["results"]["undo"]["result"]["stopReason"] == "end_turn"
    assert out["results"]["compact"]["result"]["compacted"] is True
    rewind = out["results"]["rewind"]["result"]
    assert [p["text"] for p in rewind["prompts"]] == ["q1", "q2"] and rewind["skipped"] == []
    assert seen(echoing) == [("user", "q0"), ("assistant", "a:q0"), ("user", "next")]
    updates = [u["update"] for u in out["updates"]]
    titles = [u["title"] for u in updates if u["sessionUpdate"] == "notice"]
    assert titles == ["Undid the last turn", "Undid the last 2 turns"]
    # crow never echoes a prompt live: every user chunk is the replay's
    assert texts(updates, "user_message_chunk") == ["q0", "next"]
    replay = updates[updates.index(next(u for u in updates if u["sessionUpdate"] == "user_message_chunk")) :]
    assert texts(replay, "agent_message_chunk")[0] == "a:q0"
    assert texts(replay, "agent_message_chunk")[1].startswith("Undid the last 2 turns (“q1”, “q2”)")
    assert texts(replay, "agent_message_chunk")[2:] == ["a:next"]


async def test_undo_puts_back_the_files_a_turn_wrote_and_edited(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (workspace / "kept.txt").write_text("before\n")
    llm.push(
        Reply(text="first"),
        Reply(tool_calls=[ToolCallSpec("write_file", {"path": "new.txt", "content": "made\n"})]),
        Reply(
            tool_calls=[
                ToolCallSpec("edit_file", {"path": "kept.txt", "old_text": "before", "new_text": "after"})
            ]
        ),
        Reply(text="done"),
        Reply(text="next"),
    )
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace, True)
        await ask(conn, sid, "hello", "change the files")
        assert (workspace / "new.txt").exists() and (workspace / "kept.txt").read_text() == "after\n"
        await ask(conn, sid, "/undo")
        told = sent(client, "notice")[-1]
        await ask(conn, sid, "what now")
        # the model's next request: the turn, its tool calls and their results are gone
        assert seen(llm) == [("user", "hello"), ("assistant", "first"), ("user", "what now")]
    assert not (workspace / "new.txt").exists()
    assert (workspace / "kept.txt").read_text() == "before\n"
    assert "Files restored: kept.txt." in told["description"]
    assert "Files removed (created by it): new.txt." in told["description"]
