"""End to end: a model server whose usage figures are impossible (negative tokens, more
cached tokens than prompt tokens) must not put a negative cost or a negative `used` on
the wire, nor store a negative total."""

from __future__ import annotations

from pathlib import Path

import acp
import pytest

from tests.conftest import crow_env, spawn_crow
from tests.llm_server import Reply, ScriptedLLM
from tests.test_e2e_cost import PRICED, usage_updates
from tests.test_e2e_providers import anthropic_env

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize(
    ("usage", "cache"),
    [((100, 20), (5000, 0)), ((-100000, -50), (0, 0)), ((10**400, 10**30), (0, 0))],
    ids=["cached-over-prompt", "negative", "huge"],
)
async def test_impossible_usage_puts_nothing_negative_on_the_wire(
    llm: ScriptedLLM,
    home: Path,
    workspace: Path,
    usage: tuple[int, int],
    cache: tuple[int, int],
    api: str,
) -> None:
    priced = PRICED + "  anthropic:claude-test:\n    pricing: {input: 2, output: 10, cache_read: 0.5}\n"
    (home / "config.yaml").write_text(priced)
    env = crow_env(llm, home) if api == "openai" else anthropic_env(llm, home)
    llm.push(Reply(text="hi", usage=usage, cache=cache), Reply(text="again", usage=(10, 5)))
    async with spawn_crow(env) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        for text in ("one", "two"):
            response = await conn.prompt(session_id=sid, prompt=[acp.text_block(text)])
            assert response.stop_reason == "end_turn"
        updates = usage_updates(client.wire)
        assert updates
        for u in updates:
            assert 0 <= u["used"] <= 2**53, u
            assert "cost" not in u or u["cost"]["amount"] >= 0, u
