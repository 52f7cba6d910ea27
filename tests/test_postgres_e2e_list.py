"""session/list on a PostgreSQL store that went away: a failure saying so (and the same
request answered once it is back), not "Invalid params" blaming the client's cursor; a
cursor crow cannot read is still the client's error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import acp
import pytest

from tests.conftest import spawn_crow
from tests.llm_server import Reply, ScriptedLLM
from tests.test_e2e_sessions import open_session
from tests.test_postgres_e2e import pg_env

pytestmark = pytest.mark.anyio


async def test_listing_while_the_database_is_away_says_so(
    llm: ScriptedLLM, postgres: Any, pg_url: str, home: Path, workspace: Path
) -> None:
    async with spawn_crow(pg_env(llm, home, pg_url)) as (conn, _proc, _client):
        sid = await open_session(conn, workspace)
        llm.push(Reply(text="ok"))  # a prompt waits for the session's setup, which stores it
        await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
        with pytest.raises(acp.RequestError) as bad:
            await conn.list_sessions(cursor="not a cursor")
        assert bad.value.code == -32602 and "invalid cursor" in str(bad.value.data)
        postgres.stop("fast")
        try:
            with pytest.raises(acp.RequestError) as away:
                await conn.list_sessions()
        finally:
            postgres.start()
        assert away.value.code == -32000, away.value
        assert str(away.value).startswith("cannot reach the PostgreSQL store at ")
        assert [s.session_id for s in (await conn.list_sessions()).sessions] == [sid]
