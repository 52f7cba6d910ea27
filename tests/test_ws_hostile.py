"""A hostile or broken WebSocket client, frame by frame (a bare socket with the token):
what it sends must hurt nothing but, at most, its own connection."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec
from tests.support.ws import TOKEN, ws_crow
from tests.test_ws_e2e import env_with_token, raw_socket

pytestmark = pytest.mark.anyio


class Peer:
    """A client written by hand: requests by id, crow's messages read one frame at a time."""

    def __init__(self, socket: Any) -> None:
        self.socket = socket
        self.next_id = 0

    async def send(self, message: dict[str, Any]) -> None:
        await self.socket.send(json.dumps({"jsonrpc": "2.0", **message}))

    async def ask(self, method: str, params: dict[str, Any]) -> int:
        self.next_id += 1
        await self.send({"id": self.next_id, "method": method, "params": params})
        return self.next_id

    async def until(self, check: Any) -> dict[str, Any]:
        """The first message from crow that `check` accepts (the others are skipped)."""
        while True:
            message = json.loads(await self.socket.recv())
            if check(message):
                return message

    async def answer(self, rid: int) -> dict[str, Any]:
        return await self.until(lambda m: m.get("id") == rid and "method" not in m)

    async def session(self, workspace: Path) -> str:
        await self.answer(await self.ask("initialize", {"protocolVersion": 1}))
        new = await self.answer(await self.ask("session/new", {"cwd": str(workspace), "mcpServers": []}))
        return str(new["result"]["sessionId"])


@pytest.mark.parametrize(
    "bad_answer",
    [
        {"id": [0], "result": {"outcome": {"outcome": "cancelled"}}},  # an id no request has
        {"id": {"n": 0}, "result": None},
        {"error": "refused"},  # the right id, an error that is not an object
    ],
)
async def test_a_malformed_answer_to_crows_question_costs_the_question_only(
    llm: ScriptedLLM, home: Path, workspace: Path, bad_answer: dict[str, Any]
) -> None:
    """While crow waits on a permission request, an answer it cannot read is dropped (the
    SDK's receive loop would die on it, ending the connection, or over stdio crow); the
    real answer that follows settles the question."""
    llm.push(
        Reply(tool_calls=[ToolCallSpec("execute", {"command": "echo hi"}, id="c1")]),
        Reply(text="done"),
    )
    async with ws_crow(env_with_token(llm, home, CROW_SANDBOX="off")) as served:
        async with raw_socket(served.url) as socket:
            peer = Peer(socket)
            sid = await peer.session(workspace)
            turn = await peer.ask(
                "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]}
            )
            asked = await peer.until(lambda m: m.get("method") == "session/request_permission")
            await peer.send({"id": asked["id"], **bad_answer})
            await peer.send({"id": asked["id"], "result": {"outcome": {"outcome": "cancelled"}}})
            assert (await peer.answer(turn))["result"]["stopReason"] in ("end_turn", "cancelled")
    assert "Traceback" not in served.log()
    assert TOKEN not in served.log()
