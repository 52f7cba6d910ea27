"""A hostile or broken WebSocket client, frame by frame (a bare socket with the token):
what it sends must hurt nothing but, at most, its own connection."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.llm_server import Reply, ScriptedLLM, Stall, ToolCallSpec
from tests.support.ws import TOKEN, ws_crow
from tests.test_ws_e2e import env_with_token, raw_socket, until

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


async def test_a_client_gone_during_the_replay_of_a_long_history_leaves_no_trace(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """The client hangs up after the first update of a `session/load` replaying megabytes:
    the load ends quietly (no traceback), the session is free for the next connection."""
    llm.default = lambda r: Reply(text=f"{r.last_user_text} " + "x" * 100_000)
    async with ws_crow(env_with_token(llm, home)) as served:
        async with raw_socket(served.url) as socket:
            peer = Peer(socket)
            sid = await peer.session(workspace)
            for n in range(60):
                turn = await peer.ask(
                    "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": f"t{n}"}]}
                )
                await peer.answer(turn)
        # close_timeout: its close waits behind the replay it does not read: the hang-up
        # comes after 1 s, not the library's 10.
        async with raw_socket(served.url, max_size=None, close_timeout=1) as socket:
            peer = Peer(socket)
            await peer.answer(await peer.ask("initialize", {"protocolVersion": 1}))
            await peer.ask("session/load", {"sessionId": sid, "cwd": str(workspace), "mcpServers": []})
            await peer.until(lambda m: m.get("method") == "session/update")
        async with raw_socket(served.url, max_size=None) as socket:
            peer = Peer(socket)
            await peer.answer(await peer.ask("initialize", {"protocolVersion": 1}))
            while True:  # busy while the first connection is being closed
                rid = await peer.ask(
                    "session/load", {"sessionId": sid, "cwd": str(workspace), "mcpServers": []}
                )
                if "result" in (answer := await peer.answer(rid)):
                    break
                assert answer["error"]["code"] == -32001, answer
    assert "Traceback" not in served.log(), served.log()


async def load_when_free(url: str, sid: str, workspace: Path) -> list[dict[str, Any]]:
    """`session/load` in a new connection, again while busy (the connection that had the
    session is still closing it): the updates it replayed."""
    async with raw_socket(url, max_size=None) as socket:
        peer = Peer(socket)
        await peer.answer(await peer.ask("initialize", {"protocolVersion": 1}))
        while True:
            rid = await peer.ask("session/load", {"sessionId": sid, "cwd": str(workspace), "mcpServers": []})
            replayed = []
            while "id" not in (message := await peer.until(lambda m: True)) or message["id"] != rid:
                replayed.append(message)
            if "result" in message:
                return [m["params"]["update"] for m in replayed if m.get("method") == "session/update"]
            assert message["error"]["code"] == -32001, message


@pytest.mark.parametrize(
    "gone_at",
    [
        "session/request_permission",
        "elicitation/create",
        "fs/read_text_file",
        "terminal/create",
        "session/prompt",
    ],
)
async def test_a_client_gone_while_crow_waits_on_it_ends_its_turn(
    llm: ScriptedLLM, home: Path, workspace: Path, gone_at: str
) -> None:
    """The client vanishes while crow asks it something (a permission, a file of its
    editor) or right after its prompt: the turn ends (nothing waits for an answer that will
    not come), its session is free, its history valid, and crow serves on."""
    (workspace / "a.txt").write_text("on disk\n")
    calls = {
        "session/request_permission": ToolCallSpec("execute", {"command": "echo hi"}, id="c1"),
        "elicitation/create": ToolCallSpec("ask_user", {"question": "Which?"}, id="c1"),
        "terminal/create": ToolCallSpec("execute", {"command": "echo hi"}, id="c1"),
        "fs/read_text_file": ToolCallSpec("read_file", {"path": "a.txt"}, id="c1"),
        "session/prompt": ToolCallSpec("execute", {"command": "echo hi"}, id="c1"),
    }
    reply = Reply(tool_calls=[calls[gone_at]])
    llm.push(Stall(seconds=1.0, then=reply) if gone_at == "session/prompt" else reply)
    caps = {
        "fs": {"readTextFile": True, "writeTextFile": True},
        "elicitation": {"form": {}},
        "terminal": True,
    }
    async with ws_crow(env_with_token(llm, home, CROW_SANDBOX="off")) as served:
        async with raw_socket(served.url) as socket:
            peer = Peer(socket)
            await peer.answer(
                await peer.ask("initialize", {"protocolVersion": 1, "clientCapabilities": caps})
            )
            new = await peer.answer(await peer.ask("session/new", {"cwd": str(workspace), "mcpServers": []}))
            sid = new["result"]["sessionId"]
            if gone_at == "terminal/create":  # no permission asked first
                await peer.answer(await peer.ask("session/set_mode", {"sessionId": sid, "modeId": "yolo"}))
            await peer.ask("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]})
            if gone_at != "session/prompt":
                await peer.until(lambda m: m.get("method") == gone_at)
            else:
                await until(lambda: llm.requests, "the model asked")
        replayed = await load_when_free(served.url, sid, workspace)
        assert [u["content"]["text"] for u in replayed if u["sessionUpdate"] == "user_message_chunk"] == [
            "go"
        ]
        assert not [u for u in replayed if u.get("status") in ("pending", "in_progress")]
    assert "Traceback" not in served.log(), served.log()


async def test_a_subagents_session_is_busy_for_another_connection_while_it_runs(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """Connection A's turn runs a subagent: its child session is A's while it runs. Before,
    connection B could load it and prompt it: two writers on one transcript at once."""
    started, go = workspace / "started", workspace / "go"
    waits = f"touch {started}; while [ ! -f {go} ]; do sleep 0.05; done"
    llm.rule(
        lambda r: "the child" in r.last_user_text,
        lambda r: (
            Reply(text="child done")
            if any(m["role"] == "tool" for m in r.messages)
            else Reply(tool_calls=[ToolCallSpec("execute", {"command": waits}, id="x1")])
        ),
    )
    llm.push(
        Reply(tool_calls=[ToolCallSpec("task", {"description": "d", "prompt": "the child"}, id="t1")]),
        Reply(text="parent done"),
    )
    async with ws_crow(env_with_token(llm, home, CROW_SANDBOX="off")) as served:
        async with raw_socket(served.url) as socket_a, raw_socket(served.url) as socket_b:
            a, b = Peer(socket_a), Peer(socket_b)
            parent = await a.session(workspace)
            await a.answer(await a.ask("session/set_mode", {"sessionId": parent, "modeId": "yolo"}))
            turn = await a.ask(
                "session/prompt", {"sessionId": parent, "prompt": [{"type": "text", "text": "go"}]}
            )
            linked = await a.until(lambda m: "subagentSessionId" in json.dumps(m))
            child = json.dumps(linked).split('"subagentSessionId": "')[1].split('"')[0]
            await until(started.exists, "the child's command runs")
            await b.answer(await b.ask("initialize", {"protocolVersion": 1}))
            for method, params in (
                ("session/load", {"sessionId": child, "cwd": str(workspace), "mcpServers": []}),
                ("session/resume", {"sessionId": child, "cwd": str(workspace), "mcpServers": []}),
                ("session/delete", {"sessionId": child}),
            ):
                answer = await b.answer(await b.ask(method, params))
                assert answer.get("error", {}).get("code") == -32001, (method, answer)
            go.touch()
            assert (await a.answer(turn))["result"]["stopReason"] == "end_turn"
            # the child's turn is over: free for B
            loaded = await b.answer(
                await b.ask("session/load", {"sessionId": child, "cwd": str(workspace), "mcpServers": []})
            )
            assert "result" in loaded, loaded
    assert "Traceback" not in served.log(), served.log()


async def test_a_client_that_stops_reading_slows_only_its_own_turn(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """A's client reads nothing while its model streams 40 MB: A's turn waits on A's socket;
    B's sessions and turns go on meanwhile (nothing B needs waits behind A's buffer)."""
    llm.push(Reply(text="x" * 40_000_000, chunk_size=4000))
    llm.default = lambda r: Reply(text=f"B says {r.last_user_text}")
    async with ws_crow(env_with_token(llm, home)) as served:
        # close_timeout: A's close waits behind the megabytes it never read: given up after
        # 1 s, not the library's 10.
        async with raw_socket(served.url, compression=None, max_queue=1, close_timeout=1) as socket_a:
            a = Peer(socket_a)
            sid_a = await a.session(workspace)
            await a.ask("session/prompt", {"sessionId": sid_a, "prompt": [{"type": "text", "text": "flood"}]})
            await until(lambda: llm.requests, "A's model streams")
            async with raw_socket(served.url) as socket_b:
                b = Peer(socket_b)
                for n in range(3):
                    sid_b = await b.session(workspace)
                    turn = await b.ask(
                        "session/prompt", {"sessionId": sid_b, "prompt": [{"type": "text", "text": f"t{n}"}]}
                    )
                    assert (await b.answer(turn))["result"]["stopReason"] == "end_turn"
                    listed = await b.answer(await b.ask("session/list", {}))
                    assert sid_b in json.dumps(listed)
            assert not llm.requests[0].disconnected  # A's turn still waits on A: not dropped yet
    assert "Traceback" not in served.log(), served.log()


async def test_over_stdio_too_a_malformed_answer_does_not_end_crow(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """The same answer over stdio (`Wire` is shared): before, crow's receive loop died on it
    and crow exited mid-turn."""
    import asyncio

    from tests.conftest import CROW, crow_env

    llm.push(
        Reply(tool_calls=[ToolCallSpec("execute", {"command": "echo hi"}, id="c1")]),
        Reply(text="done"),
    )
    proc = await asyncio.create_subprocess_exec(
        *CROW, env=crow_env(llm, home, CROW_SANDBOX="off"),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    class Lines:
        async def send(self, text: str) -> None:
            stdin.write(text.encode() + b"\n")
            await stdin.drain()

        async def recv(self) -> str:
            line = await stdout.readline()
            assert line, "crow ended"
            return line.decode()

    try:
        async with asyncio.timeout(60):
            peer = Peer(Lines())
            sid = await peer.session(workspace)
            turn = await peer.ask(
                "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]}
            )
            asked = await peer.until(lambda m: m.get("method") == "session/request_permission")
            await peer.send({"id": [asked["id"]], "result": {}})
            await peer.send({"id": asked["id"], "result": {"outcome": {"outcome": "cancelled"}}})
            assert "result" in await peer.answer(turn)
    finally:
        stdin.close()
        assert await asyncio.wait_for(proc.wait(), 60) == 0


def masked_text(payload: bytes) -> bytes:
    """A client's text frame (mask 0: the payload as it is)."""
    size = len(payload)
    head = bytes([0x81, 0x80 | size]) if size < 126 else bytes([0x81, 0xFE]) + size.to_bytes(2, "big")
    return head + b"\0\0\0\0" + payload


async def read_frame(reader: Any) -> tuple[int, bytes]:
    first, second = await reader.readexactly(2)
    size = second & 0x7F
    if size == 126:
        size = int.from_bytes(await reader.readexactly(2), "big")
    elif size == 127:
        size = int.from_bytes(await reader.readexactly(8), "big")
    return first & 0x0F, await reader.readexactly(size)


async def test_a_client_sending_requests_without_reading_answers_is_held_back(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """30,000 requests sent at once by a client that reads nothing: crow stops reading them
    once 1,000 await their answers (the rest answered busy when their turn comes), so its
    memory stays flat. Before, each request read became a task holding its answer until
    the client read: 30,000 of them, ~175 MB."""
    import asyncio

    from crow.acp.wire import MAX_UNANSWERED
    from tests.test_ws_e2e import peak_rss_mb, raw_handshake

    count = 30_000
    async with ws_crow(env_with_token(llm, home)) as served:
        reader, writer = await raw_handshake(served.url)
        before = peak_rss_mb(served.proc.pid)
        params = {"protocolVersion": 1}
        frames = [
            masked_text(
                json.dumps({"jsonrpc": "2.0", "id": n, "method": "initialize", "params": params}).encode()
            )
            for n in range(count)
        ]
        writer.write(b"".join(frames))
        with contextlib.suppress(TimeoutError):  # crow read them all (before), or stopped reading
            await asyncio.wait_for(writer.drain(), 10)
        grown = peak_rss_mb(served.proc.pid) - before
        answers: dict[int, dict[str, Any]] = {}
        async with asyncio.timeout(120):
            while len(answers) < count:
                opcode, data = await read_frame(reader)
                if opcode == 1:
                    answer = json.loads(data)
                    answers[answer["id"]] = answer
        writer.close()
        refused = [a for a in answers.values() if "error" in a]
        assert refused and all(a["error"]["code"] == -32001 for a in refused)
        assert f"busy: {MAX_UNANSWERED} requests await their answers" in refused[0]["error"]["message"]
        assert grown < 60, f"crow's peak memory grew by {grown:.0f} MB"
    assert "Traceback" not in served.log(), served.log()


async def test_notifications_crow_cannot_take_are_one_line_each_in_its_log(home: Path) -> None:
    """Malformed notifications (no answer is due) are logged in one line each: before, each
    was a 30-line traceback at ERROR, a log any client could flood."""
    async with ws_crow(env_with_token(None, home)) as served:
        async with raw_socket(served.url) as socket:
            peer = Peer(socket)
            for params in ([], {"sessionId": {"x": 1}}, "text"):
                await peer.send({"method": "session/cancel", "params": params})
            await peer.send({"method": "no/such", "params": {}})
            await peer.send({"method": "$/cancel_request", "params": {"requestId": [1]}})
            assert "result" in await peer.answer(await peer.ask("initialize", {"protocolVersion": 1}))
    assert "Traceback" not in served.log(), served.log()
    assert served.log().count("ignored the notification") == 5, served.log()
