"""crow's stdio wire: what a handler asks to follow its answer is written after it, in order,
however long the handler takes; and on a real crow, `available_commands_update` follows the
`session/new` answer that names its session."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import acp
import pytest
from acp.schema import InitializeResponse, NewSessionResponse

from crow.acp.wire import StdioWire, wire_on
from tests.conftest import CROW, crow_env
from tests.llm_server import ScriptedLLM

pytestmark = pytest.mark.anyio


class SlowAgent:
    """Registers a follow-up, then yields to the loop for a while before answering: the
    follow-up must still come after the answer, never before it."""

    def __init__(self, wire: StdioWire) -> None:
        self.wire = wire
        self.sessions = 0

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(protocol_version=protocol_version)

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        self.sessions += 1
        sid = f"s{self.sessions}"

        async def follow_up() -> None:
            params = json.dumps({"sessionId": sid, "update": {"sessionUpdate": "x"}}).encode()
            await self.wire.notify("session/update", [params])

        self.wire.after_response(follow_up)
        if cwd == "/fail":
            raise acp.RequestError.invalid_params({"cwd": "refused"})
        if cwd == "/broken-follow-up":
            self.wire.after_response(self._boom)
        await asyncio.sleep(0.05)  # e.g. store and tool set-up: many trips through the loop
        return NewSessionResponse(session_id=sid)

    async def _boom(self) -> None:
        raise RuntimeError("a follow-up that fails")


@contextlib.asynccontextmanager
async def wired() -> AsyncIterator[tuple[Any, asyncio.StreamReader]]:
    """The wire over two OS pipes, an SDK agent connection on it; yields a writer for
    requests and a reader of every frame crow's side writes."""
    loop = asyncio.get_running_loop()
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(in_r, "rb"))
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(out_w, "wb")
    )
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    wire, supervisor = wire_on(reader, writer)
    # run_agent: the SDK's own AgentSideConnection on our wire, closed when input ends
    listening = asyncio.ensure_future(acp.run_agent(SlowAgent(wire), wire, use_unstable_protocol=True))
    frames = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(frames), os.fdopen(out_r, "rb"))
    requests = os.fdopen(in_w, "wb", buffering=0)
    try:
        yield requests, frames
    finally:
        requests.close()
        await asyncio.wait_for(listening, 5)
        await supervisor.shutdown()


def request(rid: int, method: str, params: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode() + b"\n"


async def read_frames(frames: asyncio.StreamReader, n: int, timeout: float = 5) -> list[dict[str, Any]]:
    return [json.loads(await asyncio.wait_for(frames.readline(), timeout)) for _ in range(n)]


def shape(frame: dict[str, Any]) -> str:
    if "method" in frame:
        return f"{frame['method']} {frame['params']['sessionId']}"
    return f"answer {frame['id']}" + (" (error)" if "error" in frame else "")


async def test_a_follow_up_is_written_after_the_answer_however_slow_the_handler() -> None:
    async with wired() as (requests, frames):
        requests.write(request(1, "initialize", {"protocolVersion": 1}))
        assert [shape(f) for f in await read_frames(frames, 1)] == ["answer 1"]
        # two at once: each follow-up after its own answer
        requests.write(request(2, "session/new", {"cwd": "/a", "mcpServers": []}))
        requests.write(request(3, "session/new", {"cwd": "/b", "mcpServers": []}))
        got = [shape(f) for f in await read_frames(frames, 4)]
        assert got.index("answer 2") < got.index("session/update s1")
        assert got.index("answer 3") < got.index("session/update s2")


async def test_a_refused_request_drops_its_follow_up_and_a_failing_one_harms_nothing() -> None:
    async with wired() as (requests, frames):
        requests.write(request(1, "session/new", {"cwd": "/fail", "mcpServers": []}))
        assert [shape(f) for f in await read_frames(frames, 1)] == ["answer 1 (error)"]
        requests.write(request(2, "session/new", {"cwd": "/broken-follow-up", "mcpServers": []}))
        requests.write(request(3, "session/new", {"cwd": "/c", "mcpServers": []}))
        got = sorted(shape(f) for f in await read_frames(frames, 4))
        assert got == ["answer 2", "answer 3", "session/update s2", "session/update s3"]


def test_after_response_outside_a_request_handler_is_refused() -> None:
    wire = StdioWire.__new__(StdioWire)
    with pytest.raises(RuntimeError, match="request handlers"):
        wire.after_response(lambda: asyncio.sleep(0))


async def test_crow_advertises_its_commands_after_naming_the_session(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """The real crow on raw stdio: session/new's answer, then its available commands."""
    with open(home / "stderr.log", "wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *CROW,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            env=crow_env(llm, home),
        )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(request(1, "initialize", {"protocolVersion": 1}))
        proc.stdin.write(request(2, "session/new", {"cwd": str(workspace), "mcpServers": []}))
        got: list[dict[str, Any]] = []
        while not any(f.get("method") == "session/update" for f in got):
            got += await read_frames(proc.stdout, 1)
        update = got[-1]["params"]
        assert [shape(f) for f in got] == ["answer 1", "answer 2", f"session/update {update['sessionId']}"]
        assert update["sessionId"] == got[1]["result"]["sessionId"]
        assert update["update"]["sessionUpdate"] == "available_commands_update"
        assert [c["name"] for c in update["update"]["availableCommands"]] == ["compact", "undo", "usage", "mcp", "init"]
    finally:
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), 30)
