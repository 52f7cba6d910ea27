"""End to end: crow spawned as a subprocess, driven by the ACP Python client, talking to
the scripted model server over real HTTP."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import acp
import pytest
import yaml

from crow.acp.sessions import FAILED
from tests.conftest import crow_env, spawn_crow
from tests.llm_server import Fault, Reply, ScriptedLLM, ToolCallSpec

pytestmark = pytest.mark.anyio

SUPPORT = Path(__file__).parent / "support"


def write_config(home: Path, **data: object) -> Path:
    path = home / "test-config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def plugin_env(llm: ScriptedLLM, home: Path, **extra: str) -> dict[str, str]:
    return crow_env(llm, home, PYTHONPATH=str(SUPPORT), **extra)


async def new_session(conn, workspace: Path) -> str:  # type: ignore[no-untyped-def]
    await conn.initialize(protocol_version=1)
    return (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id


async def test_initialize_is_honest(llm: ScriptedLLM, home: Path) -> None:
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        init = await conn.initialize(protocol_version=1)
    assert init.protocol_version == 1
    assert init.agent_info.name == "crow"
    caps = init.agent_capabilities
    assert caps.prompt_capabilities.embedded_context is True
    assert "crow.compact" in caps.field_meta["crow"]["extensions"]


async def test_plain_answer_streams(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    llm.push(Reply(text="Hello there from the model", reasoning="thinking hard"))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await new_session(conn, workspace)
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("say hello")])
    assert response.stop_reason == "end_turn"
    chunks = client.of_type("AgentMessageChunk")
    assert len(chunks) > 1, "the answer should arrive in several chunks"
    assert client.text() == "Hello there from the model"
    assert "".join(u.content.text for u in client.of_type("AgentThoughtChunk")) == "thinking hard"
    usage = client.of_type("UsageUpdate")
    assert usage and usage[-1].size == 128_000 and usage[-1].used > 0
    request = llm.requests[-1]
    assert request.stream and request.last_user_text == "say hello"
    assert request.json["stream_options"] == {"include_usage": True}


async def test_tool_call_then_answer_with_hooks_in_order(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    order_file = home / "order.txt"
    config = write_config(
        home, tools=["e2e_plugins:add"], hooks={"extra": ["e2e_plugins:Outer", "e2e_plugins:Inner"]}
    )
    llm.push(Reply(tool_calls=[ToolCallSpec(name="add", arguments={"a": 2, "b": 3})]))
    llm.push(Reply(text="The sum is 5."))
    env = plugin_env(llm, home, CROW_TEST_ORDER_FILE=str(order_file))
    async with spawn_crow(env, "--config", str(config)) as (conn, _proc, client):
        sid = await new_session(conn, workspace)
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("add 2 and 3")])
    assert response.stop_reason == "end_turn"
    assert client.text() == "The sum is 5."
    # the model saw the tool, and the tool's result came back to it
    assert "add" in llm.requests[0].tool_names
    tool_msgs = [m for m in llm.requests[1].messages if m["role"] == "tool"]
    assert json.loads(tool_msgs[0]["content"]) == {"sum": 5}
    # the editor saw the call go pending -> in_progress -> completed
    start = client.of_type("ToolCallStart")[0]
    assert start.status == "pending" and start.raw_input == {"a": 2, "b": 3}
    statuses = [u.status for u in client.of_type("ToolCallProgress")]
    assert statuses == ["in_progress", "completed"]
    # the lower `order` is the outer layer, for model and tool calls alike
    assert order_file.read_text().split() == [
        "outer:model:before",
        "inner:model:before",
        "inner:model:after",
        "outer:model:after",
        "outer:tool:add:before",
        "inner:tool:add:before",
        "inner:tool:add:after",
        "outer:tool:add:after",
        "outer:model:before",
        "inner:model:before",
        "inner:model:after",
        "outer:model:after",
    ]


async def test_invalid_tool_json_and_unknown_tool_reach_the_model(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    config = write_config(home, tools=["e2e_plugins:add"])
    llm.push(Reply(tool_calls=[ToolCallSpec(name="add", raw_arguments='{"a": 1, "b":')]))
    llm.push(Reply(tool_calls=[ToolCallSpec(name="nope", arguments={})]))
    llm.push(Reply(text="sorry"))
    async with spawn_crow(plugin_env(llm, home), "--config", str(config)) as (conn, _p, client):
        sid = await new_session(conn, workspace)
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
    assert response.stop_reason == "end_turn"
    first = [m for m in llm.requests[1].messages if m["role"] == "tool"][0]["content"]
    assert "not valid JSON" in first
    second = [m for m in llm.requests[2].messages if m["role"] == "tool"][-1]["content"]
    assert "unknown tool 'nope'" in second and "add" in second
    assert [u.status for u in client.of_type("ToolCallProgress")].count("failed") == 2


async def test_rate_limit_then_success(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    llm.push(Fault(status=429, retry_after=0.2), Reply(text="finally"))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await new_session(conn, workspace)
        started = time.monotonic()
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
        elapsed = time.monotonic() - started
    # a client without `session.notices` is told of the retry in text (tests/test_e2e_notices.py)
    assert response.stop_reason == "end_turn" and client.text().endswith("rate_limit_error]\nfinally")
    assert client.text().startswith("Retrying the model call in 0.2 s (attempt 2 of 3): ")
    assert len(llm.requests) == 2 and elapsed >= 0.2


async def test_model_failure_is_reported_and_session_stays_usable(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Fault(status=400, message="bad model name"), Reply(text="works now"))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await new_session(conn, workspace)
        with pytest.raises(acp.RequestError) as failed:
            await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
        assert "bad model name" in client.text()
        assert failed.value.code == FAILED and "bad model name" in failed.value.data["error"]
        ok = await conn.prompt(session_id=sid, prompt=[acp.text_block("again")])
    assert ok.stop_reason == "end_turn" and client.text().endswith("works now")


async def test_cancel_mid_stream(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    llm.push(Reply(text=" ".join(f"word{i}" for i in range(200)), chunk_delay=0.05))
    llm.push(Reply(text="next answer"))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await new_session(conn, workspace)
        task = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("talk")]))
        for _ in range(200):
            if client.of_type("AgentMessageChunk"):
                break
            await asyncio.sleep(0.01)
        started = time.monotonic()
        await conn.cancel(session_id=sid)
        response = await task
        took = time.monotonic() - started
        assert response.stop_reason == "cancelled"
        assert took < 0.2, f"cancel took {took:.3f}s"
        for _ in range(100):
            if llm.disconnects:
                break
            await asyncio.sleep(0.01)
        assert llm.disconnects == 1, "the model stream should be closed on cancel"
        again = await conn.prompt(session_id=sid, prompt=[acp.text_block("more")])
    assert again.stop_reason == "end_turn"
    # the history sent next is valid: the partial answer is kept, then the new prompt
    roles = [m["role"] for m in llm.requests[-1].messages if m["role"] != "system"]
    assert roles[-1] == "user"


async def test_cancel_during_tool_ends_the_call_and_keeps_history_valid(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    config = write_config(home, tools=["e2e_plugins:slow"])
    llm.push(Reply(tool_calls=[ToolCallSpec(name="slow", arguments={"seconds": 30})]))
    llm.push(Reply(text="after cancel"))
    async with spawn_crow(plugin_env(llm, home), "--config", str(config)) as (conn, _p, client):
        sid = await new_session(conn, workspace)
        task = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("wait")]))
        for _ in range(300):
            if [u for u in client.of_type("ToolCallProgress") if u.status == "in_progress"]:
                break
            await asyncio.sleep(0.01)
        started = time.monotonic()
        await conn.cancel(session_id=sid)
        response = await task
        assert response.stop_reason == "cancelled" and time.monotonic() - started < 0.2
        # the editor is told the call is over (no spinner left), before the prompt's answer
        (start,) = client.of_type("ToolCallStart")
        statuses = [u.status for u in client.of_type("ToolCallProgress") if u.tool_call_id == start.tool_call_id]
        assert statuses == ["in_progress", "failed"]
        again = await conn.prompt(session_id=sid, prompt=[acp.text_block("and now?")])
    assert again.stop_reason == "end_turn"
    messages = llm.requests[-1].messages
    tool = [m for m in messages if m["role"] == "tool"]
    assert tool and "Cancelled" in tool[0]["content"]


async def test_busy_session_is_refused(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    llm.push(Reply(text="slow " * 40, chunk_delay=0.02))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        sid = await new_session(conn, workspace)
        first = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("one")]))
        await asyncio.sleep(0.3)
        with pytest.raises(acp.RequestError) as err:
            await conn.prompt(session_id=sid, prompt=[acp.text_block("two")])
        assert "busy" in str(err.value)
        assert (await first).stop_reason == "end_turn"


async def test_iteration_limit(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    config = write_config(home, tools=["e2e_plugins:add"], max_iterations=3)
    llm.default = Reply(tool_calls=[ToolCallSpec(name="add", arguments={"a": 1, "b": 1})])
    async with spawn_crow(plugin_env(llm, home), "--config", str(config)) as (conn, _p, _c):
        sid = await new_session(conn, workspace)
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("loop")])
    assert response.stop_reason == "max_turn_requests"
    assert len(llm.requests) == 3


async def test_no_model_configured(home: Path, workspace: Path) -> None:
    async with spawn_crow(crow_env(None, home)) as (conn, _proc, client):
        sid = await new_session(conn, workspace)
        with pytest.raises(acp.RequestError) as failed:
            await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
    assert failed.value.code == FAILED and failed.value.data["cause"] == "no_model"
    assert "CROW_MODEL" in client.text() and "CROW_MODEL" in str(failed.value)


async def test_many_sessions_in_one_process(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    llm.default = lambda req: Reply(text=f"echo {req.last_user_text}", chunk_delay=0.01)
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        sids = [(await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id for _ in range(5)]
        results = await asyncio.gather(
            *(conn.prompt(session_id=sid, prompt=[acp.text_block(f"s{i}")]) for i, sid in enumerate(sids))
        )
    assert all(r.stop_reason == "end_turn" for r in results)
    for i, sid in enumerate(sids):
        assert client.text(sid) == f"echo s{i}"


async def test_relative_cwd_is_rejected(llm: ScriptedLLM, home: Path) -> None:
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        await conn.initialize(protocol_version=1)
        with pytest.raises(acp.RequestError):
            await conn.new_session(cwd="relative/path", mcp_servers=[])


async def test_embedded_resources_become_the_user_message(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        sid = await new_session(conn, workspace)
        blocks = [
            acp.text_block("explain"),
            acp.resource_link_block("notes.md", "file:///tmp/notes.md"),
            acp.resource_block(acp.embedded_text_resource("file:///tmp/a.py", "print(1)")),
        ]
        await conn.prompt(session_id=sid, prompt=blocks)
    text = llm.requests[-1].last_user_text
    assert "explain" in text and "file:///tmp/notes.md" in text and "print(1)" in text


async def test_a_misspelt_hooks_disable_fails_each_prompt_with_the_config_error(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    # The warm-up fails on the unknown name; each prompt answered "Internal error" with no
    # word of why. It must name the setting (`crow run`: tests/test_cli.py), and call no model.
    config = write_config(home, hooks={"disable": ["memroy"]})
    async with spawn_crow(crow_env(llm, home), "--config", str(config)) as (conn, _proc, _client):
        sid = await new_session(conn, workspace)
        for _ in range(2):
            with pytest.raises(acp.RequestError) as failed:
                await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
            assert failed.value.code == FAILED
            assert str(failed.value).startswith(
                f"invalid configuration in {config}: hooks.disable names unknown hook(s) 'memroy'"
            )
    assert llm.requests == []
