"""End to end on a PostgreSQL store (the real server), crow spawned and driven by the ACP
Python client with the scripted model: `/undo` puts files back from checkpoint records read
from the database (CROW_HOME holds only the blobs); "always allow in this project" granted
in one crow holds in another crow on the same database with another CROW_HOME; and an undo
in a crow whose CROW_HOME lacks the turn's blobs names each file it cannot put back, and
where the copies are, writing none of them; `crow sessions rewind` and `crow sessions
delete` on the database act on its records too."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

import acp
import anyio
import pytest

from crow.checkpoints import sha256
from tests.conftest import crow_env, initialize_125, spawn_crow
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec
from tests.test_checkpoints_postgres import database, files_in, turns_in_db
from tests.test_e2e_checkpoints import turn_replies
from tests.test_e2e_compaction_updates import sent
from tests.test_e2e_permissions import ScriptedAnswers, results

pytestmark = pytest.mark.anyio


async def work(llm: ScriptedLLM, home: Path, workspace: Path, url: str) -> tuple[str, dict[str, str]]:
    """A session in a fresh crow on the database `url` whose one turn makes new.txt, edits
    old.txt ("one" to "two") and runs a command that makes cmd.txt; its id, and the crow's
    environment."""
    (workspace / "old.txt").write_text("one\n")
    env = crow_env(llm, home, CROW_SANDBOX="off", CROW_STORE=url)
    llm.push(*turn_replies())
    async with spawn_crow(env) as (conn, _proc, _client):
        await initialize_125(conn)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        assert (await conn.prompt(session_id=sid, prompt=[acp.text_block("work")])).stop_reason == "end_turn"
    return sid, env


async def test_undo_on_postgresql_puts_the_files_back_from_records_in_the_database(
    llm: ScriptedLLM, home: Path, workspace: Path, postgres: Any, pg_url: str
) -> None:
    sid, env = await work(llm, home, workspace, pg_url)
    assert files_in(home / "checkpoints" / sid) == ["blobs/" + sha256(b"one\n")], "no record in CROW_HOME"
    assert len(turns_in_db(postgres, pg_url, sid)) == 1

    async with spawn_crow(env) as (conn, _proc, client):  # another crow process, same home
        await initialize_125(conn)
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        assert (await conn.prompt(session_id=sid, prompt=[acp.text_block("/undo")])).stop_reason == "end_turn"
        told = sent(client, "notice")[-1]
    assert told["severity"] == "info", told
    assert "Files restored: old.txt." in told["description"]
    assert "Files removed (created by it): cmd.txt, new.txt." in told["description"]
    assert (workspace / "old.txt").read_text() == "one\n"
    assert not (workspace / "new.txt").exists() and not (workspace / "cmd.txt").exists()
    assert turns_in_db(postgres, pg_url, sid) == []
    assert files_in(home / "checkpoints" / sid) == []


async def test_always_allow_in_this_project_holds_in_another_crow_on_the_same_database(
    llm: ScriptedLLM, tmp_path: Path, postgres: Any, pg_url: str
) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    homes = [tmp_path / "home-a", tmp_path / "home-b"]
    for h in homes:
        h.mkdir()

    def call(id: str, command: str) -> ToolCallSpec:
        return ToolCallSpec("execute", {"command": command}, id=id)

    llm.push(Reply(tool_calls=[call("c1", "echo one")]), Reply(text="ok"))
    first = ScriptedAnswers("allow_always_project")
    async with spawn_crow(crow_env(llm, homes[0], CROW_STORE=pg_url), client=first) as (conn, _p, _c):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(repo), mcp_servers=[])).session_id
        await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
    stored = postgres.psql("SELECT project || ' ' || rule FROM project_rules", database(pg_url))
    assert stored.strip() == f"{repo.resolve()} execute(echo *)"

    llm.push(Reply(tool_calls=[call("c2", "echo two"), call("c3", "ls")]), Reply(text="ok"))
    second = ScriptedAnswers("reject_once")
    async with spawn_crow(crow_env(llm, homes[1], CROW_STORE=pg_url), client=second) as (conn, _p, _c):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(repo), mcp_servers=[])).session_id
        await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
    assert [tc.raw_input["command"] for tc, _ in second.permission_requests] == ["ls"], "echo was granted"
    assert results(llm, 3)["c2"].startswith("two")
    assert not [h for h in homes if (h / "rules.json").exists()], "kept in the database only"


async def test_an_undo_where_the_blobs_are_not_names_what_it_cannot_put_back(
    llm: ScriptedLLM, tmp_path: Path, workspace: Path, postgres: Any, pg_url: str
) -> None:
    """The session's turn ran with CROW_HOME a (another machine, in effect); a crow with
    CROW_HOME b undoes it: the records come from the database, the copies of old.txt and the
    workspace snapshot are in a, so old.txt and cmd.txt stay as the turn left them, each
    named with why; new.txt, created by the turn and still as it left it, is removed."""
    home_a, home_b = tmp_path / "home-a", tmp_path / "home-b"
    home_a.mkdir()
    home_b.mkdir()
    sid, _ = await work(llm, home_a, workspace, pg_url)

    async with spawn_crow(crow_env(llm, home_b, CROW_SANDBOX="off", CROW_STORE=pg_url)) as (conn, _p, _c):
        await initialize_125(conn)
        result = await conn.ext_method("crow.rewind", {"sessionId": sid, "turns": 1})
    where = f"CROW_HOME {home_a.resolve()} on {socket.gethostname()}"
    assert result["restored"] == [] and result["removed"] == ["new.txt"]
    assert result["skipped"] == [
        {
            "path": "(commands' changes)",
            "reason": f"the snapshots of its commands are in {where}, where the turn ran, not here",
        },
        {
            "path": "old.txt",
            "reason": f"its copy from before the turn is in {where}, where the turn ran, not here",
        },
    ]
    assert f"old.txt (its copy from before the turn is in {where}" in result["message"]
    assert (workspace / "old.txt").read_text() == "two\n"
    assert (workspace / "cmd.txt").read_text() == "ran\n"
    assert not (workspace / "new.txt").exists()
    assert turns_in_db(postgres, pg_url, sid) == []


async def test_crow_sessions_delete_on_postgresql_forgets_the_records_too(
    llm: ScriptedLLM, home: Path, workspace: Path, postgres: Any, pg_url: str
) -> None:
    """`crow sessions delete` on a PostgreSQL store removes the session's checkpoint records
    from the database, with its blobs and snapshot refs from CROW_HOME."""
    sid, env = await work(llm, home, workspace, pg_url)
    assert len(turns_in_db(postgres, pg_url, sid)) == 1
    delete = [sys.executable, "-m", "crow", "sessions", "delete", sid]
    done = await anyio.run_process(delete, env=env, cwd=workspace, check=False)
    assert done.returncode == 0, done.stderr
    assert turns_in_db(postgres, pg_url, sid) == []
    assert not (home / "checkpoints" / sid).exists()
    assert [p for p in (home / "checkpoints" / "git").iterdir() if p.is_dir()] == [], "no snapshot ref left"


async def test_crow_sessions_rewind_on_postgresql_puts_the_files_back(
    llm: ScriptedLLM, home: Path, workspace: Path, postgres: Any, pg_url: str
) -> None:
    sid, env = await work(llm, home, workspace, pg_url)
    rewind = [sys.executable, "-m", "crow", "sessions", "rewind", sid]
    done = await anyio.run_process(rewind, env=env, cwd=workspace, check=False)
    assert done.returncode == 0, done.stderr
    assert (workspace / "old.txt").read_text() == "one\n"
    assert not (workspace / "new.txt").exists() and not (workspace / "cmd.txt").exists()
    assert turns_in_db(postgres, pg_url, sid) == []
