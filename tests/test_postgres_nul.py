"""End to end on a PostgreSQL store: a first prompt holding U+0000 (which PostgreSQL text
refuses; its title is that prompt's line) runs its turn and replays, as on SQLite; the
store keeps U+0000 in plain text fields as U+FFFD rather than refusing the write."""

from __future__ import annotations

from pathlib import Path

import acp
import pytest

from crow.messages import human
from crow.store.postgres import PostgresStore
from tests.conftest import spawn_crow
from tests.llm_server import Reply, ScriptedLLM
from tests.test_e2e_sessions import open_session
from tests.test_postgres_e2e import pg_env, replay

pytestmark = pytest.mark.anyio


async def test_a_first_prompt_with_nul_runs_its_turn_and_replays(
    llm: ScriptedLLM, pg_url: str, home: Path, workspace: Path
) -> None:
    llm.push(Reply(text="got it"))
    async with spawn_crow(pg_env(llm, home, pg_url)) as (conn, _proc, client):
        sid = await open_session(conn, workspace)
        done = await conn.prompt(session_id=sid, prompt=[acp.text_block("nul\x00here")])
        assert done.stop_reason == "end_turn"
        listed = await conn.list_sessions(cwd=str(workspace))
        assert [s.title for s in listed.sessions] == ["nul\ufffdhere"]
        replayed = await replay(conn, client, sid, workspace)
    texts = [(u["session_update"], u["content"]["text"]) for _, u in replayed if "content" in u]
    assert texts == [("user_message_chunk", "nul\x00here"), ("agent_message_chunk", "got it")]


async def test_nul_in_plain_text_is_stored_not_refused(pg_url: str) -> None:
    # PostgreSQL text refuses U+0000 (SQLite keeps it); message JSON escapes it. A title
    # is the first prompt's line, a rule a command the model ran: neither may fail a turn.
    async with PostgresStore(pg_url) as store:
        made = await store.create_session(id="s", cwd="/w\x00", title="a\x00b", model="m\x00")
        assert (made.cwd, made.title, made.model) == ("/w\ufffd", "a\ufffdb", "m\ufffd")
        assert (
            await store.update_session("s", title="hello\x00world", mode="x\x00")
        ).title == "hello\ufffdworld"
        await store.append("s", [human("nul\x00kept")])
        assert [m.content for m in await store.load_transcript("s")] == ["nul\x00kept"]
        await store.add_project_rules("/p\x00", ["execute(a\x00b)"])
        assert await store.project_rules("/p\x00") == ["execute(a\ufffdb)"]
        assert await store.get_session("s\x00") is None
        assert await store.match_ids("s\x00") == []


async def test_a_sqlite_session_with_nul_in_its_title_is_migrated(pg_url: str, tmp_path: Path) -> None:
    from crow.store import SQLiteStore
    from crow.store.migrate import migrate

    db = tmp_path / "crow.db"
    async with SQLiteStore(db) as lite:  # SQLite keeps U+0000: a first prompt's line with one
        await lite.create_session(id="a", cwd="/w", title="nul\x00title")
        await lite.append("a", [human("nul\x00here")])
        await lite.create_session(id="b", cwd="/w", title="plain")
    async with PostgresStore(pg_url) as pg:
        assert await migrate(str(db), None, pg, print) == 2
        got = await pg.get_session("a")
        assert got is not None and got.title == "nul\ufffdtitle"
        assert [m.content for m in await pg.load_transcript("a")] == ["nul\x00here"]
