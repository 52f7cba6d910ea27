"""End to end: a subagent's question the editor is still showing when crow stops waiting
for it (its parent deleted, or the parent's prompt cancelled by its request id: the
editor sent no `session/cancel`, so nothing else tells it) is taken back with
`$/cancel_request` naming it (crow/acp/client.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import acp
import pytest

from tests.conftest import RecordingClient, crow_env, raw_request, spawn_crow
from tests.llm_server import Reply, ScriptedLLM
from tests.test_acp_subagents_e2e import child, configure, start, task, tool

pytestmark = pytest.mark.anyio


class LookingAway(RecordingClient):
    """Shows each permission request and never answers it (its user looks away)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = asyncio.Event()

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any
    ) -> Any:
        self.asked.set()
        await asyncio.Event().wait()


def sent(client: RecordingClient, method: str) -> list[dict[str, Any]]:
    return [m for d, m in client.wire.messages if d == "in" and m.get("method") == method]  # type: ignore[union-attr]


@pytest.mark.parametrize("how", ["delete", "cancel_request", "cancel"])
@pytest.mark.parametrize("subagents", [False, True], ids=["flat", "sessions"])
async def test_a_childs_open_permission_request_is_taken_back_when_its_turn_stops(
    llm: ScriptedLLM, home: Path, workspace: Path, subagents: bool, how: str
) -> None:
    (workspace / "a.txt").write_text("hello\n")
    llm.push(Reply(tool_calls=[task("t1", "Fix it", "CHILD-A: change it")]), Reply(text="never"))
    edit = tool("edit_file", "c1", path="a.txt", old_text="hello", new_text="bye")
    child(llm, "CHILD-A", Reply(tool_calls=[edit]), Reply(text="never"))
    client = LookingAway()
    env = crow_env(llm, home)
    async with spawn_crow(env, "--config", str(configure(home, "ask")), client=client) as (conn, _proc, _c):
        sid = await start(conn, workspace, subagents)
        rid = conn._conn._next_request_id
        turn = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("go")]))
        await asyncio.wait_for(client.asked.wait(), 30)
        if how == "delete":
            assert await raw_request(conn, "session/delete", {"sessionId": sid}) == {}
        elif how == "cancel_request":
            await conn._conn.send_notification("$/cancel_request", {"requestId": rid})
        else:  # the editor should answer it `cancelled` itself; crow takes it back all the same
            await conn.cancel(session_id=sid)
        assert (await asyncio.wait_for(turn, 30)).stop_reason == "cancelled"
        # the answer to the prompt is written after the notice: both are here now
        [asked] = sent(client, "session/request_permission")
        assert [m["params"] for m in sent(client, "$/cancel_request")] == [{"requestId": asked["id"]}]
        # taken back before the child is reported idle
        order = [
            m["method"] if m["method"] != "session/update" else m["params"]["update"]["sessionUpdate"]
            for d, m in client.wire.messages  # type: ignore[union-attr]
            if d == "in" and m.get("method") in ("$/cancel_request", "session/update")
        ]
        if subagents:
            idle = len(order) - 1 - order[::-1].index("subagent_update")
            assert order.index("$/cancel_request") < idle
    assert (workspace / "a.txt").read_text() == "hello\n"
