"""End to end: the same conversations against the OpenAI-compatible and Anthropic wire
formats, switching providers mid-session, and provider faults."""

from __future__ import annotations

import base64
from pathlib import Path

import acp
import pytest

from tests.conftest import crow_env, spawn_crow
from tests.llm_server import Cut, Fault, Reply, ScriptedLLM, Stall, ToolCallSpec

pytestmark = pytest.mark.anyio


def anthropic_env(llm: ScriptedLLM, home: Path, **extra: str) -> dict[str, str]:
    return crow_env(
        None,
        home,
        CROW_MODEL="anthropic:claude-test",
        ANTHROPIC_BASE_URL=llm.root_url,
        ANTHROPIC_API_KEY="anthropic-test-key",
        **extra,
    )


async def start(conn, workspace: Path) -> str:  # type: ignore[no-untyped-def]
    await conn.initialize(protocol_version=1)
    return (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_conversation_with_tools_on_both_wire_formats(
    api: str, llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (workspace / "notes.md").write_text("the answer is 42\n")
    env = crow_env(llm, home) if api == "openai" else anthropic_env(llm, home)
    llm.push(
        Reply(
            tool_calls=[ToolCallSpec(name="read_file", arguments={"path": "notes.md"})],
            reasoning="I should read the notes",
        ),
        Reply(text="The notes say 42."),
    )
    async with spawn_crow(env) as (conn, _proc, client):
        sid = await start(conn, workspace)
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("what do the notes say?")])
    assert response.stop_reason == "end_turn"
    assert client.text() == "The notes say 42."
    assert "I should read the notes" in "".join(u.content.text for u in client.of_type("AgentThoughtChunk"))
    assert {r.api for r in llm.requests} == {api}
    tool = [m for m in llm.requests[1].messages if m["role"] == "tool"][0]
    assert "the answer is 42" in tool["content"]
    if api == "anthropic":
        body = llm.requests[1].json
        assert body["system"][-1]["cache_control"] == {"type": "ephemeral"}
        assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
        assert llm.requests[1].headers["x-api-key"] == "anthropic-test-key"


async def test_switching_provider_mid_session_keeps_the_history(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (workspace / "a.txt").write_text("alpha\n")
    config = home / "c.yaml"
    config.write_text("model: openai:scripted\nmodels: [openai:scripted, anthropic:claude-test]\n")
    env = crow_env(llm, home, ANTHROPIC_BASE_URL=llm.root_url, ANTHROPIC_API_KEY="k")
    llm.push(
        Reply(tool_calls=[ToolCallSpec(name="read_file", arguments={"path": "a.txt"})]),
        Reply(text="It is alpha."),
        Reply(text="Still alpha, from Claude."),
    )
    async with spawn_crow(env, "--config", str(config)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("read a.txt")])
        await conn.set_config_option(session_id=sid, config_id="model", value="anthropic:claude-test")
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("sure?")])
    assert response.stop_reason == "end_turn" and client.text().endswith("Still alpha, from Claude.")
    assert [r.api for r in llm.requests] == ["openai", "openai", "anthropic"]
    body = llm.requests[-1].json
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    uses = [
        b
        for m in body["messages"]
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_use"
    ]
    results = [
        b
        for m in body["messages"]
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    assert uses and results and uses[0]["id"] == results[0]["tool_use_id"]


async def test_cut_after_output_keeps_what_was_shown(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    llm.push(Cut(after_chunks=3, text="one two three four five six"), Reply(text="recovered"))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        with pytest.raises(acp.RequestError) as first:
            await conn.prompt(session_id=sid, prompt=[acp.text_block("count")])
        assert first.value.data["cause"] == "stream_cut"
        assert client.text() == (
            "one two three Model call failed: openai: connection lost mid-response: peer closed "
            "connection without sending complete message body (incomplete chunked read) (after partial output)\n"
        )
        second = await conn.prompt(session_id=sid, prompt=[acp.text_block("again")])
    assert second.stop_reason == "end_turn"
    assert len(llm.requests) == 2, "a cut after output is not replayed"
    kept = [m for m in llm.requests[-1].messages if m["role"] == "assistant"]
    assert kept and kept[0]["content"].startswith("one") and "cut off" in kept[0]["content"]


async def test_auth_error_names_the_variable_and_hides_the_key(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Fault(status=401, message="invalid api key"))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        with pytest.raises(acp.RequestError) as failed:
            await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
    assert failed.value.code == -32000 and failed.value.data["cause"] == "auth"  # auth_required
    error = failed.value.data["error"]
    assert "OPENAI_API_KEY" in error and "test-key" not in error and "test-key" not in client.text()
    assert "test-key" not in (home / "stderr.log").read_text()


async def test_stall_past_read_timeout_is_retried(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    config = home / "c.yaml"
    config.write_text("providers:\n  openai: {read_timeout: 0.5}\n")
    llm.push(Stall(seconds=5), Reply(text="after the stall"))
    async with spawn_crow(crow_env(llm, home), "--config", str(config)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
    # told in text to a client without `session.notices`
    assert response.stop_reason == "end_turn"
    assert client.text().startswith("Retrying the model call in ") and client.text().endswith("\nafter the stall")
    assert len(llm.requests) == 2


async def test_context_length_error_compacts_and_retries(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.default = lambda req: Reply(text=f"answer to {req.last_user_text} " + "x " * 100)
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        for i in range(8):
            await conn.prompt(session_id=sid, prompt=[acp.text_block(f"q{i}")])
        llm.push(
            Fault(status=400, message="This model's maximum context length is 4096 tokens"),
            Reply(text="SUMMARY of q0..q7"),
            Reply(text="fits now"),
        )
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("last")])
    assert response.stop_reason == "end_turn" and client.text().endswith("fits now")
    final = llm.requests[-1].messages
    assert any("SUMMARY of q0..q7" in m["content"] for m in final)
    assert len(final) < len(llm.requests[-3].messages)


async def test_image_prompt_is_passed_through(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    png = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        init = await conn.initialize(protocol_version=1)
        assert init.agent_capabilities.prompt_capabilities.image is True
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        await conn.prompt(
            session_id=sid, prompt=[acp.text_block("what is this?"), acp.image_block(png, "image/png")]
        )
    user = [m for m in llm.requests[-1].json["messages"] if m["role"] == "user"][-1]
    parts = user["content"]
    assert any(p.get("type") == "image_url" and png in p["image_url"]["url"] for p in parts)
