"""Session locks in the store: one crow process runs turns in a session at a time; a lock
left by a process that is gone is taken over; a reader learns that another one wrote."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path

import pytest

from crow.errors import SessionBusy, StoreError
from crow.messages import Message, ai, human
from crow.session import Session
from crow.store import SQLiteStore
from crow.store.locks import LEASE, holder_alive, process_token, start_time
from tests.support.store_backends import new_store

__all__ = ["new_store"]  # the protocol's tests run on both backends

pytestmark = pytest.mark.anyio


def sql(db: Path, statement: str, params: tuple = ()) -> list[tuple]:
    """Another connection to the database (the store's own lives on its worker thread)."""
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        return conn.execute(statement, params).fetchall()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


async def test_a_second_store_is_told_busy_then_takes_over_after_release(new_store) -> None:
    async with new_store() as a, new_store() as b:
        await a.create_session(id="s", cwd="/w")
        await b.load_context("s")
        assert await a.lock_session("s") is False, "a created it: nothing to reload"
        with pytest.raises(SessionBusy) as busy:
            await b.lock_session("s")
        assert busy.value.pid == os.getpid()
        assert f"pid {os.getpid()}" in str(busy.value) and str(busy.value).startswith("busy:")
        await a.append("s", [Message("user", "from a")])
        await a.unlock_session("s")
        assert await b.lock_session("s") is True, "a wrote since b read: b must reload"
        await b.unlock_session("s")
        assert await a.lock_session("s") is True, "b held it since: a must reload"
        await a.unlock_session("s")
        assert await a.lock_session("s") is False, "nobody else held it"


async def test_a_session_running_a_turn_elsewhere_cannot_be_deleted(new_store) -> None:
    # `crow sessions delete` beside a crow process mid-turn: that turn, and every later
    # prompt there, would fail on a session that no longer exists.
    async with new_store() as a, new_store() as b:
        await a.create_session(id="s", cwd="/w")
        await a.lock_session("s")
        with pytest.raises(SessionBusy, match=f"pid {os.getpid()}"):
            await b.delete_session("s")
        await a.append("s", [Message("user", "still here")])
        assert [m.content for m in await b.load_transcript("s")] == ["still here"]
        await a.unlock_session("s")
        await b.delete_session("s")  # idle: it goes
        assert await a.get_session("s") is None


async def test_a_lock_of_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    db = tmp_path / "crow.db"
    async with SQLiteStore(db) as store:
        await store.create_session(id="s", cwd="/w")
        pid = dead_pid()
        boot, namespace, *_ = process_token().split("|")
        token = f"{boot}|{namespace}|{pid}|12345|deadbeef"
        sql(db, "INSERT INTO session_locks VALUES ('s', ?, ?, ?, 7)", (token, pid, time.time()))
        assert await store.lock_session("s") is True
        [(owner, held_pid, generation)] = sql(db, "SELECT owner, pid, generation FROM session_locks")
        assert (held_pid, generation) == (os.getpid(), 8) and owner != token


async def test_a_lock_and_an_unlock_hold_no_write_lock_once_done(tmp_path: Path) -> None:
    """A lock of a free session and an unlock are one statement each, outside a transaction:
    once they return, another process can write at once, and the generation counts on."""
    db = tmp_path / "crow.db"
    async with SQLiteStore(db) as store:
        await store.create_session(id="s", cwd="/w")
        for _ in range(2):  # the first lock makes the row, the second takes a free one
            assert await store.lock_session("s") is False
            with closing(sqlite3.connect(db, isolation_level=None, timeout=0)) as other:
                other.execute("BEGIN IMMEDIATE")
                other.execute("ROLLBACK")
            [(generation,)] = sql(db, "SELECT generation FROM session_locks WHERE owner IS NOT NULL")
            await store.unlock_session("s")
            with closing(sqlite3.connect(db, isolation_level=None, timeout=0)) as other:
                other.execute("BEGIN IMMEDIATE")
                other.execute("ROLLBACK")
            assert sql(db, "SELECT owner, generation FROM session_locks") == [(None, generation + 1)]


def test_liveness_rules() -> None:
    mine = process_token()
    boot, namespace, pid, started, _ = mine.split("|")
    now = time.time()
    assert started == start_time(os.getpid())
    other_store_here = f"{boot}|{namespace}|{pid}|{started}|other"
    assert holder_alive(other_store_here, 0, now, mine), "a live holder is live whatever its heartbeat"
    assert not holder_alive(f"{boot}|{namespace}|{pid}|1|x", now, now, mine), "a reused pid is not the holder"
    assert not holder_alive(f"{boot}|{namespace}|{dead_pid()}|1|x", now, now, mine)
    assert not holder_alive(f"another-boot|{namespace}|{pid}|{started}|x", now, now, mine)
    elsewhere = f"{boot}|pid:[1]|1|1|x"  # another PID namespace: the heartbeat decides
    assert holder_alive(elsewhere, now - LEASE / 2, now, mine)
    assert not holder_alive(elsewhere, now - LEASE - 1, now, mine)


async def test_exclusive_reloads_what_another_process_wrote(new_store) -> None:
    async with new_store() as a, new_store() as b:
        await a.create_session(id="s", cwd="/w")
        ours = Session(id="s", cwd=Path("/w"), store=b, messages=await b.load_context("s"))
        theirs = Session(id="s", cwd=Path("/w"), store=a)
        async with theirs.exclusive():
            with pytest.raises(SessionBusy):
                async with ours.exclusive():
                    pass
            await theirs.add(Message("user", "q"), Message("assistant", "a"))
            await theirs.save(todos=[{"id": "1", "title": "t", "status": "pending"}])
        async with ours.exclusive():
            assert [m.content for m in ours.messages] == ["q", "a"]
            assert ours.todos == [{"id": "1", "title": "t", "status": "pending"}]
            async with ours.exclusive():  # nested in one process: shares the lock
                pass
            await ours.add(Message("user", "q2"))
        assert await a.load_context("s") == [
            Message("user", "q"),
            Message("assistant", "a"),
            Message("user", "q2"),
        ]


async def test_closing_the_store_releases_its_locks(new_store) -> None:
    async with new_store() as b:
        async with new_store() as a:
            await a.create_session(id="s", cwd="/w")
            await a.lock_session("s")
        assert await b.lock_session("s") is True


async def test_a_read_during_another_process_turn_is_reloaded_after_a_takeover(tmp_path: Path) -> None:
    db = tmp_path / "crow.db"
    async with SQLiteStore(db) as a, SQLiteStore(db) as b:
        await a.create_session(id="s", cwd="/w")
        await a.lock_session("s")
        await b.load_context("s")  # mid-turn: what it read may be half a turn
        await a.append("s", [Message("user", "more")])
        # a dies without releasing: its token now names a process that is gone
        boot, namespace, *_ = process_token().split("|")
        dead = f"{boot}|{namespace}|{dead_pid()}|1|x"
        sql(db, "UPDATE session_locks SET owner = ?", (dead,))
        assert await b.lock_session("s") is True


async def test_a_holder_refreshes_its_heartbeat_while_it_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    import crow.store.locks

    monkeypatch.setattr(crow.store.locks, "BEAT", 0.02)
    db = tmp_path / "crow.db"
    async with SQLiteStore(db) as store:
        await store.create_session(id="s", cwd="/w")
        await store.lock_session("s")
        [(first,)] = sql(db, "SELECT heartbeat FROM session_locks")
        await asyncio.sleep(0.1)
        [(later,)] = sql(db, "SELECT heartbeat FROM session_locks")
        assert later > first
        await store.unlock_session("s")
        await asyncio.sleep(0.05)
        assert store._heartbeat is not None and store._heartbeat.done(), "no beat without a lock"


async def test_text_that_is_not_unicode_is_a_store_error(tmp_path: Path) -> None:
    from crow.errors import StoreError

    for path in (tmp_path / "crow.db", ":memory:"):  # a file and a private in-memory database
        async with SQLiteStore(path) as store:
            with pytest.raises(StoreError, match="surrogates not allowed"):
                await store.create_session(id="s", cwd="/w/\udcff")


async def test_a_lock_cancelled_while_queued_is_not_left_held(tmp_path: Path) -> None:
    """A prompt cancelled while its lock waits (here on another process's write) used to
    leave the lock taken once the job ran: the caller never learnt it held it, so every
    other crow process was told "busy" for that session until this one exited."""
    import anyio

    db = tmp_path / "crow.db"
    async with SQLiteStore(db) as a, SQLiteStore(db) as b:
        await a.create_session(id="s", cwd="/w")
        with closing(sqlite3.connect(db, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")  # a's lock job waits on the worker (busy_timeout)
            async with anyio.create_task_group() as tg:
                tg.start_soon(a.lock_session, "s")
                await anyio.sleep(0.2)
                tg.cancel_scope.cancel()
                other.execute("ROLLBACK")
        await a.get_session("s")  # a's worker has run every job queued before
        assert sql(db, "SELECT owner FROM session_locks WHERE session_id = 's'") == [(None,)]
        await b.lock_session("s")  # another process may run a turn there: not SessionBusy
        await b.unlock_session("s")


async def test_a_message_the_store_refused_is_not_kept_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holding the database past busy_timeout (a big delete, a backup), or
    a full disk, fails one append. The message used to stay in memory anyway, so the
    failed turn's clean-up answered its tool calls durably: results stored with no call
    before them, which every provider refuses in that session forever after a reload."""
    from crow.messages import ToolCall, close_dangling_tool_calls, validate

    # Fail fast, not in 5 s: each store job sets its busy_timeout from this.
    monkeypatch.setattr("crow.store._worker.BUSY_TIMEOUT_MS", 50)
    db = tmp_path / "crow.db"
    async with SQLiteStore(db) as store:
        await store.create_session(id="s", cwd="/w")
        session = Session(id="s", cwd=Path("/w"), store=store)
        await session.add(Message("user", "list the files"))
        asked = Message("assistant", "", tool_calls=(ToolCall("c1", "ls", {}),))
        with closing(sqlite3.connect(db, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            with pytest.raises(StoreError):
                await session.add(asked)
            other.execute("ROLLBACK")
        assert list(session.messages) == await store.load_context("s")
        # What a failed turn's clean-up does (Loop._close_dangling): answer open calls.
        n = len(session.messages)
        await session.add(*close_dangling_tool_calls(list(session.messages), "not run")[n:])
        validate(await store.load_context("s"))


async def test_a_turn_cancelled_while_taking_the_lock_leaves_the_session_free(tmp_path: Path) -> None:
    """A prompt cancelled while its lock write waits for another process's write: the store
    still runs that write, so the session must be released again, not stay taken by a
    process that is alive and holds nothing."""
    import anyio

    db = tmp_path / "crow.db"
    async with SQLiteStore(db) as a, SQLiteStore(db) as b:
        await a.create_session(id="s", cwd="/w")
        session = Session(id="s", cwd=Path("/w"), store=a)
        with closing(sqlite3.connect(db, isolation_level=None, check_same_thread=False)) as other:
            other.execute("BEGIN IMMEDIATE")  # another process writing: a's lock job waits
            threading.Timer(0.5, other.execute, ("COMMIT",)).start()  # ... then takes the lock
            with anyio.move_on_after(0.2):
                async with session.exclusive():
                    pytest.fail("the lock was taken during another process's write")
            await a.load_context("s")  # a's queued jobs have run by now
        await b.lock_session("s")  # not SessionBusy
        await b.unlock_session("s")


async def test_two_turns_of_one_process_racing_for_a_session_one_is_busy(new_store) -> None:
    """Two `Session`s of one process (a subagent's session loaded again by its id) asking
    for its lock at once: one gets it, the other is told busy."""
    import asyncio

    async with new_store() as store:
        await store.create_session(id="s", cwd="/w")
        results = await asyncio.gather(
            store.lock_session("s"), store.lock_session("s"), return_exceptions=True
        )
        assert sorted(type(r).__name__ for r in results) == ["SessionBusy", "bool"], results
        busy = next(r for r in results if isinstance(r, SessionBusy))
        assert "running a turn in this crow process" in str(busy)
        await store.unlock_session("s")
        async with new_store() as other:
            await other.lock_session("s")  # released once: nobody holds it
            await other.unlock_session("s")


async def test_a_turn_holding_the_lock_compacts_and_rewinds(new_store) -> None:
    """The writes a turn makes under its lock besides appends: a compaction's `set_context`
    and a rewind's `rewind_context` (PostgreSQL checks the lock is still its own: that check
    read its answer row as "no row", and refused every compaction and /undo)."""
    async with new_store() as store:
        await store.create_session(id="s", cwd="/w")
        await store.append("s", [human("one"), ai("first")])
        assert await store.lock_session("s") is False
        await store.append("s", [human("two")])
        await store.set_context("s", [human("summary"), human("two")])
        await store.rewind_context("s", [human("summary")], human("[rewound]"))
        await store.unlock_session("s")
        assert [m.content for m in await store.load_context("s")] == ["summary"]
        assert [m.content for m in await store.load_transcript("s")] == ["one", "first", "two", "[rewound]"]
