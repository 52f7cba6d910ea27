"""End to end: `ask_user` reads its arguments as its tool validated them.

The tool's arguments are checked by its function server, which takes JSON the way models
write it (`"multiple": "false"` is a valid boolean, false); the form must be built from
the same values, not from the raw JSON (where the text "false" is truthy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import crow_env, spawn_crow
from tests.llm_server import Reply, ScriptedLLM
from tests.test_e2e_ask import DB, Hostile, ask, new_session, prompt, result_of

pytestmark = pytest.mark.anyio


async def test_multiple_written_as_the_text_false_asks_for_one_choice(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(ask("c1", "Which database?", options=DB, multiple="false"), Reply(text="ok"))
    llm.push(ask("c2", "Which ones?", options=DB, multiple="true"), Reply(text="ok"))
    client = Hostile(
        [
            {"action": "accept", "content": {"answer": "SQLite"}},
            {"action": "accept", "content": {"answer": ["SQLite", "DuckDB"]}},
        ]
    )
    async with spawn_crow(crow_env(llm, home), client=client, unstable=True) as (conn, _proc, _):
        sid = await new_session(conn, workspace, forms=True)
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
    fields = [form.requested_schema.properties["answer"] for form in client.forms]
    assert [f.type for f in fields] == ["string", "array"], fields
    assert result_of(llm.requests[1], "c1") == 'The user chose "SQLite".'
    assert result_of(llm.requests[3], "c2") == 'The user chose: "SQLite", "DuckDB".'
