"""`crow serve --listen` pieces without a server: the address, the token, the ownership of
sessions between connections, and the WebSocket wire on a real local socket."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from acp import RequestError

from crow.acp.owners import Owners
from crow.acp.ws import Listen, WsWire, listen_address, server_token
from crow.errors import ConfigError


@pytest.mark.parametrize(
    ("url", "tls", "expected"),
    [
        ("ws://127.0.0.1:0", (None, None), Listen("ws", "127.0.0.1", 0)),
        ("ws://localhost:8765/", (None, None), Listen("ws", "localhost", 8765)),
        ("ws://[::1]:9000", (None, None), Listen("ws", "::1", 9000)),
        ("wss://0.0.0.0:443", ("c.pem", "k.pem"), Listen("wss", "0.0.0.0", 443, "c.pem", "k.pem")),
    ],
)
def test_a_listen_address(url: str, tls: tuple[str | None, str | None], expected: Listen) -> None:
    assert listen_address(url, *tls) == expected


@pytest.mark.parametrize(
    ("url", "tls", "says"),
    [
        ("http://127.0.0.1:80", (None, None), "only ws:// and wss:// are served"),
        ("127.0.0.1:80", (None, None), "only ws:// and wss:// are served"),
        ("ws://127.0.0.1", (None, None), "give it as ws://HOST:PORT"),
        ("ws://:80", (None, None), "give it as ws://HOST:PORT"),
        ("ws://127.0.0.1:80/acp", (None, None), "give it as ws://HOST:PORT"),
        ("ws://127.0.0.1:99999", (None, None), "out of range"),
        ("wss://127.0.0.1:443", ("c.pem", None), "wss:// needs --tls-cert FILE and --tls-key FILE"),
        ("ws://127.0.0.1:80", ("c.pem", "k.pem"), "--tls-cert and --tls-key go with --listen wss://"),
    ],
)
def test_a_listen_address_refused(url: str, tls: tuple[str | None, str | None], says: str) -> None:
    with pytest.raises(ConfigError, match=says.replace("/", ".").replace("+", ".")):
        listen_address(url, *tls)


def test_the_url_printed_names_the_port_taken() -> None:
    assert Listen("ws", "::1", 0).url(4242) == "ws://[::1]:4242"
    assert Listen("wss", "example.org", 0).url(443) == "wss://example.org:443"


def test_the_token_comes_from_the_environment_and_leaves_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CROW_SERVER_TOKEN", " secret \n")
    assert server_token(None) == "secret"
    import os

    assert "CROW_SERVER_TOKEN" not in os.environ  # nothing crow starts inherits it
    with pytest.raises(ConfigError, match="set CROW_SERVER_TOKEN or give --token-file PATH"):
        server_token(None)
    monkeypatch.setenv("CROW_SERVER_TOKEN", "   ")
    with pytest.raises(ConfigError, match="needs a token"):
        server_token(None)


def test_a_token_file(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("tok\n")
    path.chmod(0o600)
    assert server_token(str(path)) == "tok"
    path.chmod(0o400)
    assert server_token(str(path)) == "tok"
    for mode in (0o640, 0o644, 0o604, 0o660, 0o610):
        path.chmod(mode)
        with pytest.raises(ConfigError, match=f"permissions {mode:04o} are too open"):
            server_token(str(path))


def test_one_connection_serves_a_session_at_a_time() -> None:
    owners, a, b = Owners(), object(), object()
    owners.claim("s1", a)
    owners.claim("s1", a)  # again: still a's
    with pytest.raises(RequestError) as busy:
        owners.claim("s1", b)
    assert busy.value.code == -32001 and "open in another connection" in str(busy.value)
    owners.release("s1", b)  # not b's to release
    with pytest.raises(RequestError):
        owners.check("s1", b)
    with owners.claimed("s2", b, live=lambda sid: False):  # a load that failed: released
        pass
    with owners.claimed("s3", b, live=lambda sid: True):
        pass
    assert owners.held_by(a) == ["s1"] and owners.held_by(b) == ["s3"]
    owners.release("s1", a)
    owners.claim("s1", b)
    assert owners.held_by(b) == ["s3", "s1"]


@pytest.mark.anyio
async def test_the_ws_wire_sends_a_frame_per_notification_and_checks_what_comes_in() -> None:
    from websockets.asyncio.client import connect
    from websockets.asyncio.server import serve

    received: list[Any] = []
    done = asyncio.Event()

    async def handler(socket: Any) -> None:
        wire = WsWire(socket)
        await wire.notify("session/update", [b'{"a":1}', b'{"b":2}'])
        received.append(await wire.receive())  # the garbage before it answered, skipped
        received.append(await wire.receive())  # the client's close: the end of input
        with pytest.raises(ConnectionError):
            await wire.notify("session/update", [b"{}"])  # at once, once it has gone
        done.set()

    async with serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}") as client:
            frames = [json.loads(await client.recv()) for _ in range(2)]
            assert [f["params"] for f in frames] == [{"a": 1}, {"b": 2}]
            assert {f["method"] for f in frames} == {"session/update"}
            await client.send("[1]")
            await client.send(b"{}")
            await client.send('{"jsonrpc":"2.0","id":3,"method":"initialize","params":{}}')
            errors = [json.loads(await client.recv())["error"] for _ in range(2)]
            assert [e["code"] for e in errors] == [-32600, -32600]
            assert "text frame" in errors[1]["message"]
        await asyncio.wait_for(done.wait(), 10)
    assert received[0]["id"] == 3 and received[1] is None
