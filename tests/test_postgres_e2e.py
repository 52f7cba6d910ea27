"""End to end on a PostgreSQL store (CROW_STORE): real crow processes driven by the ACP
Python client over stdio, a real PostgreSQL server (tests/support/postgres.py), the
scripted model server. Two crow processes share one database (each lists and replays the
other's sessions; one session runs turns in one process at a time), the database restarted
mid-turn, the database unreachable at start, a SQLite store migrated and replayed."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import acp
import pytest

from tests.conftest import RecordingClient, crow_env, spawn_crow
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec
from tests.test_e2e_sessions import open_session
from tests.test_store_postgres import crow_cli

pytestmark = pytest.mark.anyio


def pg_env(llm: ScriptedLLM, home: Path, url: str, **extra: str) -> dict[str, str]:
    return crow_env(llm, home, CROW_STORE=url, **extra)


async def until(check: Any, timeout: float = 60) -> None:
    """Wait for `check()` to hold (an event the test waits on), failing after `timeout`."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "the awaited event never came"
        await asyncio.sleep(0.01)


async def replay(conn: Any, client: RecordingClient, session_id: str, cwd: Path) -> list[Any]:
    """What `session/load` of `session_id` sends, as plain data."""
    client.updates.clear()
    await conn.load_session(cwd=str(cwd), session_id=session_id, mcp_servers=[])
    return [(sid, u.model_dump(mode="json")) for sid, u in client.updates]


def homes(tmp_path: Path, *names: str) -> list[Path]:
    """A CROW_HOME per process: what they share is the database alone."""
    out = []
    for name in names:
        (tmp_path / name).mkdir()
        out.append(tmp_path / name)
    return out


@dataclass
class Crow:
    home: Path
    conn: Any
    client: RecordingClient
    turn: asyncio.Task[Any] | None = None  # crow one's: its second turn, running


class TwoCrows(tuple[Crow, Crow]):
    sid: str


@asynccontextmanager
async def one_session_in_two_crows(
    llm: ScriptedLLM, pg_url: str, tmp_path: Path, workspace: Path, slow_answer: str
) -> AsyncIterator[TwoCrows]:
    """Two crow processes on one database: one made a session with a turn ("hello", "first")
    and two loaded it; one's second turn ("long one", answered with `slow_answer` slowly) is
    running and has streamed (one holds the session's lock)."""
    homes_ = homes(tmp_path, "one", "two")
    llm.push(Reply(text="first"))
    async with spawn_crow(pg_env(llm, homes_[0], pg_url)) as (conn, _proc, client):
        sid = await open_session(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("hello")])
        async with spawn_crow(pg_env(llm, homes_[1], pg_url)) as (conn2, _proc2, client2):
            await conn2.initialize(protocol_version=1)
            await conn2.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
            llm.push(Reply(text=slow_answer, chunk_delay=0.01))
            client.updates.clear()
            turn = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("long one")]))
            await until(lambda: client.of_type("AgentMessageChunk"))
            crows = TwoCrows((Crow(homes_[0], conn, client, turn), Crow(homes_[1], conn2, client2)))
            crows.sid = sid
            try:
                yield crows
            finally:
                if not turn.done():
                    turn.cancel()


async def test_a_session_written_by_one_process_is_listed_and_replayed_by_another(
    llm: ScriptedLLM, pg_url: str, tmp_path: Path, workspace: Path
) -> None:
    (workspace / "a.txt").write_text("alpha\n")
    one, two, three = homes(tmp_path, "one", "two", "three")
    llm.push(
        Reply(tool_calls=[ToolCallSpec(name="read_file", arguments={"path": "a.txt"})], reasoning="look"),
        Reply(text="It says alpha."),
    )
    async with spawn_crow(pg_env(llm, one, pg_url)) as (conn, _proc, _client):
        sid = await open_session(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("what is in a.txt?")])
        # The writer still runs: another process sees the session and its whole turn.
        async with spawn_crow(pg_env(llm, two, pg_url)) as (conn2, _proc2, client2):
            await conn2.initialize(protocol_version=1)
            listed = await conn2.list_sessions(cwd=str(workspace))
            assert [s.session_id for s in listed.sessions] == [sid]
            seen_by_two = await replay(conn2, client2, sid, workspace)
    assert any(u["session_update"] == "tool_call" and u["status"] == "completed" for _, u in seen_by_two)
    assert [u["content"]["text"] for _, u in seen_by_two if u["session_update"] == "agent_message_chunk"] == [
        "It says alpha."
    ]
    llm.push(Reply(text="Still alpha."))
    async with spawn_crow(pg_env(llm, three, pg_url)) as (conn3, _proc3, client3):
        await conn3.initialize(protocol_version=1)
        assert await replay(conn3, client3, sid, workspace) == seen_by_two
        response = await conn3.prompt(session_id=sid, prompt=[acp.text_block("and now?")])
    assert response.stop_reason == "end_turn"
    sent = [m["role"] for m in llm.requests[-1].messages if m["role"] != "system"]
    assert sent == ["user", "assistant", "tool", "assistant", "user"], "the third process had the history"


async def test_two_processes_racing_one_session_one_is_told_busy(
    llm: ScriptedLLM, pg_url: str, tmp_path: Path, workspace: Path
) -> None:
    async with one_session_in_two_crows(llm, pg_url, tmp_path, workspace, "slow " * 400) as crows:
        one, two = crows
        with pytest.raises(acp.RequestError) as busy:
            await two.conn.prompt(session_id=crows.sid, prompt=[acp.text_block("me too")])
        holder = f"busy: session {crows.sid} is running a turn in another crow process (pid {_pid(one.home)} on "
        assert str(busy.value).startswith(holder), busy.value
        assert (await one.turn).stop_reason == "end_turn"
        llm.push(Reply(text="my turn now"))
        response = await two.conn.prompt(session_id=crows.sid, prompt=[acp.text_block("me now")])
        assert response.stop_reason == "end_turn"
    sent = [m["content"] for m in llm.requests[-1].messages if m["role"] == "user"]
    assert sent == ["hello", "long one", "me now"], "two reloaded what one wrote before its turn"


def _pid(home: Path) -> int:
    """The pid of the crow process serving with CROW_HOME=`home` (from /proc)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if f"CROW_HOME={home}\0".encode() in environ and b"crow" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return int(pid)
    raise AssertionError(f"no crow process with CROW_HOME={home}")


async def test_a_session_used_in_turn_by_two_processes_keeps_each_ones_mode_and_reads_the_others_turns(
    llm: ScriptedLLM, pg_url: str, tmp_path: Path, workspace: Path
) -> None:
    """Another client's `yolo` never carries over: before a turn, a process reloads what
    another wrote (the transcript, todos, title), never the mode its own client chose."""
    one, two = homes(tmp_path, "one", "two")
    llm.push(Reply(text="first"), Reply(text="second"))
    async with spawn_crow(pg_env(llm, one, pg_url)) as (conn, _proc, client):
        sid = await open_session(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("hello")])
        async with spawn_crow(pg_env(llm, two, pg_url)) as (conn2, _proc2, _client2):
            await conn2.initialize(protocol_version=1)
            await conn2.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
            await conn2.set_session_mode(session_id=sid, mode_id="yolo")
            await conn2.prompt(session_id=sid, prompt=[acp.text_block("from the other editor")])
        llm.push(
            Reply(tool_calls=[ToolCallSpec(name="write_file", arguments={"path": "b.txt", "content": "b"})]),
            Reply(text="wrote"),
        )
        client.permission_answer = "reject_once"
        await conn.prompt(session_id=sid, prompt=[acp.text_block("write b")])
    assert len(client.permission_requests) == 1  # still "ask" here: the write was asked for
    assert not (workspace / "b.txt").exists()
    assert "from the other editor" in str(llm.requests[2].body)  # the other's turn, reloaded
    async with spawn_crow(pg_env(llm, one, pg_url)) as (conn, _proc, _client):
        await conn.initialize(protocol_version=1)
        loaded = await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
    assert loaded.modes.current_mode_id == "yolo"  # loaded again: the mode last set, by anyone


async def test_execute_does_not_show_the_store_url(
    llm: ScriptedLLM, postgres: Any, pg_url: str, home: Path, workspace: Path
) -> None:
    # A password in the URL (trust authentication ignores it): CROW_STORE is a secret.
    url = pg_url.replace("postgresql://postgres@", "postgresql://postgres:hunter2-pg@")
    llm.push(Reply(tool_calls=[ToolCallSpec(name="execute", arguments={"command": "env"})]), Reply(text="ok"))
    async with spawn_crow(pg_env(llm, home, url, CROW_MODE="yolo")) as (conn, _proc, _client):
        sid = await open_session(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("env")])
    [shown] = [m["content"] for m in llm.requests[1].messages if m["role"] == "tool"]
    assert "PATH=" in shown and "CROW_HOME=" in shown
    assert "hunter2-pg" not in shown and "CROW_STORE" not in shown


async def test_an_unreachable_database_at_start_is_a_clear_error(
    llm: ScriptedLLM, home: Path, workspace: Path, tmp_path: Path
) -> None:
    url = f"postgresql://crow:s3cret-pw@/crow?host={tmp_path / 'nowhere'}&port=5"
    async with spawn_crow(pg_env(llm, home, url)) as (conn, proc, _client):
        sid = await open_session(conn, workspace)  # not stored yet
        with pytest.raises(acp.RequestError) as failed:  # the first request that needs the store
            await conn.prompt(session_id=sid, prompt=[acp.text_block("hello")])
        said = str(failed.value)
        assert f"cannot reach the PostgreSQL store at {tmp_path / 'nowhere'}:5/crow" in said
        assert "s3cret-pw" not in said
        assert proc.returncode is None, "crow keeps serving"
    env = pg_env(llm, home, url)
    listed = await asyncio.to_thread(crow_cli, env, "sessions", "list")
    assert listed.returncode == 2
    assert listed.stderr.startswith(
        f"crow: cannot reach the PostgreSQL store at {tmp_path / 'nowhere'}:5/crow: "
    )
    assert "s3cret-pw" not in listed.stderr and "Traceback" not in listed.stderr


async def test_a_crow_started_while_the_database_is_down_recovers_once_it_is_back(
    llm: ScriptedLLM, postgres: Any, pg_url: str, home: Path, workspace: Path
) -> None:
    postgres.stop("fast")
    try:
        async with spawn_crow(pg_env(llm, home, pg_url)) as (conn, proc, _client):
            sid = await open_session(conn, workspace)
            with pytest.raises(acp.RequestError, match="cannot reach the PostgreSQL store"):
                await conn.prompt(session_id=sid, prompt=[acp.text_block("hello")])
            postgres.start()
            llm.push(Reply(text="back"))
            again = await open_session(conn, workspace)  # no restart of crow needed
            reply = await conn.prompt(session_id=again, prompt=[acp.text_block("hello again")])
            assert reply.stop_reason == "end_turn"
            assert proc.returncode is None
    finally:
        postgres.start()
    assert postgres.psql(f"SELECT count(*) FROM entries WHERE session_id = '{again}'", pg_url.split("@/")[1].split("?")[0]).strip() == "2"


async def test_the_database_restarted_mid_turn_fails_that_turn_and_crow_carries_on(
    llm: ScriptedLLM, postgres: Any, pg_url: str, home: Path, workspace: Path, tmp_path: Path
) -> None:
    llm.push(Reply(text="first answer"))
    async with spawn_crow(pg_env(llm, home, pg_url)) as (conn, proc, client):
        sid = await open_session(conn, workspace)
        assert (await conn.prompt(session_id=sid, prompt=[acp.text_block("one")])).stop_reason == "end_turn"
        llm.push(Reply(text="slow " * 300, chunk_delay=0.01))
        client.updates.clear()
        turn = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("two")]))
        await until(lambda: client.of_type("AgentMessageChunk"))  # "two" is stored: acknowledged
        postgres.stop("fast")
        try:
            with pytest.raises(acp.RequestError) as failed:  # the turn's reply cannot be stored
                await asyncio.wait_for(turn, 120)
        finally:
            postgres.start()
        where = pg_url.split("?host=")[1].replace("&port=", ":")
        db = pg_url.split("@/")[1].split("?")[0]
        assert str(failed.value).startswith(
            f"cannot reach the PostgreSQL store at {where}/{db}: no connection within 5 s: connection"
        )  # and libpq's reason (the socket is gone)
        assert proc.returncode is None, "crow keeps serving"
        llm.push(Reply(text="third answer"))
        after = await conn.prompt(session_id=sid, prompt=[acp.text_block("three")])
        assert after.stop_reason == "end_turn"
    said = [(m["role"], m["content"]) for m in llm.requests[-1].messages if m["role"] != "system"]
    assert said == [("user", "one"), ("assistant", "first answer"), ("user", "two"), ("user", "three")]
    other = tmp_path / "other"
    other.mkdir()
    async with spawn_crow(pg_env(llm, other, pg_url)) as (conn2, _proc2, client2):
        await conn2.initialize(protocol_version=1)
        replayed = await replay(conn2, client2, sid, workspace)
    texts = [(u["session_update"], u["content"]["text"]) for _, u in replayed if "content" in u]
    assert texts == [
        ("user_message_chunk", "one"),
        ("agent_message_chunk", "first answer"),
        ("user_message_chunk", "two"),  # acknowledged before the database went: kept
        ("user_message_chunk", "three"),
        ("agent_message_chunk", "third answer"),
    ]


@pytest.mark.slow
async def test_a_database_that_stops_answering_mid_turn_fails_that_turn_in_time_and_crow_carries_on(
    llm: ScriptedLLM, postgres: Any, pg_url: str, home: Path, workspace: Path
) -> None:
    """A hung database (or a network cut on the way to it) sends no error: without a bound
    the turn would wait forever, its session with it."""
    async with spawn_crow(pg_env(llm, home, pg_url)) as (conn, proc, client):
        sid = await open_session(conn, workspace)
        llm.push(Reply(text="slow " * 100, chunk_delay=0.01))
        turn = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("one")]))
        await until(lambda: client.of_type("AgentMessageChunk"))  # "one" is stored: acknowledged
        with postgres.frozen():
            started = asyncio.get_running_loop().time()
            with pytest.raises(acp.RequestError, match=r"cannot reach the PostgreSQL store at .*: no answer within 30 s"):
                await asyncio.wait_for(turn, 90)
            assert asyncio.get_running_loop().time() - started < 45
        assert proc.returncode is None, "crow keeps serving"
        llm.push(Reply(text="answered"))
        after = await conn.prompt(session_id=sid, prompt=[acp.text_block("two")])
        assert after.stop_reason == "end_turn"
    said = [(m["role"], m["content"]) for m in llm.requests[-1].messages if m["role"] != "system"]
    assert said == [("user", "one"), ("user", "two")]  # the answer that found no store is not in it


PNG64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


async def _sqlite_home_with_every_kind_of_session(llm: ScriptedLLM, home: Path, workspace: Path) -> list[str]:
    """Sessions made by crow itself on the SQLite store: one with an image and a tool call,
    a rewound one, a compacted one, a parent with its subagent's child; their ids."""
    from tests.test_e2e_subagents import is_child, task

    (workspace / "a.txt").write_text("alpha\n")
    llm.rule(is_child, Reply(text="the child found 42"), times=1)
    llm.push(
        Reply(tool_calls=[ToolCallSpec(name="read_file", arguments={"path": "a.txt"})], reasoning="hmm"),
        Reply(text="an image and alpha"),
        *(Reply(text=f"b{i}") for i in range(2)),
        *(Reply(text=f"c{i}") for i in range(4)),
        Reply(text="summary of c0-c3"),
        Reply(tool_calls=[task("t1", "CHILD: find it", "Find it")]),
        Reply(text="parent done"),
    )
    ids = []
    async with spawn_crow(crow_env(llm, home, CROW_MODE="yolo")) as (conn, _proc, _client):
        await conn.initialize(protocol_version=1)

        async def ask(*prompts: list[Any]) -> str:
            sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            for prompt in prompts:
                assert (await conn.prompt(session_id=sid, prompt=prompt)).stop_reason == "end_turn"
            ids.append(sid)
            return sid

        await ask([acp.text_block("look at this and a.txt"), acp.image_block(PNG64, "image/png")])
        rewound = await ask([acp.text_block("b0")], [acp.text_block("b1")])
        await ask(*([acp.text_block(f"c{i}")] for i in range(4)), [acp.text_block("/compact")])
        await ask([acp.text_block("delegate")])
    undo = await asyncio.to_thread(
        subprocess.run, [*CROW, "sessions", "rewind", rewound, "1"], env=crow_env(None, home),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert undo.returncode == 0, undo.stderr
    return ids


CROW = [sys.executable, "-m", "crow"]


async def test_a_migrated_sqlite_store_replays_the_same_from_postgresql(
    llm: ScriptedLLM, pg_url: str, home: Path, workspace: Path, tmp_path: Path
) -> None:
    from crow.store import SQLiteStore
    from crow.store.postgres import PostgresStore

    ids = await _sqlite_home_with_every_kind_of_session(llm, home, workspace)
    async with SQLiteStore(home / "crow.db") as lite:
        children = [r.id for r in await lite.descendants(ids)]
        assert len(children) == 1, "the subagent's session is under its parent"
        every = [*ids, *children]
        kept = {sid: (await lite.get_session(sid), await lite.load_both(sid)) for sid in every}
    compacted = kept[ids[2]][1]
    assert any("summary of c0-c3" in m.content for m in compacted[0]), "the third one is compacted"
    assert not any("summary of c0-c3" in m.content for m in compacted[1] if m.role != "system")

    def migrate(*to: str) -> subprocess.CompletedProcess[str]:
        env = crow_env(None, home) if to else crow_env(None, home, CROW_STORE=pg_url)  # without --to: CROW_STORE
        return subprocess.run(
            [*CROW, "sessions", "migrate", *to], env=env, capture_output=True, text=True, timeout=120
        )  # fmt: skip

    first = await asyncio.to_thread(migrate, "--to", pg_url)
    assert first.returncode == 0
    assert first.stderr.startswith(f"copied {len(every)} sessions to "), first.stderr
    again = await asyncio.to_thread(migrate)
    assert again.returncode == 0
    skipped = sorted(line.split()[1].rstrip(":") for line in again.stderr.splitlines()[:-1])
    assert skipped == sorted(every) and again.stderr.splitlines()[-1].startswith("copied 0 sessions to ")

    async with PostgresStore(pg_url) as pg:  # the same records, context and history
        for sid in every:
            record, (context, transcript) = kept[sid]
            assert await pg.get_session(sid) == record
            assert await pg.load_both(sid) == (context, transcript)
        async with SQLiteStore(home / "crow.db") as lite:
            for sid in every:
                for seq in range(len(kept[sid][1][1])):
                    assert await pg.context_at(sid, seq) == await lite.context_at(sid, seq), (sid, seq)

    replays = {}
    for name, env in (
        ("sqlite", crow_env(llm, home)),
        ("postgres", pg_env(llm, tmp_path / "pg-home", pg_url)),
    ):
        async with spawn_crow(env) as (conn, _proc, client):
            await conn.initialize(protocol_version=1)
            replays[name] = [await replay(conn, client, sid, workspace) for sid in every]
    assert replays["postgres"] == replays["sqlite"]
    assert all(replays["sqlite"]), "every session replays something"


async def test_migrate_refuses_a_password_in_argv_and_copies_nothing(pg_url: str, home: Path) -> None:
    """argv is any local user's to read (ps, /proc/PID/cmdline) for as long as the copy runs:
    a password belongs in CROW_STORE, PGPASSWORD or ~/.pgpass."""
    from crow.store import SQLiteStore
    from crow.store.postgres import PostgresStore

    async with SQLiteStore(home / "crow.db") as lite:
        await lite.create_session(id="a" * 32, cwd="/w", title="kept here")
    with_password = pg_url.replace("//postgres@", "//postgres:hunter2-secret@", 1)
    assert with_password != pg_url
    for to in (with_password, f"{pg_url}&password=hunter2-secret", f"{pg_url}&sslpassword=hunter2-secret"):
        done = await asyncio.to_thread(crow_cli, crow_env(None, home), "sessions", "migrate", "--to", to)
        assert done.returncode == 2, done.stderr
        assert "--to holds a password" in done.stderr and "CROW_STORE" in done.stderr
        assert "hunter2" not in done.stderr + done.stdout
    async with PostgresStore(pg_url) as pg:
        assert await pg.get_session("a" * 32) is None
    nowhere = await asyncio.to_thread(crow_cli, crow_env(None, home), "sessions", "migrate")
    assert nowhere.returncode == 2 and "--to postgresql://… or CROW_STORE" in nowhere.stderr
    elsewhere = crow_env(None, home, CROW_STORE=pg_url)  # a URL without --to is not CROW_STORE's
    stray = await asyncio.to_thread(crow_cli, elsewhere, "sessions", "migrate", "postgresql://u@/other")
    assert stray.returncode == 2 and "takes no SESSION_ID" in stray.stderr, stray.stderr
    async with PostgresStore(pg_url) as pg:
        assert await pg.get_session("a" * 32) is None
