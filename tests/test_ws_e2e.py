"""End to end: `crow serve --listen ws://…` driven by the ACP Python SDK's WebSocket client
(`acp.ws`), against the scripted model; every message crow writes is checked against the
ACP schema as on stdio."""

from __future__ import annotations

import asyncio
from pathlib import Path

import acp
import pytest

from tests.conftest import crow_env, initialize_125
from tests.llm_server import Reply, ScriptedLLM
from tests.support.ws import TOKEN, ws_client, ws_crow

pytestmark = pytest.mark.anyio


def env_with_token(llm: ScriptedLLM | None, home: Path, **extra: str) -> dict[str, str]:
    return crow_env(llm, home, CROW_SERVER_TOKEN=TOKEN, **extra)


async def test_a_client_with_the_token_runs_sessions_and_loads_them(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Reply(text="hello over the socket", chunk_size=4))
    async with ws_crow(env_with_token(llm, home)) as served:
        async with ws_client(served.url) as (conn, client):
            await initialize_125(conn)
            sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            done = await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
            assert done.stop_reason == "end_turn"
            assert client.text(sid) == "hello over the socket"
            assert len(client.of_type("AgentMessageChunk", sid)) > 3  # streamed, chunk by chunk
        async with ws_client(served.url) as (conn, client):
            await initialize_125(conn)
            await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
            assert client.text(sid) == "hello over the socket"
            assert [u.content.text for u in client.of_type("UserMessageChunk", sid)] == ["hi"]
