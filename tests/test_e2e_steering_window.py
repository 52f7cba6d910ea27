"""End to end: steering between a prompt's acceptance and its turn's first step.

A prompt is busy from the moment crow takes it; before the turn itself runs, crow may wait
a long time (MCP servers starting, a prompt command expanding, the project's trust
question waiting for the user). A steering request in that window must not be told "no
turn is running, send it as a prompt" while a prompt is answered busy: the client would
have no way left to say it. It waits, and the turn takes it before its first model call.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import acp
import anyio
import pytest
from acp import RequestError

from tests.conftest import crow_env, spawn_crow
from tests.llm_server import RecordedRequest, Reply, ScriptedLLM
from tests.test_e2e_steering import start, steer, text, written
from tests.test_e2e_trust import TrustClient, make_repo, user_env

pytestmark = pytest.mark.anyio


class SlowTrust(TrustClient):
    """Holds crow's trust question until `release` is set."""

    def __init__(self) -> None:
        super().__init__("reject_once")
        self.asked = anyio.Event()
        self.release = anyio.Event()

    async def request_permission(self, session_id: str, tool_call: Any, options: list[Any], **kw: Any) -> Any:
        if tool_call.tool_call_id.startswith("crow-question-"):
            self.asked.set()
            await self.release.wait()
        return await super().request_permission(session_id, tool_call, options, **kw)


def user_texts(request: RecordedRequest) -> list[str]:
    return [m["content"] for m in request.messages if m["role"] == "user" and isinstance(m["content"], str)]


async def test_steering_while_the_prompt_waits_to_start_reaches_its_turn(
    llm: ScriptedLLM, home: Path, tmp_path: Path
) -> None:
    _root, sub = make_repo(tmp_path, {"mode": "yolo"})  # untrusted: crow asks first
    env = user_env(llm, home)
    llm.push(Reply(text="done"))
    client = SlowTrust()
    results: dict[str, Any] = {}
    async with spawn_crow(env, client=client, cwd=tmp_path) as (conn, _proc, _):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(sub), mcp_servers=[])).session_id

        async def prompt() -> None:
            results["prompt"] = await conn.prompt(session_id=sid, prompt=[acp.text_block("first")])

        async def steering() -> None:
            try:
                results["steer"] = await steer(conn, sid, text("and also this"))
            except RequestError as exc:
                results["steer"] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(prompt)
            with anyio.fail_after(20):
                await client.asked.wait()
            tg.start_soon(steering)
            await written(client, 1)
            with pytest.raises(RequestError) as busy:
                await conn.prompt(session_id=sid, prompt=[acp.text_block("me too")])
            assert busy.value.code == -32001  # the prompt is taken: a second one is busy
            client.release.set()
        assert results["prompt"].stop_reason == "end_turn"
        assert not isinstance(results["steer"], RequestError), results["steer"]
        assert results["steer"]["outcome"] == "injected"
    assert len(llm.requests) == 1
    assert user_texts(llm.requests[0])[-2:] == ["first", "and also this"]


async def test_steering_after_the_final_reply_is_refused_when_a_prompt_would_be_taken(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """After the model's last reply the turn takes no more, but the prompt is busy until
    its after_agent hooks end (the checkpoint's workspace snapshot; here a command hook
    held by the test). A client told "send it as a prompt" that does so at once must not
    be refused busy: the refusal comes when the prompt is over."""
    started, go = workspace / "after-agent-started", workspace / "go"
    hook = f"touch {started}; while [ ! -e {go} ]; do sleep 0.02; done"
    (home / "config.yaml").write_text(
        f"hooks:\n  commands:\n    - {{command: {json.dumps(hook)}, phases: [after_agent], timeout: 30}}\n"
    )
    llm.push(Reply(text="first answer"), Reply(text="second answer"))
    results: dict[str, Any] = {}
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)

        async def steer_then_prompt() -> None:
            try:
                results["steer"] = await steer(
                    conn, sid, text("one more thing"), meta={"steering": {"idleBehavior": "promptRequired"}}
                )
                if results["steer"].get("outcome") == "promptRequired":  # as claude-agent-acp's clients do
                    try:
                        results["again"] = await conn.prompt(
                            session_id=sid, prompt=[acp.text_block("one more thing")]
                        )
                    except RequestError as exc:
                        results["again"] = exc
            finally:
                go.touch()

        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _prompt(conn, sid, results))
            with anyio.fail_after(20):
                while not started.exists():  # noqa: ASYNC110  (a file the hook writes)
                    await anyio.sleep(0.02)
            tg.start_soon(steer_then_prompt)
            await written(client, 1)
            await anyio.sleep(1.0)  # a refusal answered at once has been acted on by now
            go.touch()
        assert results["first"].stop_reason == "end_turn"
        assert results["steer"] == {"outcome": "promptRequired", "reason": "noRunningTurn"}
        assert not isinstance(results["again"], RequestError), results["again"]
        assert results["again"].stop_reason == "end_turn"
    assert user_texts(llm.requests[1])[-1] == "one more thing"


async def _prompt(conn: Any, sid: str, results: dict[str, Any]) -> None:
    results["first"] = await conn.prompt(session_id=sid, prompt=[acp.text_block("first")])
