"""Subagents' sessions in listings and deletes: `crow sessions list` shows each under its
parent, ACP `session/list` lists only top-level sessions (a child stays loadable by id),
and deleting a parent deletes its children, their checkpoints included."""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import acp
import anyio
import pytest

from crow.errors import SessionBusy
from crow.messages import Message
from crow.store import SQLiteStore
from crow.store.direct import DirectStore
from tests.conftest import crow_env, initialize_125, raw_request, spawn_crow
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec
from tests.support.store_backends import is_postgres, new_store
from tests.test_cli_sessions import _ago, _cli

__all__ = ["new_store"]

pytestmark = pytest.mark.anyio

P, Q = "a" * 32, "b" * 32  # two top-level sessions
C1, C2, G = "c1" + "0" * 30, "c2" + "0" * 30, "d" * 32  # P's children; C1's child


async def _tree(db: Path | Any, cwd: str = "/w") -> None:
    """P (updated 1 min ago) with children C1 (older) and C2, C1 with child G; Q (newer).
    `db`: a SQLite file, or a factory of stores (`new_store`)."""
    async with SQLiteStore(db) if isinstance(db, Path) else db() as s:
        await s.create_session(id=P, cwd=cwd, title="parent", updated_at=_ago(60))
        await s.create_session(id=Q, cwd=cwd, title="other", updated_at=_ago(5))
        await s.create_session(
            id=C1, cwd=cwd, title="Find it", parent_id=P, config={"agent": "explore"}, created_at=_ago(50)
        )
        await s.create_session(id=C2, cwd=cwd, title="Check it", parent_id=P, created_at=_ago(40))
        await s.create_session(id=G, cwd=cwd, title="Deeper", parent_id=C1, config={"agent": "x"})


async def test_both_stores_list_top_level_sessions_and_find_the_ones_under_them(tmp_path: Path) -> None:
    db = tmp_path / "crow.db"
    await _tree(db)
    async with SQLiteStore(db) as s:
        page, _ = await s.list_sessions()
        assert [r.id for r in page] == [Q, P]
        assert [r.id for r in await s.descendants([P, Q])] == [C1, C2, G]  # oldest first
        assert [r.id for r in await s.descendants([C1])] == [G] and await s.descendants([]) == []
        assert (await s.get_session(C1)).config == {"agent": "explore"}  # type: ignore[union-attr]
    with DirectStore(db) as d:  # the same SQL
        assert [r.id for r in d.list_sessions()[0]] == [Q, P]
        assert [r.id for r in d.descendants([P])] == [C1, C2, G]


async def test_deleting_a_parent_deletes_the_sessions_under_it_unless_one_is_busy(new_store) -> None:
    await _tree(new_store)
    async with new_store() as a, new_store() as b:
        await a.append(G, [Message("user", "the grandchild's")])
        await a.lock_session(G)  # a turn runs in the grandchild (another process, say)
        with pytest.raises(SessionBusy, match=f"session {G} is running a turn"):
            await b.delete_session(P)
        assert await b.get_session(P) is not None and await b.get_session(G) is not None, "nothing deleted"
        await a.unlock_session(G)
        assert await b.delete_session(P) == [P, C1, C2, G]
        for sid in (P, C1, C2, G):
            assert await b.get_session(sid) is None
        assert [r.id for r in (await b.list_sessions())[0]] == [Q]
        probe = a
    if is_postgres(probe):
        import psycopg

        with psycopg.connect(probe._url) as raw:
            left = {t: raw.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("entries", "session_locks")}
    else:
        with sqlite3.connect(probe._path) as raw:
            left = {t: raw.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("entries", "session_locks")}
    assert left == {"entries": 0, "session_locks": 0}


def test_sessions_list_shows_children_under_their_parent(home: Path, tmp_path: Path) -> None:
    from tests.support.on_pty import stdout_on_pty

    anyio.run(_tree, home / "crow.db", str(tmp_path))
    env = crow_env(None, home)
    piped = _cli(env, "sessions", "list")
    assert piped.returncode == 0, piped.stderr
    rows = [line.split("\t") for line in piped.stdout.splitlines()]
    assert [(r[0], r[4], r[5]) for r in rows] == [
        (Q, "other", ""),
        (P, "parent", ""),
        (C1, "Find it", P),
        (G, "Deeper", C1),
        (C2, "Check it", P),
    ]
    status, out = stdout_on_pty([sys.executable, "-m", "crow", "sessions", "list"], env=env)
    assert status == 0
    lines = out.decode().replace("\r\n", "\n").splitlines()
    assert [line.split("  ")[0] for line in lines] == ["bbbbbbbb", "aaaaaaaa", "", "", ""]
    assert lines[2].startswith("  └ c1000000") and "Find it (explore)" in lines[2]
    assert lines[3].startswith("    └ dddddddd") and "Deeper (x)" in lines[3]
    assert (
        lines[4].startswith("  └ c2000000")
        and "Check it" in lines[4]
        and "(" not in lines[4].split("Check it")[1][:2]
    )
    assert len({line.index("msgs") for line in lines}) == 1, f"columns aligned:\n{out.decode()}"


def test_sessions_delete_takes_the_children_and_their_checkpoints(home: Path, tmp_path: Path) -> None:
    anyio.run(_tree, home / "crow.db", str(tmp_path))
    for sid in (P, C1, G, Q):
        (home / "checkpoints" / sid).mkdir(parents=True)
        (home / "checkpoints" / sid / "turn.json").write_text("{}")
    done = _cli(crow_env(None, home), "sessions", "delete", P[:8])
    assert done.returncode == 0 and done.stderr.endswith(f"\ndeleted {P} and 3 subagent sessions\n"), (
        done.stderr
    )
    assert sorted(os.listdir(home / "checkpoints")) == [Q]
    assert [
        line.split("\t")[0] for line in _cli(crow_env(None, home), "sessions", "list").stdout.splitlines()
    ] == [Q]


async def _parent_and_child(conn: Any, llm: ScriptedLLM, home: Path, workspace: Path) -> tuple[str, str]:
    """A session whose turn ran one `task`: (its id, its child's), the child loaded."""
    llm.rule(lambda r: "CHILD" in r.last_user_text, Reply(text="the child found 42"), times=1)
    llm.push(
        Reply(tool_calls=[ToolCallSpec("task", {"description": "Find it", "prompt": "CHILD: find it"})]),
        Reply(text="parent done"),
    )
    await initialize_125(conn)
    sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
    assert (await conn.prompt(session_id=sid, prompt=[acp.text_block("delegate")])).stop_reason == "end_turn"
    with sqlite3.connect(home / "crow.db") as db:
        [(child,)] = db.execute("SELECT id FROM sessions WHERE parent_id = ?", (sid,)).fetchall()
    await conn.load_session(cwd=str(workspace), session_id=child, mcp_servers=[])
    return sid, child


async def test_acp_lists_only_top_level_sessions_and_a_parents_delete_takes_its_child(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    async with spawn_crow(crow_env(llm, home, CROW_MODE="yolo")) as (conn, _proc, _client):
        sid, child = await _parent_and_child(conn, llm, home, workspace)
        assert [s.session_id for s in (await conn.list_sessions()).sessions] == [sid]
        # the child was loadable by its id, and may go on as a session of its own
        llm.push(
            Reply(tool_calls=[ToolCallSpec("write_file", {"path": "found.txt", "content": "42\n"})]),
            Reply(text="written"),
        )
        await conn.prompt(session_id=child, prompt=[acp.text_block("write it down")])
        assert (workspace / "found.txt").read_text() == "42\n"
        assert (home / "checkpoints" / child).is_dir(), "the child's own turn was checkpointed"
        assert await raw_request(conn, "session/delete", {"sessionId": sid}) == {}
        assert not (home / "checkpoints" / child).exists()
        with sqlite3.connect(home / "crow.db") as db:
            assert db.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0
        with pytest.raises(acp.RequestError) as gone:
            await conn.prompt(session_id=child, prompt=[acp.text_block("still there?")])
        assert gone.value.code == -32002
        assert (await conn.list_sessions()).sessions == []


async def test_deleting_a_parent_cancels_a_turn_running_in_its_loaded_child_first(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    import asyncio

    from tests.test_e2e_cancel_request import SLOW, until_text

    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid, child = await _parent_and_child(conn, llm, home, workspace)
        llm.push(SLOW)
        replayed = len(client.text(child))  # the load replayed the child's answer
        turn = asyncio.create_task(conn.prompt(session_id=child, prompt=[acp.text_block("go on")]))
        await until_text(client, child, after=replayed)  # the turn runs: it streams SLOW's words
        assert await raw_request(conn, "session/delete", {"sessionId": sid}) == {}
        assert turn.done(), "the child's turn settled before the delete was answered"
        assert (await turn).stop_reason == "cancelled"
        with sqlite3.connect(home / "crow.db") as db:
            assert db.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0
        other = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        assert (await conn.prompt(session_id=other, prompt=[acp.text_block("hi")])).stop_reason == "end_turn"


def test_sessions_list_keeps_a_long_titled_subagents_agent_name(home: Path, tmp_path: Path) -> None:
    """The title is cut to its column, the agent's name after it stays: it was cut away."""
    from tests.support.on_pty import stdout_on_pty

    async def tree() -> None:
        async with SQLiteStore(home / "crow.db") as s:
            await s.create_session(id=P, cwd=str(tmp_path), title="parent")
            long = "Review every caller of paginate() and the tests around it"
            await s.create_session(id=C1, cwd=str(tmp_path), title=long, parent_id=P, config={"agent": "reviewer"})

    anyio.run(tree)
    status, out = stdout_on_pty([sys.executable, "-m", "crow", "sessions", "list"], env=crow_env(None, home))
    assert status == 0
    child = out.decode().replace("\r\n", "\n").splitlines()[1]
    assert "Review every caller" in child and "… (reviewer)" in child, child
