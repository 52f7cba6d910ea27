"""End to end: with the `subagents` capability, a child's session shows what the child
was asked (its first user message) live, right after the child is announced, under the
id `session/load` replays it with (crow/acp/subagents.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import crow_env, initialize_125, spawn_crow
from tests.llm_server import ScriptedLLM
from tests.test_acp_subagents_e2e import WITH_SUBAGENTS, configure, linked_child, run_fix, wire_updates

pytestmark = pytest.mark.anyio


async def test_a_childs_session_shows_its_prompt_first(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    _sid, updates = await run_fix(llm, home, workspace, subagents=True)
    kid = linked_child(updates, "t1")
    announced = next(
        i
        for i, (_, u) in enumerate(updates)
        if u["sessionUpdate"] == "subagent_update" and u["sessionId"] == kid
    )
    first = next(i for i, (s, _) in enumerate(updates) if s == kid)
    shown = updates[first][1]
    assert announced < first and shown["sessionUpdate"] == "user_message_chunk"
    assert shown["content"]["text"] == "CHILD-A: change hello to bye in a.txt"
    async with spawn_crow(crow_env(llm, home), "--config", str(configure(home))) as (conn, _proc, client):
        await initialize_125(conn, WITH_SUBAGENTS)
        await conn.load_session(cwd=str(workspace), session_id=kid, mcp_servers=[])
    replayed = next(u for s, u in wire_updates(client) if s == kid)
    assert (replayed["sessionUpdate"], replayed["messageId"]) == ("user_message_chunk", shown["messageId"])
