"""End to end: a hook's notice with a severity ACP has not got (`critical`) still reaches
the user, as a valid `notice` (schema 1.25 allows info, warning, error) or as text, and
the turn goes on."""

from __future__ import annotations

from pathlib import Path

import acp
import pytest

from tests.conftest import crow_env, spawn_crow
from tests.llm_server import Reply, ScriptedLLM
from tests.test_e2e_notices import SUPPORT, config, said, sent, start

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("notices", [True, False], ids=["notices", "text"])
async def test_a_hooks_notice_with_an_unknown_severity(
    llm: ScriptedLLM, home: Path, workspace: Path, notices: bool
) -> None:
    path = config(home, hooks={"extra": ["notice_plugins:Shouter"]})
    env = crow_env(llm, home, PYTHONPATH=str(SUPPORT))
    llm.push(Reply(text="answer"))
    async with spawn_crow(env, "--config", str(path)) as (conn, _proc, client):
        sid = await start(conn, workspace, notices)
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
        assert response.stop_reason == "end_turn"
    if notices:
        (notice,) = sent(client, "notice")
        assert (notice["severity"], notice["title"]) == ("info", "Build")
        assert said(sent(client, "agent_message_chunk")) == "answer"
    else:
        assert said(sent(client, "agent_message_chunk")) == "Build: the build is on fire\nanswer"
