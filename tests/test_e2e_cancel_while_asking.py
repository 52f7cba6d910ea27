"""End to end: `session/cancel` while crow waits for the user's answer to a permission
question. The prompt answers `cancelled`, the call the editor shows as `pending` gets a
final status (never left pending), and the session goes on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import acp
import anyio
import pytest

from tests.conftest import RecordingClient, crow_env, spawn_crow
from tests.llm_server import Reply, ScriptedLLM
from tests.test_e2e_zed_details import as_timeline, call, crow_wrote, start, story

pytestmark = pytest.mark.anyio


class SlowToAnswer(RecordingClient):
    """Never answers a permission question until cancelled; `asked` is set when asked."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = anyio.Event()

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any
    ) -> Any:
        self.asked.set()
        await anyio.sleep(5)
        return await super().request_permission(session_id, tool_call, options, **kwargs)


async def test_a_cancel_while_the_user_is_asked_leaves_no_call_pending(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Reply(tool_calls=[call("execute", "asked", command="echo hi")]), Reply(text="after"))
    client = SlowToAnswer()
    async with spawn_crow(crow_env(llm, home), client=client) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        async with anyio.create_task_group() as tg:
            answers: list[Any] = []

            async def ask() -> None:
                answers.append(await conn.prompt(session_id=sid, prompt=[acp.text_block("run it")]))

            tg.start_soon(ask)
            with anyio.fail_after(20):
                await client.asked.wait()
            await conn.cancel(session_id=sid)
        assert answers[0].stop_reason == "cancelled"
        timeline = as_timeline(crow_wrote(client))
        seen = story(timeline, "asked")
        assert seen[:2] == ["tool_call:pending", "permission"] and seen[-1] == "update:failed", seen
        ok = await conn.prompt(session_id=sid, prompt=[acp.text_block("again")])
        assert ok.stop_reason == "end_turn"
