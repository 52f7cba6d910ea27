"""End to end: `crow serve --listen ws://…` driven by the ACP Python SDK's WebSocket client
(`acp.ws`), against the scripted model; every message crow writes is checked against the
ACP schema as on stdio."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import acp
import pytest

from tests.conftest import crow_env, initialize_125
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec
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


async def test_a_wrong_or_missing_token_is_refused_at_the_handshake_and_crow_serves_on(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    from websockets.exceptions import InvalidStatus

    async with ws_crow(env_with_token(llm, home)) as served:
        for token in ("wrong-token", None, TOKEN + "x", ""):
            with pytest.raises(InvalidStatus) as refused:
                async with ws_client(served.url, token):
                    pass
            assert refused.value.response.status_code == 401
            assert refused.value.response.headers["WWW-Authenticate"] == "Bearer"
        async with ws_client(served.url) as (conn, _client):
            await initialize_125(conn)
            assert (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
    assert "Traceback" not in served.log()


async def test_two_connections_at_once_keep_to_their_own_sessions(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """Prompts of two clients interleaved (each reply slow, word by word): each client sees
    its own sessions' updates, and only those."""
    llm.default = lambda r: Reply(text=f"{r.last_user_text} " * 20, chunk_size=0, chunk_delay=0.01)
    async with ws_crow(env_with_token(llm, home)) as served:
        async with ws_client(served.url) as (a, client_a), ws_client(served.url) as (b, client_b):
            await initialize_125(a)
            await initialize_125(b)
            ids = {}
            for name, conn in (("a", a), ("b", b)):
                for n in range(2):
                    ids[f"{name}{n}"] = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            turns = [
                (a if key.startswith("a") else b).prompt(session_id=sid, prompt=[acp.text_block(key)])
                for key, sid in ids.items()
            ]
            assert {r.stop_reason for r in await asyncio.gather(*turns)} == {"end_turn"}
            for key, sid in ids.items():
                mine, other = (client_a, client_b) if key.startswith("a") else (client_b, client_a)
                assert mine.text(sid) == f"{key} " * 20
                assert not [u for s, u in other.updates if s == sid]
            assert {s for s, _ in client_a.updates} == {ids["a0"], ids["a1"]}


BUSY = -32001
SLOW = Reply(text=" ".join(f"w{i}" for i in range(400)), chunk_delay=0.05)  # ~20 s of words


async def until(check: Any, what: str, timeout: float = 30) -> Any:
    """Wait for `check()` to be true (an event seen from outside); its value."""
    async with asyncio.timeout(timeout):
        while not (value := check()):
            await asyncio.sleep(0.05)
    return value


async def load_when_free(url: str, sid: str, workspace: Path) -> Any:
    """`session/load` in a new connection, again while it answers busy (the connection that
    had the session is still closing it); the open connection and its client."""
    async with asyncio.timeout(30):
        while True:
            stack = contextlib.AsyncExitStack()
            conn, client = await stack.enter_async_context(ws_client(url))
            await initialize_125(conn)
            try:
                await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
            except acp.RequestError as exc:
                await stack.aclose()
                assert exc.code == BUSY, exc
                await asyncio.sleep(0.05)
                continue
            return stack, conn, client


async def test_a_session_live_in_one_connection_is_busy_for_another_until_that_one_ends(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Reply(text="first"))
    async with ws_crow(env_with_token(llm, home)) as served:
        async with ws_client(served.url) as (a, _client_a):
            await initialize_125(a)
            sid = (await a.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            await a.prompt(session_id=sid, prompt=[acp.text_block("one")])
            async with ws_client(served.url) as (b, client_b):
                await initialize_125(b)
                for ask in (
                    b.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[]),
                    b.resume_session(cwd=str(workspace), session_id=sid, mcp_servers=[]),
                    b.prompt(session_id=sid, prompt=[acp.text_block("mine now")]),
                    b.set_session_mode(session_id=sid, mode_id="yolo"),
                    b.close_session(session_id=sid),
                ):
                    with pytest.raises(acp.RequestError) as busy:
                        await ask
                    assert busy.value.code == BUSY
                    assert "open in another connection" in str(busy.value)
                assert client_b.updates == []  # nothing of A's session leaked into B
            llm.push(Reply(text="still mine"))  # A's session is untouched by all that
            assert (await a.prompt(session_id=sid, prompt=[acp.text_block("two")])).stop_reason == "end_turn"
        stack, b, client_b = await load_when_free(served.url, sid, workspace)
        async with stack:
            assert client_b.text(sid) == "firststill mine"
            llm.push(Reply(text="now B's"))
            assert (await b.prompt(session_id=sid, prompt=[acp.text_block("three")])).stop_reason == "end_turn"


async def test_a_client_gone_mid_turn_has_its_turn_cancelled_and_the_history_stays_valid(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """The client vanishes while a command runs: the turn is cancelled (the tool call settled,
    not left dangling), the session is closed and free, and crow serves on."""
    started = workspace / "started"
    llm.push(
        Reply(tool_calls=[ToolCallSpec("execute", {"command": f"touch {started}; sleep 60"}, id="c1")]),
    )
    async with ws_crow(env_with_token(llm, home, CROW_SANDBOX="off")) as served:
        async with ws_client(served.url) as (a, _client_a):
            await initialize_125(a)
            sid = (await a.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            await a.set_session_mode(session_id=sid, mode_id="yolo")
            turn = asyncio.create_task(a.prompt(session_id=sid, prompt=[acp.text_block("run it")]))
            await until(started.exists, "the command started")
        with pytest.raises(ConnectionError):
            await turn  # the client's own side: its connection is gone
        stack, b, client_b = await load_when_free(served.url, sid, workspace)
        async with stack:
            assert [u.content.text for u in client_b.of_type("UserMessageChunk", sid)] == ["run it"]
            calls = [(type(u).__name__, u.status) for _, u in client_b.updates if getattr(u, "tool_call_id", 0) == "c1"]
            assert calls == [("ToolCallStart", "failed")]  # replayed as it ended: not left running
            llm.push(Reply(text="again"))
            assert (await b.prompt(session_id=sid, prompt=[acp.text_block("go on")])).stop_reason == "end_turn"
        sent = llm.requests[-1].messages
        assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "user"]
        assert sent[3]["tool_call_id"] == "c1"


async def test_a_client_gone_while_the_model_streams_cancels_the_model_call(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(SLOW)
    async with ws_crow(env_with_token(llm, home)) as served:
        async with ws_client(served.url) as (a, client_a):
            await initialize_125(a)
            sid = (await a.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            turn = asyncio.create_task(a.prompt(session_id=sid, prompt=[acp.text_block("talk")]))
            await until(lambda: client_a.text(sid), "the first words")
        with pytest.raises(ConnectionError):
            await turn
        await until(lambda: llm.requests[0].disconnected, "crow abandoned the model's stream")
        stack, _b, client_b = await load_when_free(served.url, sid, workspace)
        async with stack:
            shown = client_b.text(sid)
            assert shown.startswith("w0") and shown.endswith("[interrupted by the user]"), shown
            assert "w399" not in shown
