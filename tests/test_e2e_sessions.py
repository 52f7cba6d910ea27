"""End to end: sessions that survive restarts and kills, list/resume/fork/close, config
options, and compaction through crow.compact, /compact and the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import acp
import pytest

from tests.conftest import crow_env, spawn_crow
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec

pytestmark = pytest.mark.anyio


async def open_session(conn, workspace: Path) -> str:  # type: ignore[no-untyped-def]
    await conn.initialize(protocol_version=1)
    return (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id


def running(marker: str) -> list[int]:
    """Live (not zombie) processes whose command line contains marker."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != b"Z":
            found.append(int(pid))
    return found


def kinds(client) -> list[str]:  # type: ignore[no-untyped-def]
    return [type(u).__name__ for _, u in client.updates]


async def test_load_replays_everything_after_a_restart(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    (workspace / "a.txt").write_text("alpha\n")
    todos = [{"id": "1", "title": "Look", "status": "done"}]
    llm.push(
        Reply(
            tool_calls=[ToolCallSpec(name="read_file", arguments={"path": "a.txt"})], reasoning="let me look"
        ),
        Reply(tool_calls=[ToolCallSpec(name="write_todos", arguments={"todos": todos})]),
        Reply(text="It says alpha."),
    )
    env = crow_env(llm, home)
    async with spawn_crow(env) as (conn, _proc, _client):
        sid = await open_session(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("what is in a.txt?")])
    llm.push(Reply(text="Still alpha."))
    async with spawn_crow(env) as (conn, _proc, client):
        init = await conn.initialize(protocol_version=1)
        assert init.agent_capabilities.load_session is True
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        replay = kinds(client)
        assert replay[0] == "UserMessageChunk"
        assert client.of_type("UserMessageChunk")[0].content.text == "what is in a.txt?"
        assert "AgentThoughtChunk" in replay and "AgentPlanUpdate" in replay
        starts = client.of_type("ToolCallStart")
        assert [s.title for s in starts] == ["Read a.txt", "Update plan"]
        assert [s.status for s in starts] == ["completed", "completed"], "replayed whole, final state"
        assert "alpha" in starts[0].content[0].content.text
        assert client.text() == "It says alpha."
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("and now?")])
    assert response.stop_reason == "end_turn"
    sent = [m["role"] for m in llm.requests[-1].messages if m["role"] != "system"]
    assert sent == ["user", "assistant", "tool", "assistant", "tool", "assistant", "user"]


@pytest.mark.parametrize("moment", ["stream", "tool"])
async def test_sigkill_mid_turn_then_load_and_continue(
    llm: ScriptedLLM, home: Path, workspace: Path, moment: str
) -> None:
    if moment == "stream":
        llm.push(Reply(text="partial " * 400, chunk_delay=0.02))
    else:
        command = "sleep 30.4242 & sleep 30.4242"  # a background job too: both must go
        llm.push(Reply(tool_calls=[ToolCallSpec(name="execute", arguments={"command": command})]))
    env = crow_env(llm, home, CROW_MODE="yolo")
    async with spawn_crow(env) as (conn, proc, client):
        sid = await open_session(conn, workspace)
        task = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("go")]))
        want = "AgentMessageChunk" if moment == "stream" else "ToolCallProgress"
        for _ in range(500):
            if client.of_type(want):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        task.cancel()
    if moment == "tool":  # crow could not clean up; its watchdog did
        for _ in range(300):
            if not running("30.4242"):
                break
            await asyncio.sleep(0.01)
        assert not running("30.4242"), "the command outlived the SIGKILLed crow"
    llm.push(Reply(text="recovered"))
    async with spawn_crow(env) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        assert client.of_type("UserMessageChunk")[0].content.text == "go"
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("again")])
    assert response.stop_reason == "end_turn"
    messages = llm.requests[-1].messages
    if moment == "tool":
        tool = [m for m in messages if m["role"] == "tool"]
        assert tool and "interrupted" in tool[0]["content"]
    assert messages[-1]["role"] == "user" and messages[-1]["content"] == "again"


async def test_list_resume_fork_close(llm: ScriptedLLM, home: Path, workspace: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    llm.default = lambda req: Reply(text=f"re: {req.last_user_text}")
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        ids = []
        for i, cwd in enumerate([workspace, workspace, other]):
            sid = (await conn.new_session(cwd=str(cwd), mcp_servers=[])).session_id
            await conn.prompt(session_id=sid, prompt=[acp.text_block(f"first prompt {i}")])
            ids.append(sid)
        listed = await conn.list_sessions(cwd=str(workspace))
        assert {s.session_id for s in listed.sessions} == set(ids[:2])
        assert {s.title for s in listed.sessions} == {"first prompt 0", "first prompt 1"}
        assert all(s.updated_at for s in listed.sessions)
        assert [u.title for u in client.of_type("SessionInfoUpdate")][:1] == ["first prompt 0"]

        fork = await conn.fork_session(session_id=ids[0], cwd=str(workspace), mcp_servers=[])
        await conn.prompt(session_id=fork.session_id, prompt=[acp.text_block("only in fork")])
        forked_history = [m["content"] for m in llm.requests[-1].messages if m["role"] == "user"]
        assert forked_history == ["first prompt 0", "only in fork"]

        await conn.close_session(session_id=ids[0])
        with pytest.raises(acp.RequestError):
            await conn.prompt(session_id=ids[0], prompt=[acp.text_block("closed?")])
        before = len(client.updates)
        await conn.resume_session(session_id=ids[0], cwd=str(workspace), mcp_servers=[])
        await asyncio.sleep(0.05)
        assert not [u for _, u in client.updates[before:] if "Chunk" in type(u).__name__], (
            "resume does not replay"
        )
        await conn.prompt(session_id=ids[0], prompt=[acp.text_block("back")])
        history = [m["content"] for m in llm.requests[-1].messages if m["role"] == "user"]
        assert history == ["first prompt 0", "back"], "the fork did not touch the source"

        page = await conn.list_sessions(cwd=None)
        assert len(page.sessions) == 4


async def test_unknown_session_errors(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        await conn.initialize(protocol_version=1)
        for call in (
            conn.prompt(session_id="nope", prompt=[acp.text_block("x")]),
            conn.load_session(cwd=str(workspace), session_id="nope", mcp_servers=[]),
            conn.ext_method("crow.compact", {"sessionId": "nope"}),
        ):
            with pytest.raises(acp.RequestError) as err:
                await call
            assert (err.value.code, str(err.value)) == (-32002, "unknown session 'nope'")


async def test_model_config_option_switches_models(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    config = home / "models.yaml"
    config.write_text("models: [openai:scripted, openai:other-model]\n")
    async with spawn_crow(crow_env(llm, home), "--config", str(config)) as (conn, _proc, _client):
        await conn.initialize(protocol_version=1)
        new = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        options = {o.id: o for o in new.config_options}
        assert options["model"].category == "model" and options["mode"].category == "mode"
        assert [o.value for o in options["model"].options] == ["openai:scripted", "openai:other-model"]
        await conn.prompt(session_id=new.session_id, prompt=[acp.text_block("one")])
        changed = await conn.set_config_option(
            session_id=new.session_id, config_id="model", value="openai:other-model"
        )
        assert {o.id: o.current_value for o in changed.config_options}["model"] == "openai:other-model"
        await conn.prompt(session_id=new.session_id, prompt=[acp.text_block("two")])
        with pytest.raises(acp.RequestError):
            await conn.set_config_option(session_id=new.session_id, config_id="model", value="x:y")
    assert [r.model for r in llm.requests] == ["scripted", "other-model"]


def long_history(llm: ScriptedLLM, turns: int) -> None:
    for i in range(turns):
        llm.push(Reply(text=f"answer {i} " + "detail " * 50))


async def test_crow_compact_ext_method_and_replay_stays_whole(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    long_history(llm, 12)
    env = crow_env(llm, home)
    async with spawn_crow(env) as (conn, _proc, client):
        sid = await open_session(conn, workspace)
        for i in range(12):
            await conn.prompt(session_id=sid, prompt=[acp.text_block(f"question {i}")])
        llm.push(Reply(text="SUMMARY: twelve questions were answered."))
        result = await conn.ext_method("crow.compact", {"sessionId": sid, "instructions": "be brief"})
        assert result["compacted"] is True
        assert result["messagesAfter"] < result["messagesBefore"] == 24
        assert result["tokensAfter"] < result["tokensBefore"]
        assert "twelve questions" in result["summary"]
        summary_request = llm.requests[-1]
        assert "be brief" in summary_request.last_user_text
        assert summary_request.json.get("tool_choice") == "none"
        assert client.of_type("UsageUpdate")[-1].used == result["tokensAfter"]
        llm.push(Reply(text="after compaction"))
        await conn.prompt(session_id=sid, prompt=[acp.text_block("next")])
        sent = llm.requests[-1].messages
        assert any("twelve questions" in m["content"] for m in sent)
        assert len([m for m in sent if m["role"] != "system"]) < 24
    async with spawn_crow(env) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
    users = [u.content.text for u in client.of_type("UserMessageChunk")]
    assert users == [f"question {i}" for i in range(12)] + ["next"], "the replay stays whole"


async def test_slash_compact_and_busy_compact(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    long_history(llm, 6)
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await open_session(conn, workspace)
        for i in range(6):
            await conn.prompt(session_id=sid, prompt=[acp.text_block(f"q{i}")])
        for _ in range(50):
            if client.of_type("AvailableCommandsUpdate"):
                break
            await asyncio.sleep(0.01)
        assert "compact" in [c.name for c in client.of_type("AvailableCommandsUpdate")[0].available_commands]
        llm.push(Reply(text="short summary"))
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("/compact keep numbers")])
        assert response.stop_reason == "end_turn"
        assert "Compacted the conversation" in client.text()
        assert "keep numbers" in llm.requests[-1].last_user_text
        llm.push(Reply(text="slow " * 50, chunk_delay=0.02))
        task = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("talk")]))
        await asyncio.sleep(0.3)
        with pytest.raises(acp.RequestError) as err:
            await conn.ext_method("crow.compact", {"sessionId": sid})
        assert "busy" in str(err.value)
        await task


def test_cli_sessions_and_compact(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    env = crow_env(llm, home)
    long_history(llm, 5)

    async def make() -> str:
        async with spawn_crow(env) as (conn, _proc, _client):
            sid = await open_session(conn, workspace)
            for i in range(5):
                await conn.prompt(session_id=sid, prompt=[acp.text_block(f"cli question {i}")])
            return sid

    sid = asyncio.run(make())

    def crow(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "crow", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=workspace,
        )

    listed = crow("sessions", "list")
    assert listed.returncode == 0 and sid in listed.stdout and "cli question 0" in listed.stdout
    shown = crow("sessions", "show", sid)
    assert "cli question 4" in shown.stdout and "answer 4" in shown.stdout
    exported = json.loads(crow("sessions", "export", sid).stdout)
    assert len(exported["transcript"]) == 10 and exported["session"]["id"] == sid
    llm.push(Reply(text="cli summary"))
    compacted = crow("compact", sid)
    assert compacted.returncode == 0, compacted.stderr
    assert json.loads(compacted.stdout)["compacted"] is True
    context = json.loads(crow("sessions", "export", sid).stdout)["context"]
    assert len(context) < 10 and any("cli summary" in m["content"] for m in context)
    assert crow("sessions", "delete", sid).returncode == 0
    assert sid not in crow("sessions", "list").stdout
    missing = crow("sessions", "show", sid)
    assert missing.returncode == 2 and "unknown session" in missing.stderr
    assert os.environ.get("CROW_HOME") != str(home)
