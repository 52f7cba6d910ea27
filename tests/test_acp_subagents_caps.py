"""End to end: a malformed `subagents` client capability (the unstable schema marks it
`x-deserialize-default-on-error`) reads as not advertised: `initialize` succeeds and
subagents show on the parent's session (crow/acp/protocol.py)."""

from __future__ import annotations

from pathlib import Path

import acp
import pytest

from tests.conftest import FEATURES_125, crow_env, initialize_125, spawn_crow
from tests.llm_server import ScriptedLLM
from tests.test_acp_subagents_e2e import configure, linked_child, script_fix, wire_updates

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("malformed", [True, "yes", [], 1])
async def test_a_malformed_subagents_capability_is_not_advertised(
    llm: ScriptedLLM, home: Path, workspace: Path, malformed: object
) -> None:
    (workspace / "a.txt").write_text("hello\n")
    script_fix(llm)
    async with spawn_crow(crow_env(llm, home), "--config", str(configure(home))) as (conn, _proc, client):
        await initialize_125(conn, {**FEATURES_125, "subagents": malformed})
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
    updates = wire_updates(client)
    assert linked_child(updates, "t1") != sid
    assert {s for s, _ in updates} == {sid}
    assert "subagent_update" not in [u["sessionUpdate"] for _, u in updates]
    assert any(u.get("toolCallId") == "t1/c1" for _, u in updates)


def test_a_malformed_session_capability_leaves_the_others_advertised() -> None:
    """`session.compaction` malformed: not advertised, and the notices and boolean config
    options beside it still are (the SDK used to drop the whole `session` object)."""
    from crow.acp.protocol import ClientFeatures, InitializeRequest

    session = {"compaction": True, "notices": {}, "configOptions": {"boolean": {}}}
    request = InitializeRequest.model_validate(
        {"protocolVersion": 1, "clientCapabilities": {"session": session}}
    )
    features = ClientFeatures.of(request.client_capabilities)
    assert (features.compaction, features.notices, features.boolean_options) == (False, True, True)
