"""End to end: sessions that stay usable. Bad content from a client (an invalid image, a
lone surrogate) is refused or repaired at the edge, and text that is not valid Unicode from
the model or a tool never reaches the store or the wire: the next prompt still works."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
from pathlib import Path

import acp
import pytest
from acp import RequestError

from tests.conftest import CROW, crow_env, spawn_crow
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec

pytestmark = pytest.mark.anyio

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 32).decode()
JPEG = base64.b64encode(b"\xff\xd8\xff\xe0" + b"\0" * 32).decode()


async def open_session(conn, workspace: Path) -> str:  # type: ignore[no-untyped-def]
    await conn.initialize(protocol_version=1)
    return (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id


def image_parts(request) -> list[dict]:  # type: ignore[no-untyped-def]
    return [
        part
        for m in request.body["messages"]
        if isinstance(m.get("content"), list)
        for part in m["content"]
        if part.get("type") == "image_url"
    ]


@pytest.mark.parametrize(
    ("mime", "data", "problem"),
    [
        ("image/png", "!!!not base64!!!", "not valid base64"),
        ("image/png", PNG[:-2] + "=", "not valid base64"),  # bad padding
        ("image/svg+xml", PNG, "unsupported type 'image/svg+xml'"),
        ("image/png", JPEG, "is not a image/png image"),
        ("image/png", "", "data is empty"),
        ("image/png", "A" * (5 * 1024 * 1024 + 4), "over the limit"),
    ],
)
async def test_an_invalid_image_is_refused_and_the_session_goes_on(
    llm: ScriptedLLM, home: Path, workspace: Path, mime: str, data: str, problem: str
) -> None:
    llm.push(Reply(text="fine"))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        sid = await open_session(conn, workspace)
        with pytest.raises(RequestError) as refused:
            await conn.prompt(session_id=sid, prompt=[acp.text_block("look"), acp.image_block(data, mime)])
        assert refused.value.code == -32602
        assert problem in str(refused.value), str(refused.value)
        assert "image 1" in str(refused.value)
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("hello")])
    assert response.stop_reason == "end_turn" and response.field_meta is None
    assert len(llm.requests) == 1, "the refused prompt never reached the model"
    sent = llm.requests[0]
    assert image_parts(sent) == [], "nothing of the refused prompt was stored"
    assert [m["content"] for m in sent.messages if m["role"] == "user"] == ["hello"]


async def test_more_than_twenty_images_are_refused(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        sid = await open_session(conn, workspace)
        with pytest.raises(RequestError) as refused:
            await conn.prompt(session_id=sid, prompt=[acp.image_block(PNG, "image/png")] * 21)
    assert refused.value.code == -32602 and "more than 20 images" in str(refused.value)
    assert llm.requests == []


async def test_a_valid_image_reaches_the_model(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    llm.push(Reply(text="a picture"))
    wrapped = "\n".join(PNG[i : i + 16] for i in range(0, len(PNG), 16))  # MIME-style lines
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        sid = await open_session(conn, workspace)
        response = await conn.prompt(
            session_id=sid, prompt=[acp.text_block("look"), acp.image_block(wrapped, "image/png")]
        )
    assert response.stop_reason == "end_turn"
    assert image_parts(llm.requests[0]) == [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
    ]


async def test_a_lone_surrogate_from_the_model_does_not_poison_the_session(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    # Half an emoji in the text, the thinking and a tool call's arguments, as JSON escapes.
    llm.push(
        Reply(
            text="smile \ud83d ok",
            reasoning="think \udfff",
            tool_calls=[
                ToolCallSpec("write_todos", {"todos": [{"id": "1", "title": "t\ud800", "status": "pending"}]})
            ],
            chunk_size=3,
        ),
        Reply(text="after \ud83d tools"),
        Reply(text="second answer"),
    )
    env = crow_env(llm, home, CROW_MODE="yolo")
    async with spawn_crow(env) as (conn, _proc, client):
        sid = await open_session(conn, workspace)
        first = await conn.prompt(session_id=sid, prompt=[acp.text_block("hi \ud800 there")])
        assert first.stop_reason == "end_turn" and first.field_meta is None, first
        assert client.text() == "smile \ufffd okafter \ufffd tools"
        second = await conn.prompt(session_id=sid, prompt=[acp.text_block("again")])
        assert second.stop_reason == "end_turn" and second.field_meta is None, second
    sent = llm.requests[-1].messages
    assert [m["content"] for m in sent if m["role"] == "user"] == ["hi \ufffd there", "again"]
    assistant = [m for m in sent if m["role"] == "assistant"]
    assert assistant[0]["content"] == "smile \ufffd ok"
    assert assistant[0]["tool_calls"][0]["arguments"]["todos"][0]["title"] == "t\ufffd"
    assert assistant[1]["content"] == "after \ufffd tools"
    async with spawn_crow(env) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        assert client.text() == "smile \ufffd okafter \ufffd toolssecond answer"
        thoughts = "".join(u.content.text for u in client.of_type("AgentThoughtChunk"))
        assert thoughts == "think \ufffd"


@pytest.mark.skipif(os.uname().sysname != "Linux", reason="needs a file system that takes any bytes")
async def test_a_tool_output_that_is_not_unicode_does_not_poison_the_session(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    # A file name that is not UTF-8 reaches Python as a lone surrogate (surrogateescape).
    os.close(os.open(os.path.join(os.fsencode(workspace), b"bad\xff.txt"), os.O_CREAT | os.O_WRONLY))
    llm.push(Reply(tool_calls=[ToolCallSpec("ls", {"path": "."})]), Reply(text="listed"), Reply(text="more"))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await open_session(conn, workspace)
        first = await conn.prompt(session_id=sid, prompt=[acp.text_block("list")])
        assert first.stop_reason == "end_turn" and first.field_meta is None, first
        second = await conn.prompt(session_id=sid, prompt=[acp.text_block("again")])
        assert second.stop_reason == "end_turn" and second.field_meta is None, second
        shown = [c.content.text for u in client.of_type("ToolCallProgress") for c in u.content or ()]
        assert any("bad\ufffd.txt" in text for text in shown), shown
    tool = [m for m in llm.requests[-1].messages if m["role"] == "tool"]
    assert "bad\ufffd.txt" in tool[0]["content"]


@pytest.mark.slow
async def test_two_crow_processes_take_turns_in_one_session(
    llm: ScriptedLLM, home: Path, workspace: Path, tmp_path: Path
) -> None:
    env = crow_env(llm, home)
    llm.push(Reply(text="ready"))
    async with spawn_crow(env) as (a, a_proc, a_client):
        sid = await open_session(a, workspace)
        await a.prompt(session_id=sid, prompt=[acp.text_block("setup")])
        async with spawn_crow(env, stderr_path=tmp_path / "b.log") as (b, _b_proc, b_client):
            await b.initialize(protocol_version=1)
            await b.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
            assert b_client.text(sid) == "ready"
            llm.push(Reply(text="slow " * 400, chunk_delay=0.02), Reply(text="taken over"))
            slow = asyncio.create_task(a.prompt(session_id=sid, prompt=[acp.text_block("slow")]))
            for _ in range(500):
                if "slow" in a_client.text():
                    break
                await asyncio.sleep(0.01)
            with pytest.raises(RequestError) as busy:
                await b.prompt(session_id=sid, prompt=[acp.text_block("me too")])
            assert busy.value.code == -32001
            assert f"running a turn in another crow process (pid {a_proc.pid})" in str(busy.value)
            # Loading stays possible, read-only: the replay shows the turn so far.
            async with spawn_crow(env, stderr_path=tmp_path / "c.log") as (c, _c_proc, c_client):
                await c.initialize(protocol_version=1)
                await c.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
                shown = [u.content.text for u in c_client.of_type("UserMessageChunk")]
                assert shown == ["setup", "slow"]
            a_proc.send_signal(signal.SIGKILL)
            await a_proc.wait()
            slow.cancel()
            taken = await b.prompt(session_id=sid, prompt=[acp.text_block("take over")])
            assert taken.stop_reason == "end_turn" and taken.field_meta is None
    sent = llm.requests[-1].messages
    # b loaded before the slow turn began: it reloaded what a wrote since, and nothing of
    # the refused prompt was stored.
    assert [m["content"] for m in sent if m["role"] == "user"] == ["setup", "slow", "take over"]
    assert "took over the lock of crow process" in (tmp_path / "b.log").read_text()


@pytest.mark.slow
async def test_loading_a_session_mid_tool_call_elsewhere_writes_nothing(
    llm: ScriptedLLM, home: Path, workspace: Path, tmp_path: Path
) -> None:
    env = crow_env(llm, home, CROW_MODE="yolo")
    command = "while [ ! -e go ]; do sleep 0.02; done; echo done"  # runs until the test says go
    llm.push(Reply(tool_calls=[ToolCallSpec("execute", {"command": command})]), Reply(text="finished"))
    async with spawn_crow(env) as (a, _a_proc, a_client):
        sid = await open_session(a, workspace)
        turn = asyncio.create_task(a.prompt(session_id=sid, prompt=[acp.text_block("run it")]))
        for _ in range(500):
            if a_client.of_type("ToolCallProgress"):
                break
            await asyncio.sleep(0.01)
        async with spawn_crow(env, stderr_path=tmp_path / "b.log") as (b, _b_proc, b_client):
            await b.initialize(protocol_version=1)
            await b.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
            starts = b_client.of_type("ToolCallStart")
            assert [s.status for s in starts] == ["pending"], "shown as still running, not interrupted"
        (workspace / "go").touch()
        assert (await turn).stop_reason == "end_turn"
    llm.push(Reply(text="next"))
    async with spawn_crow(env) as (c, _c_proc, _client):
        await c.initialize(protocol_version=1)
        await c.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        response = await c.prompt(session_id=sid, prompt=[acp.text_block("and?")])
    assert response.stop_reason == "end_turn" and response.field_meta is None
    tools = [m for m in llm.requests[-1].messages if m["role"] == "tool"]
    assert len(tools) == 1 and "done" in tools[0]["content"], tools


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


@pytest.mark.slow
async def test_the_store_is_private_and_loose_modes_are_tightened(
    llm: ScriptedLLM, tmp_path: Path, workspace: Path
) -> None:
    home = tmp_path / "fresh" / "crow-home"  # does not exist yet: crow creates it
    trace = home / "trace.jsonl"
    env = crow_env(llm, home, CROW_TRACE=str(trace))
    llm.push(Reply(text="one"), Reply(text="two"))
    old_umask = os.umask(0o022)  # what most users have: files 0644, folders 0755 by default
    try:
        async with spawn_crow(env, stderr_path=tmp_path / "first.log") as (conn, _proc, _client):
            sid = await open_session(conn, workspace)
            await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
            assert mode(home) == 0o700
            assert {p.name: mode(p) for p in home.glob("crow.db*")} == {
                "crow.db": 0o600,
                "crow.db-wal": 0o600,
                "crow.db-shm": 0o600,
            }
            assert mode(trace) == 0o600
        assert "private" not in (tmp_path / "first.log").read_text(), "nothing to tighten"
        # Files made by an older crow (or by hand) with the usual modes are tightened at start.
        (home / "config.yaml").write_text("providers: {}\n")
        for path, loose in (
            (home, 0o755),
            (home / "crow.db", 0o644),
            (home / "config.yaml", 0o644),
            (trace, 0o644),
        ):
            path.chmod(loose)
        async with spawn_crow(env, stderr_path=tmp_path / "second.log") as (conn, _proc, _client):
            await conn.initialize(protocol_version=1)
            await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
            await conn.prompt(session_id=sid, prompt=[acp.text_block("again")])
        assert (mode(home), mode(home / "crow.db"), mode(home / "config.yaml"), mode(trace)) == (
            0o700,
            0o600,
            0o600,
            0o600,
        )
        log = (tmp_path / "second.log").read_text()
        lines = [line for line in log.splitlines() if "made crow's files" in line]
        assert len(lines) == 1, log
        assert "crow-home 0755→0700" in lines[0] and "crow.db 0644→0600" in lines[0]
        assert "config.yaml 0644→0600" in lines[0]
        assert f"made trace file {trace} private: 0644→0600" in log
        export = tmp_path / "export.json"
        with open(export, "w") as out:
            export.chmod(0o644)
            done = await asyncio.to_thread(
                subprocess.run,
                [*CROW, "sessions", "export", sid],
                env=env,
                stdout=out,
                stderr=subprocess.PIPE,
                timeout=60,
            )
        assert done.returncode == 0, done.stderr
        assert mode(export) == 0o600
        assert f"made export {export} private: 0644→0600" in done.stderr.decode()
        assert json.loads(export.read_text())["session"]["id"] == sid
    finally:
        os.umask(old_umask)


@pytest.mark.slow
async def test_a_session_killed_mid_tool_call_is_taken_over_with_a_valid_history(
    llm: ScriptedLLM, home: Path, workspace: Path, tmp_path: Path
) -> None:
    env = crow_env(llm, home, CROW_MODE="yolo")
    command = "while [ ! -e go ]; do sleep 0.02; done; echo done"
    llm.push(Reply(tool_calls=[ToolCallSpec("execute", {"command": command})]))
    async with spawn_crow(env) as (a, a_proc, a_client):
        sid = await open_session(a, workspace)
        turn = asyncio.create_task(a.prompt(session_id=sid, prompt=[acp.text_block("run it")]))
        for _ in range(500):
            if a_client.of_type("ToolCallProgress"):
                break
            await asyncio.sleep(0.01)
        async with spawn_crow(env, stderr_path=tmp_path / "b.log") as (b, _b_proc, _client):
            await b.initialize(protocol_version=1)
            await b.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])  # mid-call
            a_proc.send_signal(signal.SIGKILL)
            await a_proc.wait()
            turn.cancel()
            llm.push(Reply(text="taken over"))
            response = await b.prompt(session_id=sid, prompt=[acp.text_block("go on")])
    assert response.stop_reason == "end_turn" and response.field_meta is None
    sent = [m for m in llm.requests[-1].messages if m["role"] != "system"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "user"]
    assert "interrupted" in sent[2]["content"]


async def test_a_cwd_that_is_not_unicode_is_refused(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        await conn.initialize(protocol_version=1)
        with pytest.raises(RequestError) as refused:
            await conn.new_session(cwd=f"{workspace}/\udcff", mcp_servers=[])
        assert refused.value.code == -32602 and "valid Unicode" in str(refused.value.data)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        llm.push(Reply(text="fine"))
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
    assert response.stop_reason == "end_turn"


async def test_a_session_stored_with_an_invalid_image_is_healed_on_load(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    from crow.messages import Image, Message
    from crow.store import SQLiteStore

    # What an older crow stored: the image went in unchecked, every later request failed.
    async with SQLiteStore(home / "crow.db") as store:
        await store.create_session(id="old", cwd=str(workspace))
        bad = Message("user", "look", images=(Image("image/png", "!!!"), Image("image/png", PNG)))
        await store.append("old", [bad, Message("assistant", "seen")])
    llm.push(Reply(text="fine"))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        await conn.load_session(cwd=str(workspace), session_id="old", mcp_servers=[])
        assert client.of_type("UserMessageChunk")[0].content.text == "look\n[image]\n[image]", (
            "the transcript is as shown"
        )
        response = await conn.prompt(session_id="old", prompt=[acp.text_block("again")])
    assert response.stop_reason == "end_turn"
    sent = llm.requests[0]
    assert [p["image_url"]["url"] for p in image_parts(sent)] == [f"data:image/png;base64,{PNG}"]
    first = sent.messages[1]["content"]
    assert first.startswith("look\n[an image was removed here: data is not valid base64"), first
