"""End to end: the builtins `/usage` and `/mcp` (crow.report_commands) answer the user
from what crow knows, send nothing to the model, and are offered as commands."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import acp
import pytest
from acp.schema import EnvVariable, McpServerStdio

from tests.conftest import crow_env, spawn_crow
from tests.llm_server import Reply, ScriptedLLM
from tests.support.ts_client import run_script

pytestmark = pytest.mark.anyio

SUPPORT = Path(__file__).parent / "support"
PRICED = "model_settings:\n  openai:scripted:\n    pricing: {input: 2, output: 10, cache_read: 0.5}\n"


def echo(name: str) -> McpServerStdio:
    return McpServerStdio(
        name=name,
        command=sys.executable,
        args=[str(SUPPORT / "echo_mcp.py")],
        env=[EnvVariable(name="PYTHONPATH", value=str(SUPPORT))],
    )


async def start(conn: Any, workspace: Path, servers: list[Any] | None = None) -> str:
    await conn.initialize(protocol_version=1)
    return (await conn.new_session(cwd=str(workspace), mcp_servers=servers or [])).session_id


async def command(conn: Any, client: Any, sid: str, line: str) -> str:
    """Run a command line; the text the user was shown for it."""
    before = len(client.of_type("AgentMessageChunk", sid))
    done = await conn.prompt(session_id=sid, prompt=[acp.text_block(line)])
    assert done.stop_reason == "end_turn"
    return "".join(u.content.text for u in client.of_type("AgentMessageChunk", sid)[before:])


async def test_usage_reports_context_tokens_and_cost_without_calling_the_model(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (home / "config.yaml").write_text(PRICED)
    llm.push(Reply(text="hello", usage=(1000, 200)), Reply(text="again", usage=(1500, 100)))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        empty = await command(conn, client, sid, "/usage")
        await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
        await conn.prompt(session_id=sid, prompt=[acp.text_block("more")])
        shown = await command(conn, client, sid, "/usage")
        gauge = client.of_type("UsageUpdate", sid)[-1]
        advertised = client.of_type("AvailableCommandsUpdate", sid)[0]
    assert len(llm.requests) == 2  # /usage never reaches the model
    assert all("/usage" not in m["content"] for r in llm.requests for m in r.messages)
    assert "Tokens since crow opened this session: no model call yet" in empty
    assert "Cost of this session: $0.0000 (USD)" in empty
    assert "Model: openai:scripted" in shown
    window = gauge.size
    used = gauge.used
    assert f"Context: about {used:,} of {window:,} tokens used" in shown
    assert f"{window - used:,} left" in shown
    assert "Tokens since crow opened this session: 2,500 in, 300 out" in shown
    assert "Last model call: 1,500 in, 100 out" in shown
    cost = (2500 * 2 + 300 * 10) / 1e6
    assert f"Cost of this session: ${cost:,.4f} (USD)" in shown
    assert gauge.cost.amount == pytest.approx(cost)
    names = [c.name for c in advertised.available_commands]
    assert {"usage", "mcp"} <= set(names)


async def test_usage_says_when_the_cost_is_unknown(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    llm.push(Reply(text="hello", usage=(10, 2)))  # openai:scripted has no price here
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
        shown = await command(conn, client, sid, "/usage")
    assert "Cost of this session: unknown (a model call without a price" in shown


async def test_mcp_lists_servers_their_state_and_tools(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    servers = [
        echo("echo"),
        echo("loud"),  # its `shout` is taken: offered as loud_shout
        echo("filesystem"),  # crow's own server has that name: connected as filesystem_2
        McpServerStdio(name="broken", command="/nonexistent/server", args=[], env=[]),
    ]
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace, servers)
        shown = await command(conn, client, sid, "/mcp")
    assert llm.requests == []  # nothing sent to the model
    lines = {line.split(" (")[0].removeprefix("- "): line for line in shown.splitlines()[1:]}
    assert "read_file" in lines["filesystem"] and "(crow's own)" in lines["filesystem"]
    assert lines["echo"] == "- echo (from the editor, stdio): connected; 1 tool: shout"
    assert lines["loud"] == "- loud (from the editor, stdio): connected; 1 tool: loud_shout (its 'shout')"
    assert lines["filesystem_2"] == (
        "- filesystem_2 (from the editor, stdio; named 'filesystem', which another server had): "
        "connected; 1 tool: filesystem_2_shout (its 'shout')"
    )
    assert lines["broken"].startswith("- broken (from the editor, stdio): failed: ")
    assert lines["broken"].endswith("No such file or directory: '/nonexistent/server'")


def test_usage_and_mcp_with_the_typescript_sdk_client(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    steps = [
        {"request": "initialize", "params": {"protocolVersion": 1, "clientCapabilities": {}}},
        {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "new"},
        {
            "request": "session/prompt",
            "params": {"sessionId": "${new.sessionId}", "prompt": [_text("/usage")]},
        },
        {"request": "session/prompt", "params": {"sessionId": "${new.sessionId}", "prompt": [_text("/mcp")]}},
    ]
    out = run_script({"steps": steps}, crow_env(llm, home), workspace)
    shown = "".join(
        u["update"]["content"]["text"]
        for u in out["updates"]
        if u["update"]["sessionUpdate"] == "agent_message_chunk"
    )
    assert "Context: about" in shown and "MCP servers of this session" in shown
    assert llm.requests == []


def _text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}
