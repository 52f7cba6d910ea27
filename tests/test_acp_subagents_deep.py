"""End to end: a grandchild (max_depth 2) as an ACP editor sees it, crow spawned over ACP
with a scripted model playing parent, child and grandchild (crow/acp/subagents.py)."""

from __future__ import annotations

from pathlib import Path

import acp
import pytest
import yaml

from tests.conftest import crow_env, spawn_crow
from tests.llm_server import Reply, ScriptedLLM
from tests.test_acp_subagents_e2e import child, linked_child, start, task, tool, wire_updates

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("subagents", [False, True], ids=["flat", "sessions"])
async def test_a_childs_task_call_stays_linked_to_the_grandchild_it_ran(
    llm: ScriptedLLM, home: Path, workspace: Path, subagents: bool
) -> None:
    """The child's own task call is linked (`_meta.crow.subagentSessionId`) to the
    grandchild it runs, from its start to its end: never to the session it ran in, which
    its `parentToolCallId` already names."""
    (workspace / "a.txt").write_text("hello\n")
    llm.push(Reply(tool_calls=[task("t1", "Delegate", "CHILD-A: delegate the reading")]), Reply(text="done"))
    child(
        llm,
        "CHILD-A",
        Reply(tool_calls=[task("t2", "Read it", "CHILD-B: read a.txt")]),
        Reply(text="the grandchild read it"),
    )
    child(
        llm, "CHILD-B", Reply(tool_calls=[tool("read_file", "c1", path="a.txt")]), Reply(text="it says hello")
    )
    config = home / "deep.yaml"
    config.write_text(
        yaml.safe_dump({"mode": "yolo", "hooks": {"settings": {"subagents": {"max_depth": 2}}}})
    )
    async with spawn_crow(crow_env(llm, home), "--config", str(config)) as (conn, _proc, client):
        sid = await start(conn, workspace, subagents)
        answer = await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
    assert answer.stop_reason == "end_turn"
    updates = wire_updates(client)
    kid = linked_child(updates, "t1")
    if subagents:
        on_kid = [(s, u) for s, u in updates if s == kid]
        grandkid = linked_child(on_kid, "t2")
    else:
        assert {s for s, _ in updates} == {sid}
        # before its grandchild starts it names the session it runs in; from the link on
        # (the update that only links it), every update of it names the grandchild
        mine = [u for _, u in updates if u.get("toolCallId") == "t1/t2"]
        link = next(
            i
            for i, u in enumerate(mine)
            if u.get("_meta", {}).get("crow", {}).keys() == {"subagentSessionId"}
        )
        grandkid = linked_child([(sid, u) for u in mine[link:]], "t1/t2")
        assert mine[-1]["status"] == "completed"
        [read] = {
            u["_meta"]["crow"]["subagentSessionId"] for _, u in updates if u.get("toolCallId") == "t1/t2/c1"
        }
        assert read == grandkid
    assert grandkid not in (sid, kid)
