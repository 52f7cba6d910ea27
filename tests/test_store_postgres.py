"""What only the PostgreSQL store has: its schema version and creation race, advisory
session locks (freed by PostgreSQL when a process dies, taken again after the lock
connection drops), the side records, errors without the password, the database going away
and coming back, and `crow sessions` on it. The Store contract itself runs on both backends
in tests/test_store.py and tests/test_store_lock.py (`new_store`)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from crow.errors import SessionBusy, StoreError
from crow.messages import ai, human
from crow.store import SQLiteStore
from crow.store._pg_schema import PG_SCHEMA_VERSION
from crow.store.base import SideRecords
from crow.store.postgres import PostgresStore
from tests.conftest import crow_env

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def sql(url: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


async def test_a_newer_schema_is_refused(pg_url: str) -> None:
    async with PostgresStore(pg_url):
        pass
    sql(pg_url, "UPDATE crow_schema SET version = %s", (PG_SCHEMA_VERSION + 1,))
    with pytest.raises(
        StoreError, match=f"has schema version {PG_SCHEMA_VERSION + 1}; this crow knows up to"
    ):
        await PostgresStore(pg_url).open()


async def test_stores_opening_an_empty_database_at_once_create_it_once(pg_url: str) -> None:
    stores = [PostgresStore(pg_url) for _ in range(4)]
    try:
        await asyncio.gather(*(s.open() for s in stores))  # four connections racing to create
        await stores[0].create_session(id="s", cwd="/w")
        assert await stores[3].get_session("s") is not None
    finally:
        for s in stores:
            await s.aclose()
    assert sql(pg_url, "SELECT version FROM crow_schema") == [(PG_SCHEMA_VERSION,)]


async def test_a_lock_of_a_process_that_died_is_freed_and_the_taker_reloads(pg_url: str) -> None:
    async with PostgresStore(pg_url) as store:
        await store.create_session(id="s", cwd="/w")
        await store.load_context("s")
    child = textwrap.dedent(f"""
        import asyncio, os, signal
        from crow.messages import human
        from crow.store.postgres import PostgresStore

        async def main():
            store = await PostgresStore({pg_url!r}).open()
            await store.lock_session("s")
            await store.append("s", [human("half a turn")])
            os.kill(os.getpid(), signal.SIGKILL)

        asyncio.run(main())
    """)
    async with PostgresStore(pg_url) as store:
        await store.load_context("s")
        proc = await anyio.run_process([sys.executable, "-c", child], check=False)
        assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
        # PostgreSQL drops the dead process's connection and its advisory lock with it (once
        # its backend has seen the socket close).
        for _ in range(3000):
            if sql(pg_url, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == [(0,)]:
                break
            await asyncio.sleep(0.01)
        assert await store.lock_session("s") is True, "it wrote since this store read: reload"
        assert [m.content for m in await store.load_context("s")] == ["half a turn"]


async def test_the_lock_connection_dropping_mid_turn_is_reconnected_and_the_lock_held_again(
    pg_url: str,
) -> None:
    async with PostgresStore(pg_url) as a, PostgresStore(pg_url) as b:
        a._locks.keep_every = 0.02
        await a.create_session(id="s", cwd="/w")
        await a.lock_session("s")
        dropped = a._locks.conn.info.backend_pid  # type: ignore[union-attr]
        sql(pg_url, "SELECT pg_terminate_backend(%s, 30000)", (dropped,))  # gone, its locks too
        for _ in range(3000):  # the keeper notices and reconnects
            if a._locks.conn is not None and a._locks.conn.info.backend_pid != dropped:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(SessionBusy, match=r"\(pid \d+ on "):
            await b.lock_session("s")
        await a.append("s", [human("still a's turn")])
        await a.unlock_session("s")
        assert await b.lock_session("s") is True


async def test_a_session_taken_while_the_lock_connection_was_down_is_logged_and_reloaded(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with PostgresStore(pg_url) as a, PostgresStore(pg_url) as b:
        await a.create_session(id="s", cwd="/w")
        await a.create_session(id="t", cwd="/w")
        await a.lock_session("s")
        sql(pg_url, "SELECT pg_terminate_backend(%s, 30000)", (a._locks.conn.info.backend_pid,))  # type: ignore[union-attr]
        assert await b.lock_session("s") is True  # before a noticed: b runs a turn there
        with caplog.at_level(logging.WARNING, logger="crow.store"):
            await a.lock_session("t")  # a reconnects, and cannot take s again: b has it
        said = [r.getMessage() for r in caplog.records]
        assert any(
            m.startswith("session s: its lock went with the connection") and "holds it" in m for m in said
        )
        await a.unlock_session("s")  # a's turn there ends: b's lock stays
        with pytest.raises(SessionBusy):
            await a.lock_session("s")
        await b.append("s", [human("b's")])
        await b.unlock_session("s")
        assert await a.lock_session("s") is True, "b wrote: a reloads"


async def test_a_lock_whose_caller_is_cancelled_is_not_left_held(pg_url: str) -> None:
    async with PostgresStore(pg_url) as a, PostgresStore(pg_url) as b:
        await a.create_session(id="s", cwd="/w")
        with anyio.move_on_after(0):
            await a.lock_session("s")
        await a.get_session("s")  # after every call whose caller went away
        await b.lock_session("s")  # not SessionBusy
        await b.unlock_session("s")


async def test_side_records(pg_url: str, tmp_path: Path) -> None:
    async with PostgresStore(pg_url) as store, SQLiteStore(tmp_path / "crow.db") as lite:
        assert isinstance(store, SideRecords) and not isinstance(lite, SideRecords)
        assert await store.project_rules("/p") == []
        await store.add_project_rules("/p", ["execute(git *)", "read_file", "execute(git *)"])
        await store.add_project_rules("/p", ["write_file", "read_file"])
        await store.add_project_rules("/q", ["read_file"])
        assert await store.project_rules("/p") == ["execute(git *)", "read_file", "write_file"]
        assert await store.project_rules("/q") == ["read_file"]

        assert await store.load_checkpoint("s", "t1") is None
        for turn in ("t2", "t1", "t3"):
            await store.save_checkpoint("s", turn, f'{{"turn": "{turn}"}}')
        await store.save_checkpoint("s", "t2", '{"turn": "t2", "again": true}')  # replaced in place
        assert await store.checkpoint_turns("s") == ["t2", "t1", "t3"]
        assert await store.load_checkpoint("s", "t2") == '{"turn": "t2", "again": true}'
        await store.copy_checkpoints("s", "fork")
        await store.forget_checkpoints("s", ["t1"])
        assert await store.checkpoint_turns("s") == ["t2", "t3"]
        assert await store.checkpoint_turns("fork") == ["t2", "t1", "t3"]
        await store.forget_checkpoints("s")
        assert await store.checkpoint_turns("s") == [] and await store.load_checkpoint("s", "t3") is None
        assert await store.load_checkpoint("fork", "t1") == '{"turn": "t1"}'


async def test_no_error_shows_the_password(postgres: Any, pg_url: str, tmp_path: Path) -> None:
    away = f"postgresql://crow:pa55-w0rd@/crow?host={tmp_path}&port=5"
    with pytest.raises(StoreError) as unreachable:
        await PostgresStore(away).open()
    assert str(unreachable.value).startswith(f"cannot reach the PostgreSQL store at {tmp_path}:5/crow: ")
    no_such_db = (
        pg_url.replace("postgres@/", "postgres:pa55-w0rd@/").split("?")[0] + "_nope?" + pg_url.split("?")[1]
    )
    with pytest.raises(StoreError) as missing:
        await PostgresStore(no_such_db).open()
    assert "does not exist" in str(missing.value)
    for exc in (unreachable.value, missing.value):
        assert "pa55-w0rd" not in str(exc) and "pa55-w0rd" not in repr(exc)


async def test_the_database_going_away_fails_calls_and_its_return_heals_them(
    postgres: Any, pg_url: str
) -> None:
    store = PostgresStore(pg_url)
    store.wait = 0.5  # what a call waits for a connection: read when the store opens
    async with store:
        await store.create_session(id="s", cwd="/w")
        await store.append("s", [human("before")])
        postgres.stop("fast")
        try:
            with pytest.raises(StoreError, match=r"cannot reach the PostgreSQL store at .*: "):
                await store.append("s", [ai("while it was down")])
            with pytest.raises(StoreError, match="cannot reach"):
                await store.lock_session("s")
        finally:
            postgres.start()
        await store.append("s", [ai("after")])  # stale pooled connections were replaced
        assert await store.lock_session("s") is False
        await store.unlock_session("s")
        assert [m.content for m in await store.load_transcript("s")] == ["before", "after"]


@pytest.mark.slow
async def test_after_a_long_outage_the_first_call_once_the_database_is_back_succeeds(
    postgres: Any, pg_url: str
) -> None:
    """The pool retried a lost server with a doubling delay (1, 2, 4, 8, 16 s ...): after a
    40 s outage its next attempt came ~22 s after the server was back, so calls made then
    failed after its 5 s wait, and crow did not recover when the database did."""
    async with PostgresStore(pg_url) as store:
        await store.create_session(id="s", cwd="/w")
        postgres.stop("fast")
        try:
            deadline = asyncio.get_running_loop().time() + 40
            while asyncio.get_running_loop().time() < deadline:  # calls fail all along
                with pytest.raises(StoreError, match="cannot reach"):
                    await store.get_session("s")
        finally:
            postgres.start()
        assert (await store.get_session("s")) is not None


def crow_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crow", *args], env=env, capture_output=True, text=True, timeout=60
    )


async def test_crow_sessions_works_on_the_postgresql_store(pg_url: str, home: Path, tmp_path: Path) -> None:
    async with PostgresStore(pg_url) as store:
        await store.create_session(id="abc" + "0" * 29, cwd="/w", title="parent one")
        await store.create_session(
            id="abd" + "0" * 29, cwd="/w", title="the child", parent_id="abc" + "0" * 29
        )
        await store.append("abc" + "0" * 29, [human("hello"), ai("hi there")])
    by_env = crow_env(None, home, CROW_STORE=pg_url)
    (home / "config.yaml").write_text(f"store: {pg_url}\n")  # the config file's setting works too
    by_file = crow_env(None, home)
    for env in (by_env, by_file):
        listed = await asyncio.to_thread(crow_cli, env, "sessions", "list")
        assert listed.returncode == 0, listed.stderr
        rows = [line.split("\t") for line in listed.stdout.splitlines()]
        assert [(r[0], r[4], r[5]) for r in rows] == [
            ("abc" + "0" * 29, "parent one", ""),
            ("abd" + "0" * 29, "the child", "abc" + "0" * 29),
        ]
    shown = await asyncio.to_thread(crow_cli, by_env, "sessions", "show", "abc")
    assert shown.returncode == 0 and "hello" in shown.stdout and "hi there" in shown.stdout
    exported = await asyncio.to_thread(crow_cli, by_env, "sessions", "export", "abc")
    assert '"hi there"' in exported.stdout
    deleted = await asyncio.to_thread(crow_cli, by_env, "sessions", "delete", "abc")
    assert deleted.returncode == 0 and deleted.stderr == f"deleted abc{'0' * 29} and 1 subagent session\n"
    assert sql(pg_url, "SELECT count(*) FROM sessions") == [(0,)]
    assert not (home / "crow.db").exists(), "the SQLite file was never opened"


async def test_listing_the_sqlite_store_does_not_load_the_config_model(home: Path) -> None:
    probe = "import sys, runpy; sys.argv = ['crow', 'sessions', 'list']\n"
    probe += "try:\n    runpy.run_module('crow', run_name='__main__')\nexcept SystemExit:\n    pass\n"
    probe += "print('crow.config' in sys.modules, 'psycopg' in sys.modules, file=sys.stderr)"
    (home / "config.yaml").write_text("model: openai:x\n")
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", probe],
        env=crow_env(None, home),
        capture_output=True,
        text=True,
    )
    assert done.stderr.strip().splitlines()[-1] == "False False", done.stderr
    os.remove(home / "config.yaml")


async def test_migrate_skips_a_session_running_a_turn_and_the_ones_under_it(
    pg_url: str, tmp_path: Path
) -> None:
    from crow.store.migrate import migrate

    db = tmp_path / "crow.db"
    async with SQLiteStore(db) as lite:
        await lite.create_session(id="busy", cwd="/w")
        await lite.create_session(id="child", cwd="/w", parent_id="busy")
        await lite.create_session(id="idle", cwd="/w")
        await lite.append("idle", [human("q"), ai("a")])
        await lite.lock_session("busy")  # a turn runs there in another crow process
        said: list[str] = []
        async with PostgresStore(pg_url) as pg:
            assert await migrate(str(db), None, pg, said.append) == 1
            assert said == [
                f"skipped busy: busy: session busy is running a turn in another crow process (pid {os.getpid()});"
                " try again when it ends",
                "skipped child: its parent session busy was skipped",
            ]
            assert [m.content for m in await pg.load_transcript("idle")] == ["q", "a"]
            await lite.unlock_session("busy")
            said.clear()
            assert await migrate(str(db), None, pg, said.append) == 2
            assert said == ["skipped idle: already in the database"]
            assert [r.id for r in await pg.descendants(["busy"])] == ["child"]


async def test_migrate_names_a_session_that_grew_since_it_was_copied(pg_url: str, tmp_path: Path) -> None:
    """A session used on in SQLite after a first copy is not silently left behind: the
    second run says what it does not copy."""
    from crow.store.migrate import migrate

    db = tmp_path / "crow.db"
    async with SQLiteStore(db) as lite, PostgresStore(pg_url) as pg:
        await lite.create_session(id="grew", cwd="/w")
        await lite.append("grew", [human("q1"), ai("a1")])
        assert await migrate(str(db), None, pg, print) == 1
        await lite.append("grew", [human("q2"), ai("a2"), human("q3")])
        said: list[str] = []
        assert await migrate(str(db), None, pg, said.append) == 0
        assert said == [
            "skipped grew: already in the database, with 2 of the 5 entries it has here: the 3 later ones not copied"
        ]
        assert [m.content for m in await pg.load_transcript("grew")] == ["q1", "a1"]
        await lite.create_session(id="there", cwd="/w")  # used in PostgreSQL only since: nothing lost
        await lite.append("there", [human("q")])
        assert await migrate(str(db), None, pg, print) == 1
        await pg.append("there", [ai("a")])
        await pg.append("grew", [human("used in PostgreSQL too"), ai("yes")])  # now it grew in both
        said.clear()
        assert await migrate(str(db), None, pg, said.append) == 0
        assert said == [
            "skipped grew: already in the database, where it differs from here from entry 3 on (used in both"
            " since it was copied): the 3 entries from there are not copied",
            "skipped there: already in the database",
        ]


async def test_a_database_that_stops_answering_fails_each_call_in_time_and_serves_again_after(
    postgres: Any, pg_url: str
) -> None:
    """A hung server (or a cut network) sends no error, ever: every call, the lock's too,
    fails after `answer_within` seconds instead of waiting forever; once the server answers
    again, so does the store, and what failed was not stored."""
    async with PostgresStore(pg_url) as store:
        store.answer_within = 1.0
        await store.create_session(id="s", cwd="/w")
        await store.lock_session("s")
        await store.append("s", [human("one")])
        with postgres.frozen():
            for call in (
                lambda: store.append("s", [human("lost")]),
                lambda: store.unlock_session("s"),
                lambda: store.lock_session("s"),
                lambda: store.list_sessions(),
            ):
                started = time.monotonic()
                with pytest.raises(StoreError, match=r"^cannot reach the PostgreSQL store at .*: no answer within 1 s$"):
                    await asyncio.wait_for(call(), 30)
                assert time.monotonic() - started < 4  # the bound, and two 1 s cancels at most
        await store.lock_session("s")
        await store.append("s", [human("two")])
        assert [m.content for m in await store.load_transcript("s")] == ["one", "two"]


async def test_a_database_that_stops_answering_holds_neither_closing_nor_queued_lock_calls(
    postgres: Any, pg_url: str
) -> None:
    """crow's exit closes the store: a hung server must not hold it. Lock calls queued behind
    one another each get the bound from when they were made, not after the ones before."""
    store = await PostgresStore(pg_url).open()
    store.answer_within = 2.0
    for n in range(6):
        await store.create_session(id=f"s{n}", cwd="/w")
        await store.lock_session(f"s{n}")
    with postgres.frozen():
        started = time.monotonic()
        failed = await asyncio.wait_for(
            asyncio.gather(*(store.unlock_session(f"s{n}") for n in range(6)), return_exceptions=True), 60
        )
        assert all(isinstance(e, StoreError) for e in failed), failed
        assert time.monotonic() - started < 2.0 + 2 + 1.5  # the bound and two cancels, for all six
        started = time.monotonic()
        await asyncio.wait_for(store.aclose(), 30)
        assert time.monotonic() - started < 8  # not until the server answers again


async def test_text_that_is_not_unicode_is_a_store_error(pg_url: str) -> None:
    async with PostgresStore(pg_url) as store:
        with pytest.raises(StoreError, match="surrogates not allowed"):
            await store.create_session(id="s", cwd="/w/\udcff")
        await store.create_session(id="s", cwd="/w")
        with pytest.raises(StoreError, match="surrogates not allowed"):
            await store.append("s", [human("\udcff")])
        assert await store.load_transcript("s") == []
