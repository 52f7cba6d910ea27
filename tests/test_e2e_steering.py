"""End to end: steering a running turn over `_session/steering` (crow.acp.steering).

The model's first call is held by the scripted server (a rule that blocks until released),
so a steering request reaches crow while the turn runs, deterministically: the test sends
the steering, then a `session/prompt`; crow answers that one busy, and as it handles
requests in the order they came (each in a task started in order; the steering is queued
before its handler first waits), the steering is queued by then. Only then is the model
released.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import acp
import anyio
import pytest
from acp import RequestError

from tests.conftest import crow_env, raw_request, spawn_crow
from tests.llm_server import RecordedRequest, Reply, ScriptedLLM, ToolCallSpec
from tests.support.images import png
from tests.support.ts_client import run_script

pytestmark = pytest.mark.anyio

PNG64 = base64.b64encode(png(3, 2)).decode()


class Gate:
    """Holds the model's first request until `open()` (the scripted server's thread waits)."""

    def __init__(self, llm: ScriptedLLM, reply: Reply) -> None:
        self.released = threading.Event()
        self.reply = reply

        def held(_req: RecordedRequest) -> Reply:
            self.released.wait(20)
            return self.reply

        llm.rule(lambda r: len(llm.requests) == 1, held, times=1)

    def open(self) -> None:
        self.released.set()


async def start(conn: Any, workspace: Path) -> str:
    init = await raw_request(
        conn,
        "initialize",
        {"protocolVersion": 1, "clientCapabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
    )
    assert init["_meta"]["steering"]["supported"] is True  # where codex-acp and claude-agent-acp say it
    assert "session/steering" in init["agentCapabilities"]["_meta"]["crow"]["extensions"]
    return (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id


def steer(conn: Any, sid: str, *blocks: dict[str, Any], meta: dict[str, Any] | None = None) -> Any:
    params: dict[str, Any] = {"sessionId": sid, "prompt": list(blocks)}
    if meta is not None:
        params["_meta"] = meta
    return raw_request(conn, "_session/steering", params)


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


async def written(client: Any, n: int) -> None:
    """Until the client has written `n` steering requests (so they go out in our order)."""

    def count() -> int:
        return sum(
            1 for d, m in client.wire.messages if d == "out" and m.get("method") == "_session/steering"
        )

    with anyio.fail_after(10):
        while count() < n:  # noqa: ASYNC110  (the SDK observer has no event to wait on)
            await anyio.sleep(0.005)


async def error_of(call: Any) -> RequestError:
    with pytest.raises(RequestError) as info:
        await call
    return info.value


async def steered_turn(
    conn: Any,
    client: Any,
    sid: str,
    llm: ScriptedLLM,
    gate: Gate,
    *steerings: list[dict[str, Any]],
    end: Callable[[dict[Any, Any]], Awaitable[None]] | None = None,
) -> dict[Any, Any]:
    """Prompt, steer while the model's first call is held, check a prompt is busy, then
    `end(results)` (default: release the model); the turn's answer ("prompt") and each
    steering's (its result or its RequestError; "rid<i>": its JSON-RPC id)."""
    results: dict[Any, Any] = {}

    async def prompt() -> None:
        results["prompt"] = await conn.prompt(session_id=sid, prompt=[acp.text_block("PLAN the work")])

    async def one(i: int, blocks: list[dict[str, Any]]) -> None:
        try:
            results[i] = await steer(conn, sid, *blocks)
        except RequestError as exc:
            results[i] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(prompt)
        await anyio.to_thread.run_sync(llm.wait_for_requests, 1)
        for i, blocks in enumerate(steerings):
            results[f"rid{i}"] = conn._conn._next_request_id
            tg.start_soon(one, i, blocks)
            await written(client, i + 1)
        busy = await error_of(conn.prompt(session_id=sid, prompt=[acp.text_block("me too")]))
        assert busy.code == -32001  # a prompt while the turn runs is still refused
        if end is None:
            gate.open()
        else:
            await end(results)
    gate.open()
    return results


async def test_steering_reaches_the_next_model_request_of_the_same_turn(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    gate = Gate(llm, Reply(text="working on it"))
    llm.default = lambda r: Reply(text="done")
    image = {"type": "image", "mimeType": "image/png", "data": PNG64}
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        results = await steered_turn(
            conn, client, sid, llm, gate, [text("also update the README")], [text("and look at this"), image]
        )
        assert results["prompt"].stop_reason == "end_turn"
        assert [results[0]["outcome"], results[1]["outcome"]] == ["injected", "injected"]
        # Steering after the turn: a clear error, the message not consumed.
        late = await error_of(steer(conn, sid, text("too late")))
        assert late.code == -32600 and late.data == {"reason": "noRunningTurn"}
        assert "no turn is running" in str(late)
        opted = await steer(
            conn, sid, text("too late"), meta={"steering": {"idleBehavior": "promptRequired"}}
        )
        assert opted == {"outcome": "promptRequired", "reason": "noRunningTurn"}
        echoes = [
            (u.message_id, u.content.text) for u in client.of_type("UserMessageChunk", sid)
        ]  # the prompt itself is the client's own: not echoed
    assert echoes == [
        (results[0]["messageId"], "also update the README"),
        (results[1]["messageId"], "and look at this\n[image]"),
    ]
    assert len(llm.requests) == 2  # the same turn went on for the steering: one more call
    first, second = (r.messages for r in llm.requests)
    assert [m["content"] for m in first if m["role"] == "user"] == ["PLAN the work"]
    tail = [(m["role"], m["content"]) for m in second[-3:]]
    assert tail == [
        ("assistant", "working on it"),
        ("user", "also update the README"),
        ("user", "and look at this"),
    ]
    parts = llm.requests[1].json["messages"][-1]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url"]
    assert all("too late" not in m["content"] for m in second)

    # session/load in a new crow replays the steering as the user's messages, under their ids.
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        replayed = [(u.message_id, u.content.text) for u in client.of_type("UserMessageChunk", sid)]
    assert replayed[1:] == echoes and replayed[0][1] == "PLAN the work"


async def test_steering_during_a_tool_batch_follows_the_tool_results(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (workspace / "a.txt").write_text("alpha\n")
    gate = Gate(llm, Reply(tool_calls=[ToolCallSpec("read_file", {"path": "a.txt"}, id="call_a")]))
    llm.default = lambda r: Reply(text="done")
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        results = await steered_turn(conn, client, sid, llm, gate, [text("stop after this file")])
    assert results["prompt"].stop_reason == "end_turn" and results[0]["outcome"] == "injected"
    second = llm.requests[1].messages
    assert [m["role"] for m in second[-3:]] == ["assistant", "tool", "user"]  # a valid history
    assert second[-1]["content"] == "stop after this file"


async def test_a_turn_that_ends_without_taking_the_steering_refuses_it(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """max_iterations reached after the tool batch: the steering was accepted into the queue
    but no model call of the turn saw it, so its answer is the no-turn error, and it is not
    stored (the next turn's model does not see it)."""
    (home / "config.yaml").write_text("max_iterations: 1\n")
    (workspace / "a.txt").write_text("alpha\n")
    gate = Gate(llm, Reply(tool_calls=[ToolCallSpec("read_file", {"path": "a.txt"})]))
    llm.default = lambda r: Reply(text="ok")
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        results = await steered_turn(conn, client, sid, llm, gate, [text("never seen")])
        assert results["prompt"].stop_reason == "max_turn_requests"
        error = results[0]
        assert error.code == -32600 and error.data == {"reason": "noRunningTurn"}
        assert "ended (max_turn_requests) before it took this message" in str(error)
        again = await conn.prompt(session_id=sid, prompt=[acp.text_block("next")])  # still usable
        assert again.stop_reason == "end_turn"
        assert not client.of_type("UserMessageChunk", sid)
    assert all("never seen" not in m["content"] for r in llm.requests for m in r.messages)


async def test_a_hook_stop_refuses_the_steering_the_turn_did_not_take(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """A hook stops the turn right after the model call the steering arrived during: no
    model call of the turn saw it, so its answer is the no-turn error."""
    config = home / "stop.yaml"
    config.write_text("hooks:\n  extra: ['steer_plugins:StopOnWord']\n")
    gate = Gate(llm, Reply(text="STOP here"))
    llm.default = lambda r: Reply(text="ok")
    env = crow_env(llm, home, PYTHONPATH=str(Path(__file__).parent / "support"))
    async with spawn_crow(env, "--config", str(config)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        results = await steered_turn(conn, client, sid, llm, gate, [text("never seen")])
        assert results["prompt"].stop_reason == "end_turn"
        assert "ended (end_turn) before it took this message" in str(results[0])
        assert not client.of_type("UserMessageChunk", sid)
    assert len(llm.requests) == 1


async def test_a_cancel_refuses_the_steering_it_did_not_take(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    gate = Gate(llm, Reply(text="never shown"))
    llm.default = lambda r: Reply(text="ok")
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)

        async def cancel(_results: dict[Any, Any]) -> None:
            await conn.cancel(session_id=sid)

        results = await steered_turn(conn, client, sid, llm, gate, [text("never seen")], end=cancel)
        assert results["prompt"].stop_reason == "cancelled"
        assert "ended (cancelled)" in str(results[0])
        assert (await conn.prompt(session_id=sid, prompt=[acp.text_block("next")])).stop_reason == "end_turn"
    assert all("never seen" not in m["content"] for r in llm.requests for m in r.messages)


async def test_bad_steering_requests_get_clear_errors(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        cases = {
            "no blocks": {"sessionId": sid, "prompt": []},
            "not a list": {"sessionId": sid, "prompt": "hello"},
            "no session": {"prompt": [text("hi")]},
            "a block without text": {"sessionId": sid, "prompt": [{"type": "text"}]},
            "an unknown block": {"sessionId": sid, "prompt": [{"type": "video", "url": "x"}]},
            "only blanks": {"sessionId": sid, "prompt": [text("   ")]},
            "a broken image": {
                "sessionId": sid,
                "prompt": [{"type": "image", "mimeType": "image/png", "data": "!!"}],
            },
        }
        for name, params in cases.items():
            error = await error_of(raw_request(conn, "_session/steering", params))
            assert error.code == -32602, name
        unknown = await error_of(steer(conn, "no-such-session", text("hi")))
        assert unknown.code == -32600 and "no-such-session" in str(unknown)
        # The session is still usable.
        assert (await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])).stop_reason == "end_turn"


def test_steering_with_the_typescript_sdk_client(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    """The official TypeScript client steers the turn (the first answer streams slowly: the
    steering is sent as its first chunk arrives, 2 s before the stream ends), sees the echo,
    and gets the busy and no-turn errors."""
    llm.push(Reply(text=" ".join(["step"] * 20), chunk_size=0, chunk_delay=0.1))
    llm.default = lambda r: Reply(text="done")
    steps = [
        {"request": "initialize", "params": {"protocolVersion": 1, "clientCapabilities": {}}, "as": "init"},
        {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "new"},
        {
            "request": "session/prompt",
            "params": {"sessionId": "${new.sessionId}", "prompt": [text("PLAN it")]},
            "as": "turn",
            "wait": False,
        },
        {"until": "agent_message_chunk"},
        {
            "request": "_session/steering",
            "params": {"sessionId": "${new.sessionId}", "prompt": [text("use tabs")]},
            "as": "steer",
            "wait": False,
        },
        {
            "request": "session/prompt",
            "params": {"sessionId": "${new.sessionId}", "prompt": [text("me too")]},
            "as": "busy",
        },
        {"await": "steer"},
        {"await": "turn"},
        {
            "request": "_session/steering",
            "params": {"sessionId": "${new.sessionId}", "prompt": [text("late")]},
            "as": "late",
        },
    ]
    out = run_script({"steps": steps}, crow_env(llm, home), workspace)
    results = out["results"]
    assert results["init"]["result"]["_meta"]["steering"]["supported"] is True
    assert results["turn"]["result"]["stopReason"] == "end_turn"
    assert results["busy"]["error"]["code"] == -32001
    assert results["steer"]["result"]["outcome"] == "injected"
    assert results["late"]["error"]["code"] == -32600
    echoes = [u["update"] for u in out["updates"] if u["update"]["sessionUpdate"] == "user_message_chunk"]
    assert [(e["messageId"], e["content"]["text"]) for e in echoes] == [
        (results["steer"]["result"]["messageId"], "use tabs")
    ]
    assert len(llm.requests) == 2 and llm.requests[1].messages[-1] == {"role": "user", "content": "use tabs"}


async def test_a_steering_request_cancelled_before_the_turn_took_it_is_taken_back(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """`$/cancel_request` of a queued steering: answered -32800, and the turn never sees
    the message (it ends after its one model call, nothing stored)."""
    gate = Gate(llm, Reply(text="first answer"))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)

        async def cancel_it(results: dict[Any, Any]) -> None:
            await conn._conn.send_notification("$/cancel_request", {"requestId": results["rid0"]})
            with anyio.fail_after(10):
                while 0 not in results:  # noqa: ASYNC110  (answered before the model goes on)
                    await anyio.sleep(0.01)
            gate.open()

        results = await steered_turn(conn, client, sid, llm, gate, [text("never mind")], end=cancel_it)
        assert results[0].code == -32800
        assert results["prompt"].stop_reason == "end_turn"
        assert not client.of_type("UserMessageChunk", sid)
    assert len(llm.requests) == 1
