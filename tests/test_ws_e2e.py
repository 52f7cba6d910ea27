"""End to end: `crow serve --listen ws://…` driven by the ACP Python SDK's WebSocket client
(`acp.ws`), against the scripted model; every message crow writes is checked against the
ACP schema as on stdio."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import acp
import pytest
from websockets.exceptions import InvalidHandshake

from tests.conftest import CROW, FEATURES_125, crow_env, initialize_125
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
            # what follows session/new (its commands) follows its answer on the wire
            assert client.wire is not None
            crow_wrote = [m for d, m in client.wire.messages if d == "in"]
            answer = next(
                i for i, m in enumerate(crow_wrote) if (m.get("result") or {}).get("sessionId") == sid
            )
            assert all(m.get("method") != "session/update" for m in crow_wrote[:answer])
            assert any(m.get("method") == "session/update" for m in crow_wrote[answer:])
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


async def test_past_max_connections_a_client_is_told_503_until_one_leaves(home: Path, workspace: Path) -> None:
    """A client reconnecting in a loop (or a crowd of them) cannot make crow hold unbounded
    connections; one without the token is still told 401, not how full crow is."""
    from websockets.exceptions import InvalidStatus

    async with ws_crow(env_with_token(None, home), "--max-connections", "2") as served:
        async with ws_client(served.url) as (a, _), ws_client(served.url) as (b, _):
            await initialize_125(a)
            await initialize_125(b)
            with pytest.raises(InvalidStatus) as full:
                async with ws_client(served.url):
                    pass
            assert full.value.response.status_code == 503
            assert full.value.response.headers["Retry-After"] == "10"
            assert b"serves 2 clients already" in full.value.response.body
            with pytest.raises(InvalidStatus) as stranger:
                async with ws_client(served.url, "wrong-token"):
                    pass
            assert stranger.value.response.status_code == 401
            assert (await a.new_session(cwd=str(workspace), mcp_servers=[])).session_id  # both serve on
        for _ in range(3):  # their places are free again, once crow has closed their sessions
            deadline = asyncio.get_running_loop().time() + 30
            while True:
                try:
                    async with ws_client(served.url) as (c, _):
                        await initialize_125(c)
                    break
                except InvalidStatus as exc:
                    assert exc.response.status_code == 503
                    assert asyncio.get_running_loop().time() < deadline, "the places stayed taken"
                    await asyncio.sleep(0.05)
    assert "Traceback" not in served.log()


async def test_sockets_that_never_hand_shake_cannot_use_up_crows_descriptors(home: Path) -> None:
    """Anyone who can reach the port can open sockets and say nothing (each is held up to
    the 10 s handshake timeout, token or not): past twice --max-connections open, one more is
    closed at once, and once they go a client with the token is served."""
    async with ws_crow(env_with_token(None, home), "--max-connections", "2") as served:
        host, port = served.url.removeprefix("ws://").rsplit(":", 1)
        silent = [await asyncio.open_connection(host, int(port)) for _ in range(4)]
        extra_reader, extra_writer = await asyncio.open_connection(host, int(port))
        assert await asyncio.wait_for(extra_reader.read(), 5) == b""  # closed at once, not in 10 s
        for _, writer in silent:  # the first four are held, waiting for their handshake
            assert not writer.is_closing()
        for _, writer in [*silent, (extra_reader, extra_writer)]:
            writer.close()
        deadline = asyncio.get_running_loop().time() + 30
        while True:  # their places free as crow sees them close
            try:
                async with ws_client(served.url) as (conn, _):
                    await initialize_125(conn)
                break
            except (ConnectionError, OSError, EOFError, InvalidHandshake):
                assert asyncio.get_running_loop().time() < deadline, "the places stayed taken"
                await asyncio.sleep(0.05)
    log = served.log()
    assert "Traceback" not in log and len(log.splitlines()) < 40, log


async def test_the_official_typescript_sdk_runs_a_session_over_the_socket(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """A client written elsewhere (the TypeScript SDK, on Node's own WebSocket): it checks
    every frame crow sends against schema 1.25, and answers crow's own request (a
    permission) over the same socket."""
    from tests.support.ts_client import kinds, run_script

    llm.push(
        Reply(tool_calls=[ToolCallSpec("write_file", {"path": "answer.txt", "content": "42\n"})]),
        Reply(text="written"),
    )
    script = {
        "permission": "allow_once",
        "steps": [
            {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "s"},
            {
                "request": "session/prompt",
                "params": {"sessionId": "${s.sessionId}", "prompt": [{"type": "text", "text": "write it"}]},
                "as": "p",
            },
            {"request": "session/list", "params": {}, "as": "list"},
        ],
    }
    async with ws_crow(env_with_token(llm, home)) as served:
        env = crow_env(None, home, ACP_WS_TOKEN=TOKEN)
        out = await asyncio.to_thread(run_script, script, env, workspace, url=served.url)
    assert out["results"]["p"]["result"]["stopReason"] == "end_turn", out
    assert [r["method"] for r in out["requests"]] == ["session/request_permission"]
    assert (workspace / "answer.txt").read_text() == "42\n"
    assert {"tool_call", "tool_call_update", "agent_message_chunk"} <= set(kinds(out))
    assert [s["sessionId"] for s in out["results"]["list"]["result"]["sessions"]] == [
        out["results"]["s"]["result"]["sessionId"]
    ]
    assert out["agentExit"]["code"] == 1000  # the client closed the socket; crow served on
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
                    ids[f"{name}{n}"] = (
                        await conn.new_session(cwd=str(workspace), mcp_servers=[])
                    ).session_id
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
        while not (value := check()):  # noqa: ASYNC110 (another process)
            await asyncio.sleep(0.05)
    return value


async def session_with_a_turn(conn: Any, workspace: Path) -> str:
    """A new session in which one prompt ("one") has run; its id."""
    await initialize_125(conn)
    sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
    await conn.prompt(session_id=sid, prompt=[acp.text_block("one")])
    return sid


async def talking(conn: Any, client: Any, workspace: Path) -> tuple[str, asyncio.Task[Any]]:
    """A new session with a turn running (the model talking, `SLOW`): its id and the prompt."""
    await initialize_125(conn)
    sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
    turn = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("talk")]))
    await until(lambda: client.text(sid), "the first words")
    return sid, turn


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
            sid = await session_with_a_turn(a, workspace)
            async with ws_client(served.url) as (b, client_b):
                await initialize_125(b)
                for ask in (
                    b.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[]),
                    b.resume_session(cwd=str(workspace), session_id=sid, mcp_servers=[]),
                    b.prompt(session_id=sid, prompt=[acp.text_block("mine now")]),
                    b.set_session_mode(session_id=sid, mode_id="yolo"),
                    b.close_session(session_id=sid),
                    b.ext_method("crow.compact", {"sessionId": sid}),
                    b.ext_method(
                        "session/steering", {"sessionId": sid, "prompt": [{"type": "text", "text": "x"}]}
                    ),
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
            assert (
                await b.prompt(session_id=sid, prompt=[acp.text_block("three")])
            ).stop_reason == "end_turn"


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
            calls = [
                (type(u).__name__, u.status)
                for _, u in client_b.updates
                if getattr(u, "tool_call_id", 0) == "c1"
            ]
            assert calls == [("ToolCallStart", "failed")]  # replayed as it ended: not left running
            llm.push(Reply(text="again"))
            assert (
                await b.prompt(session_id=sid, prompt=[acp.text_block("go on")])
            ).stop_reason == "end_turn"
        sent = llm.requests[-1].messages
        assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "user"]
        assert sent[3]["tool_call_id"] == "c1"
    assert "Traceback" not in served.log()


async def test_a_client_gone_while_the_model_streams_cancels_the_model_call(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(SLOW)
    async with ws_crow(env_with_token(llm, home)) as served:
        async with ws_client(served.url) as (a, client_a):
            sid, turn = await talking(a, client_a, workspace)
        with pytest.raises(ConnectionError):
            await turn
        await until(lambda: llm.requests[0].disconnected, "crow abandoned the model's stream")
        stack, _b, client_b = await load_when_free(served.url, sid, workspace)
        async with stack:
            shown = client_b.text(sid)
            assert shown.startswith("w0") and shown.endswith("[interrupted by the user]"), shown
            assert "w399" not in shown


def run_crow(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CROW, "serve", *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("args", "variables", "says"),
    [
        (["--listen", "ws://127.0.0.1:0"], {}, "--listen needs a token for clients to send"),
        (
            ["--listen", "http://127.0.0.1:0"],
            {"CROW_SERVER_TOKEN": TOKEN},
            "only ws:// and wss:// are served",
        ),
        (
            ["--listen", "wss://127.0.0.1:0"],
            {"CROW_SERVER_TOKEN": TOKEN},
            "wss:// needs --tls-cert FILE and --tls-key FILE",
        ),
        (["--listen", "ws://127.0.0.1"], {"CROW_SERVER_TOKEN": TOKEN}, "give it as ws://HOST:PORT"),
        (["--token-file", "x"], {"CROW_SERVER_TOKEN": TOKEN}, "--token-file goes with --listen"),
        (["--max-connections", "5"], {"CROW_SERVER_TOKEN": TOKEN}, "--max-connections goes with --listen"),
        (
            ["--listen", "ws://127.0.0.1:0", "--max-connections", "0"],
            {"CROW_SERVER_TOKEN": TOKEN},
            "--max-connections must be 1 or more",
        ),
        (  # no client could send it: HTTP headers are read as ISO-8859-1, the token as UTF-8
            ["--listen", "ws://127.0.0.1:0"],
            {"CROW_SERVER_TOKEN": "s\u00e9same"},
            "the token must be printable ASCII",
        ),
    ],
)
def test_listen_refuses_to_start_without_what_it_needs(
    home: Path, args: list[str], variables: dict[str, str], says: str
) -> None:
    done = run_crow(crow_env(None, home, **variables), *args)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_token_file_must_be_private_and_not_empty(home: Path, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    for mode in (0o640, 0o604, 0o620):
        token_file.chmod(mode)
        done = run_crow(crow_env(None, home), "--listen", "ws://127.0.0.1:0", "--token-file", str(token_file))
        assert done.returncode == 2
        assert f"permissions {mode:04o} are too open" in done.stderr and "chmod 600" in done.stderr
    token_file.write_text("\n")
    token_file.chmod(0o600)
    done = run_crow(crow_env(None, home), "--listen", "ws://127.0.0.1:0", "--token-file", str(token_file))
    assert done.returncode == 2 and f"--token-file {token_file} is empty" in done.stderr
    done = run_crow(
        crow_env(None, home), "--listen", "ws://127.0.0.1:0", "--token-file", str(tmp_path / "none")
    )
    assert done.returncode == 2 and "No such file" in done.stderr


async def test_the_token_file_is_the_token_clients_send(home: Path, tmp_path: Path, workspace: Path) -> None:
    from websockets.exceptions import InvalidStatus

    token_file = tmp_path / "token"
    token_file.write_text("from-the-file\n")
    token_file.chmod(0o600)
    env = env_with_token(None, home)  # the file wins over the variable
    async with ws_crow(env, "--token-file", str(token_file)) as served:
        async with ws_client(served.url, "from-the-file") as (conn, _client):
            await initialize_125(conn)
        with pytest.raises(InvalidStatus):
            async with ws_client(served.url, TOKEN):
                pass


@contextlib.asynccontextmanager
async def raw_socket(url: str, **options: Any) -> Any:
    """A bare WebSocket with the token: what a hostile or broken client sends."""
    from websockets.asyncio.client import connect

    async with connect(url, additional_headers={"Authorization": f"Bearer {TOKEN}"}, **options) as socket:
        yield socket


async def raw_handshake(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A WebSocket opened by hand (with the token), to write frames no library would."""
    host, port = url.removeprefix("ws://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"GET / HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
    )
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
    return reader, writer


async def test_an_oversized_frame_closes_that_connection_with_1009_and_nothing_else(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    from crow.acp.ws import MAX_FRAME

    async with ws_crow(env_with_token(llm, home)) as served:
        async with ws_client(served.url) as (a, client_a):
            await initialize_125(a)
            sid = (await a.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            # One frame whose header says MAX_FRAME + 1 bytes: closed on the header, unread.
            reader, writer = await raw_handshake(served.url)
            writer.write(b"\x81\xff" + struct.pack("!Q", MAX_FRAME + 1) + b"mask")
            head = await reader.readexactly(4)
            assert head[0] == 0x88 and struct.unpack("!H", head[2:4])[0] == 1009  # a close frame: 1009
            writer.close()
            # (No frame is inflated: crow declines compression, test_frames_are_not_compressed.)
            async with raw_socket(served.url) as fine:  # at the limit: read
                await fine.send(" " * (MAX_FRAME - 2) + "[]")
                assert json.loads(await fine.recv())["error"]["code"] == -32600
            llm.push(Reply(text="still here"))
            assert (await a.prompt(session_id=sid, prompt=[acp.text_block("hi")])).stop_reason == "end_turn"
            assert client_a.text(sid) == "still here"
    assert "Traceback" not in served.log()


async def test_frames_are_not_compressed(home: Path) -> None:
    """permessage-deflate is declined: it cost ~4% of crow's CPU at 50 busy sessions and a
    zlib state per connection, and under TLS compressing a secret beside text a hostile
    repository controls leaks it by size (CRIME)."""
    async with ws_crow(env_with_token(None, home)) as served:
        async with raw_socket(served.url, compression="deflate") as socket:
            assert socket.response.headers.get("Sec-WebSocket-Extensions") is None
            await socket.send("[]")
            assert json.loads(await socket.recv())["error"]["code"] == -32600


async def test_garbage_frames_get_json_rpc_errors_and_the_connection_serves_on(home: Path) -> None:
    async with ws_crow(env_with_token(None, home)) as served:
        async with raw_socket(served.url) as socket:
            sent = {
                "not json": (-32700, None),
                "[]": (-32600, None),
                "123": (-32600, None),
                '"text"': (-32600, None),
                "null": (-32600, None),
                "": (-32700, None),
                json.dumps({"jsonrpc": "2.0", "id": 7, "method": "m" * 100_000}): (-32601, 7),
                json.dumps({"jsonrpc": "2.0", "id": 8, "method": "no/such"}): (-32601, 8),
                b'{"jsonrpc":"2.0","id":9,"method":"initialize","params":{}}': (-32600, None),  # binary
                "[" * 100_000: (-32700, None),
            }
            for frame in sent:
                await socket.send(frame)
            answers = [json.loads(await socket.recv()) for _ in sent]
            # (in any order: a request's answer comes from its own task)
            assert sorted((a["error"]["code"], a["id"] or 0) for a in answers) == sorted(
                (code, rid or 0) for code, rid in sent.values()
            )
            assert "m" * 300 not in json.dumps(answers)  # a huge method is not echoed back
            await socket.send(
                json.dumps(
                    {"jsonrpc": "2.0", "id": 10, "method": "initialize", "params": {"protocolVersion": 1}}
                )
            )
            assert json.loads(await socket.recv())["result"]["protocolVersion"] == 1
    assert "Traceback" not in served.log()


def peak_rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) / 1024


async def test_a_client_that_never_reads_blocks_its_turn_and_is_dropped(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """The model streams 40 MB while the client reads nothing: crow's writes wait on the
    socket's buffer (the model's stream with them), its memory does not grow by what the
    client did not read, and after two ping periods without a byte taken the connection is
    dropped, the turn cancelled; crow serves on."""
    llm.push(Reply(text="warm"), Reply(text="x" * 40_000_000, chunk_size=4000))
    async with ws_crow(env_with_token(llm, home), "--ping-interval", "1") as served:
        # close_timeout: its close waits behind the megabytes it never read (until crow's
        # drop is seen): given up after 1 s, not the library's 10.
        async with raw_socket(served.url, compression=None, max_queue=1, close_timeout=1) as idle:
            asked = 0

            async def ask(method: str, params: dict[str, Any], wait: bool = True) -> Any:
                nonlocal asked
                asked += 1
                await idle.send(
                    json.dumps({"jsonrpc": "2.0", "id": asked, "method": method, "params": params})
                )
                while wait:
                    message = json.loads(await idle.recv())
                    if message.get("id") == asked:
                        return message["result"]

            await ask("initialize", {"protocolVersion": 1})
            sid = (await ask("session/new", {"cwd": str(workspace), "mcpServers": []}))["sessionId"]
            await ask("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "warm up"}]})
            before = peak_rss_mb(served.proc.pid)
            await ask(
                "session/prompt",
                {"sessionId": sid, "prompt": [{"type": "text", "text": "flood"}]},
                wait=False,
            )
            await until(lambda: llm.requests and llm.requests[-1].disconnected, "the turn cancelled", 60)
            grown = peak_rss_mb(served.proc.pid) - before
            assert grown < 30, f"crow's peak memory grew by {grown:.0f} MB while its client read nothing"
        assert "read nothing for 2 s: its connection is dropped" in served.log()
        # resumed, not loaded: the replay of a message this long is a frame over the SDK
        # client's own limit (1 MiB)
        async with asyncio.timeout(30):
            while True:
                async with ws_client(served.url) as (b, _client_b):
                    await initialize_125(b)
                    try:
                        await b.resume_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
                    except acp.RequestError as exc:
                        assert exc.code == BUSY
                        continue
                    llm.push(Reply(text="ok"))
                    assert (
                        await b.prompt(session_id=sid, prompt=[acp.text_block("go on")])
                    ).stop_reason == "end_turn"
                    break
        taken = llm.requests[-1].messages[-2]["content"]
        assert taken.startswith("x" * 4000) and taken.endswith("[interrupted by the user]")
        assert len(taken) < 20_000_000  # what crow had taken from the model when it stopped


async def test_the_clients_files_are_read_and_written_through_the_socket(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """A client advertising fs.readTextFile/writeTextFile: crow's read_file and write_file go
    through it (its unsaved buffer wins over the disk), over the WebSocket as over stdio."""
    (workspace / "a.txt").write_text("on disk\n")
    llm.push(
        Reply(tool_calls=[ToolCallSpec("read_file", {"path": "a.txt"}, id="r1")]),
        Reply(tool_calls=[ToolCallSpec("write_file", {"path": "b.txt", "content": "written\n"}, id="w1")]),
        Reply(text="done"),
    )
    caps = {**FEATURES_125, "fs": {"readTextFile": True, "writeTextFile": True}}
    async with ws_crow(env_with_token(llm, home)) as served:
        async with ws_client(served.url) as (conn, client):
            client.files[str(workspace / "a.txt")] = "in the editor\n"
            await initialize_125(conn, caps)
            sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            await conn.set_session_mode(session_id=sid, mode_id="yolo")
            assert (
                await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
            ).stop_reason == "end_turn"
            assert client.wire is not None
            asked = [
                m["method"] for d, m in client.wire.messages if d == "in" and "method" in m and "id" in m
            ]
            assert "fs/read_text_file" in asked and "fs/write_text_file" in asked
    assert "in the editor" in llm.requests[1].messages[-1]["content"]
    assert client.files[str(workspace / "b.txt")] == "written\n"
    assert not (workspace / "b.txt").exists()  # the editor wrote it (into its buffer)


async def test_the_server_token_never_reaches_the_models_commands(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Reply(tool_calls=[ToolCallSpec("execute", {"command": "env"}, id="e1")]), Reply(text="done"))
    async with ws_crow(env_with_token(llm, home, CROW_SANDBOX="off", MARKER_FOR_TEST="visible")) as served:
        async with ws_client(served.url) as (conn, _client):
            await initialize_125(conn)
            sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            await conn.set_session_mode(session_id=sid, mode_id="yolo")
            await conn.prompt(session_id=sid, prompt=[acp.text_block("show env")])
    shown = llm.requests[1].messages[-1]["content"]
    assert "MARKER_FOR_TEST=visible" in shown  # the environment is there: only the token is not
    assert TOKEN not in shown and "CROW_SERVER_TOKEN" not in shown


async def test_wss_with_a_certificate_the_client_verifies(
    llm: ScriptedLLM, home: Path, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ssl

    import trustme

    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1")
    cert, key, authority = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(authority))
    llm.push(Reply(text="private"))
    args = ("--tls-cert", str(cert), "--tls-key", str(key))
    async with ws_crow(env_with_token(llm, home), *args, listen="wss://127.0.0.1:0") as served:
        assert served.url.startswith("wss://127.0.0.1:")
        with pytest.raises(ssl.SSLCertVerificationError):  # a client that does not trust the CA
            async with ws_client(served.url):
                pass
        monkeypatch.setenv("SSL_CERT_FILE", str(authority))  # what the client's default context trusts
        async with ws_client(served.url) as (conn, client):
            await initialize_125(conn)
            sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            assert (
                await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
            ).stop_reason == "end_turn"
            assert client.text(sid) == "private"
    assert "Traceback" not in served.log()


def test_wss_with_a_certificate_that_cannot_be_used_exits_2(home: Path, tmp_path: Path) -> None:
    (tmp_path / "cert.pem").write_text("not a certificate")
    args = (
        "--listen",
        "wss://127.0.0.1:0",
        "--tls-cert",
        str(tmp_path / "cert.pem"),
        "--tls-key",
        str(tmp_path / "cert.pem"),
    )
    done = run_crow(crow_env(None, home, CROW_SERVER_TOKEN=TOKEN), *args)
    assert done.returncode == 2 and "--tls-cert/--tls-key: cannot use" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_ends_the_server_with_its_turns_cancelled(
    llm: ScriptedLLM, home: Path, workspace: Path, signum: int
) -> None:
    llm.push(SLOW)
    async with ws_crow(env_with_token(llm, home)) as served:
        async with ws_client(served.url) as (conn, client):
            sid, turn = await talking(conn, client, workspace)
            served.proc.send_signal(signum)
            assert await asyncio.wait_for(served.proc.wait(), 60) == 0, served.log()
            with pytest.raises(ConnectionError):
                await turn
    assert "Traceback" not in served.log()
    assert llm.requests[0].disconnected  # the model's stream was abandoned, not read to its end
    async with ws_crow(env_with_token(llm, home)) as served:  # the history was settled first
        async with ws_client(served.url) as (conn, client):
            await initialize_125(conn)
            await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
            assert client.text(sid).endswith("[interrupted by the user]")


async def test_the_example_client_runs_a_prompt_and_continues_the_session(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    script = Path(__file__).resolve().parent.parent / "examples" / "ws_client.py"

    async def run(*args: str, token: str = TOKEN) -> tuple[int, str, str]:
        env = {**crow_env(None, home), "CROW_SERVER_TOKEN": token}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(script), served.url, *args, "--cwd", str(workspace), env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode or 0, out.decode(), err.decode()

    llm.push(Reply(text="four", chunk_size=1), Reply(text="eight"))
    async with ws_crow(env_with_token(llm, home)) as served:
        code, out, err = await run("what is 2+2?")
        assert (code, out) == (0, "four\n"), err
        sid = err.split("session ", 1)[1].split()[0]
        code, out, err = await run("and doubled?", "--session", sid)
        assert (code, out) == (0, "eight\n"), err
        users = [m["content"] for m in llm.requests[-1].messages if m["role"] == "user"]
        assert users == ["what is 2+2?", "and doubled?"]
        code, _out, err = await run("hi", token="wrong")
        assert code == 1 and "refused the connection" in err and "401" in err


async def test_two_connections_loading_one_session_at_once_one_gets_it(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Reply(text="stored"))
    async with ws_crow(env_with_token(llm, home)) as served:
        async with ws_client(served.url) as (a, _client):
            sid = await session_with_a_turn(a, workspace)
        stack, _conn, _client = await load_when_free(served.url, sid, workspace)  # A has ended
        await stack.aclose()
        async with ws_client(served.url) as (b, client_b), ws_client(served.url) as (c, client_c):
            await initialize_125(b)
            await initialize_125(c)
            loads = [conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[]) for conn in (b, c)]
            results = await asyncio.gather(*loads, return_exceptions=True)
            refused = [r for r in results if isinstance(r, acp.RequestError)]
            assert len(refused) == 1 and refused[0].code == BUSY, results
            winner = client_b if results[0] is not refused[0] else client_c
            loser = client_c if winner is client_b else client_b
            assert winner.text(sid) == "stored" and loser.updates == []
