"""crow serving ACP over WebSocket, for the tests: `crow serve --listen ws://127.0.0.1:0`
spawned with a token, its URL read from its stderr line, and ACP SDK clients connected to
it (`acp.ws.create_websocket_stream`), each connection's messages checked against the ACP
schema like a stdio connection's."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import acp

from tests.conftest import CROW, RecordingClient, assert_conforms
from tests.support.acp_schema import WireLog

TOKEN = "test-token-0123456789"
LISTENING = re.compile(rb"crow: listening on (wss?://\S+)")


@dataclass
class Served:
    url: str
    proc: asyncio.subprocess.Process
    stderr: bytearray = field(default_factory=bytearray)

    def log(self) -> str:
        return self.stderr.decode(errors="replace")


async def _drain(stream: asyncio.StreamReader, into: bytearray) -> None:
    while chunk := await stream.read(65536):  # crow must never block on a full stderr pipe
        into += chunk


@contextlib.asynccontextmanager
async def ws_crow(env: dict[str, str], *args: str, listen: str = "ws://127.0.0.1:0") -> AsyncIterator[Served]:
    """`crow serve --listen URL ARGS` until the block ends; then SIGTERM, and its exit
    status must be 0 (unless the test ended it itself)."""
    proc = await asyncio.create_subprocess_exec(
        *CROW, "serve", "--listen", listen, *args, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    served = Served("", proc)
    try:
        while (found := LISTENING.search(served.stderr)) is None:
            line = await asyncio.wait_for(proc.stderr.readline(), 60)
            if not line:
                raise AssertionError(f"crow ended without listening:\n{served.log()}")
            served.stderr += line
        served.url = found.group(1).decode()
        drain = asyncio.create_task(_drain(proc.stderr, served.stderr))
        try:
            yield served
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                assert await asyncio.wait_for(proc.wait(), 60) == 0, served.log()
            await drain
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@contextlib.asynccontextmanager
async def ws_client(
    url: str, token: str | None = TOKEN, client: RecordingClient | None = None
) -> AsyncIterator[tuple[Any, RecordingClient]]:
    """An ACP client connection over WebSocket (unstable methods routed), every message crow
    wrote on it checked against the ACP schema at the end."""
    from acp.ws import create_websocket_stream

    client = client or RecordingClient()
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    transport = await create_websocket_stream(url, headers=headers)
    conn = acp.connect_to_agent(client, transport, use_unstable_protocol=True)
    wire = WireLog()
    conn._conn.add_observer(wire)
    client.wire = wire
    try:
        yield conn, client
    finally:
        await conn.close()
    assert_conforms(wire)
