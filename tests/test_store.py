from __future__ import annotations

import asyncio
import gc
import signal
import sqlite3
import sys
import textwrap
import threading
import time
import warnings
from contextlib import closing, suppress
from pathlib import Path

import anyio
import anyio.abc
import anyio.lowlevel
import pytest

from crow.errors import StoreError
from crow.messages import (
    Image,
    Message,
    ToolCall,
    ai,
    close_dangling_tool_calls,
    human,
    tool_msg,
    validate,
)
from crow.session import Session
from crow.store import SCHEMA_VERSION, SessionRecord, SQLiteStore, Store
from tests.support.store_backends import new_store

# The contract tests run on both backends (`new_store`); the rest are SQLite's own.
__all__ = ["new_store"]

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def store(new_store):
    async with new_store() as s:
        await s.create_session(id="s1", cwd="/proj")
        yield s


@pytest.fixture
async def sqlite_store():
    async with SQLiteStore(":memory:") as s:
        await s.create_session(id="s1", cwd="/proj")
        yield s


def rich_messages() -> list[Message]:
    call = ToolCall.from_raw("c1", "read", '{"path": "a.py", "n": [1, 2]}')
    bad = ToolCall.from_raw("c2", "write", "{not json")
    return [
        Message("system", "be brief"),
        human("look", Image("image/png", "aGVsbG8=")),
        Message("assistant", "", (call, bad), thinking="hmm", thinking_signature="sig=="),
        Message(
            "tool",
            "content",
            tool_call_id="c1",
            name="read",
            meta={"diff": {"old": "a", "new": "b"}, "locations": [1, 2]},
        ),
        tool_msg("c2", "write", "Error: bad args", is_error=True),
        ai("done é ✓"),
    ]


def conversation(n: int, size: int = 500) -> list[Message]:
    """`n` messages of about `size` characters, a tool exchange every few turns."""
    out: list[Message] = []
    i = 0
    while len(out) < n:
        text = f"message {i} " + "x" * size
        match i % 4:
            case 0:
                out.append(human(text))
            case 1:
                call = ToolCall.from_raw(f"c{i}", "read", f'{{"path": "f{i}.py"}}')
                out.append(ai(text[:100], call))
            case 2:
                out.append(tool_msg(f"c{i - 1}", "read", text))
            case _:
                out.append(ai(text))
        i += 1
    return out[:n]


async def test_round_trip_every_field(store: Store) -> None:
    msgs = rich_messages()
    await store.append("s1", msgs)
    assert await store.load_transcript("s1") == msgs
    assert await store.load_context("s1") == msgs
    loaded = await store.load_transcript("s1")
    assert loaded[2].tool_calls[1].parse_error
    assert loaded[1].images[0].data == "aGVsbG8="
    assert loaded[4].is_error
    assert (await store.get_session("s1")).message_count == len(msgs)


async def test_satisfies_protocol(store: Store) -> None:
    assert isinstance(store, Store)


async def test_durable_across_reopen(new_store, tmp_path: Path) -> None:
    async with new_store() as s:
        await s.create_session(
            id="a",
            cwd="/p",
            title="first",
            model="m1",
            todos=[{"content": "x", "status": "pending"}],
            files={"a.py": "modified"},
            config={"k": 1},
        )
        await s.append("a", rich_messages())
        await s.append("a", [ai("note")], in_context=False)
    async with new_store() as s:
        rec = await s.get_session("a")
        assert rec is not None
        assert (rec.title, rec.model, rec.todos, rec.files, rec.config) == (
            "first",
            "m1",
            [{"content": "x", "status": "pending"}],
            {"a.py": "modified"},
            {"k": 1},
        )
        assert rec.message_count == 7
        assert rec.created_at.endswith("+00:00")
        assert await s.load_transcript("a") == [*rich_messages(), ai("note")]
        assert await s.load_context("a") == rich_messages()


async def test_sqlite_file_has_the_schema_version_and_wal(tmp_path: Path) -> None:
    db = tmp_path / "nested" / "dir" / "crow.db"
    async with SQLiteStore(db):
        pass
    with closing(sqlite3.connect(db)) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_survives_sigkill_right_after_append(new_store) -> None:
    async with new_store() as s:
        await s.create_session(id="k", cwd="/p")
    child = textwrap.dedent(f"""
        import asyncio, os, signal
        from crow.messages import ai, human

        async def main():
            store = {new_store.code}
            await store.open()
            for i in range(3):
                await store.append("k", [human(f"q{{i}}"), ai(f"a{{i}}")])
            os.kill(os.getpid(), signal.SIGKILL)

        asyncio.run(main())
    """)
    proc = await anyio.run_process([sys.executable, "-c", child], check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    async with new_store() as s:
        texts = [m.content for m in await s.load_transcript("k")]
        assert texts == ["q0", "a0", "q1", "a1", "q2", "a2"]


async def test_compaction_keeps_transcript(store: Store) -> None:
    convo = conversation(12, size=20)
    await store.append("s1", convo)
    summary = human("summary of turns 1-8")
    compacted = [convo[0], summary, *convo[8:]]
    await store.set_context("s1", compacted)
    assert await store.load_context("s1") == compacted
    assert await store.load_transcript("s1") == convo

    # New turns join the context after the kept tail.
    more = conversation(16, size=20)[12:]
    await store.append("s1", more)
    assert await store.load_context("s1") == [*compacted, *more]

    # A second compaction replaces the head; the transcript stays whole.
    second = [convo[0], human("summary 2"), *more[2:]]
    await store.set_context("s1", second)
    assert await store.load_context("s1") == second
    assert await store.load_transcript("s1") == [*convo, *more]

    # Nothing kept: the whole context becomes the head; later appends still follow it.
    await store.set_context("s1", [human("fresh start")])
    assert await store.load_context("s1") == [human("fresh start")]
    await store.append("s1", [ai("ok")])
    assert await store.load_context("s1") == [human("fresh start"), ai("ok")]
    assert len(await store.load_transcript("s1")) == 17


async def test_set_context_unchanged_is_a_no_op(store: Store) -> None:
    convo = conversation(6, size=10)
    await store.append("s1", convo)
    await store.set_context("s1", convo)
    assert await store.load_context("s1") == convo
    await store.append("s1", [ai("x")])
    assert await store.load_context("s1") == [*convo, ai("x")]


async def test_transcript_only_entries_stay_out_of_context(store: Store) -> None:
    await store.append("s1", [human("hi"), ai("hello")])
    await store.append("s1", [Message("assistant", "[compacted]", meta={"notice": True})], in_context=False)
    await store.append("s1", [human("again")])
    assert [m.content for m in await store.load_context("s1")] == ["hi", "hello", "again"]
    assert len(await store.load_transcript("s1")) == 4
    # set_context skips over the notice when matching the tail.
    await store.set_context("s1", [human("sum"), human("again")])
    assert [m.content for m in await store.load_context("s1")] == ["sum", "again"]


async def test_crash_mid_turn_context_can_be_repaired(store: Store) -> None:
    call = ToolCall("t1", "bash", {"cmd": "make"})
    await store.append("s1", [human("build it"), ai("", call)])  # killed before the result
    context = await store.load_context("s1")
    with pytest.raises(ValueError):
        validate(context)
    repaired = close_dangling_tool_calls(context)
    validate(repaired)
    assert repaired[-1].tool_call_id == "t1" and repaired[-1].is_error


async def test_list_filters_and_paginates_while_inserting(new_store) -> None:
    async with new_store() as s:
        for i in range(25):
            await s.create_session(id=f"s{i:02}", cwd="/a" if i % 2 else "/b")
        await s.create_session(id="same-time", cwd="/a", updated_at=(await s.get_session("s05")).updated_at)
        expected = {f"s{i:02}" for i in range(25)} | {"same-time"}
        seen: list[str] = []
        cursor = None
        page_no = 0
        while True:
            page, cursor = await s.list_sessions(limit=4, cursor=cursor)
            seen += [r.id for r in page]
            await s.create_session(id=f"new{page_no}", cwd="/a")
            page_no += 1
            if cursor is None:
                break
        assert len(seen) == len(set(seen))
        assert expected <= set(seen)

        only_b, nxt = await s.list_sessions(cwd="/b", limit=100)
        assert nxt is None
        assert {r.id for r in only_b} == {f"s{i:02}" for i in range(0, 25, 2)}
        stamps = [r.updated_at for r in only_b]
        assert stamps == sorted(stamps, reverse=True)

        await s.append("s00", [human("bump")])
        top, _ = await s.list_sessions(cwd="/b", limit=1)
        assert top[0].id == "s00"
        with pytest.raises(StoreError, match="cursor"):
            await s.list_sessions(cursor="garbage!")


async def test_update_session(store: Store) -> None:
    before = await store.get_session("s1")
    await anyio.sleep(0.002)
    rec = await store.update_session(
        "s1", title="T", mode="plan", todos=[{"a": 1}], files={"x": "y"}, config={"c": True}
    )
    assert (rec.title, rec.mode, rec.todos, rec.files, rec.config) == (
        "T",
        "plan",
        [{"a": 1}],
        {"x": "y"},
        {"c": True},
    )
    assert rec.updated_at > before.updated_at and rec.created_at == before.created_at
    assert await store.get_session("s1") == rec
    with pytest.raises(TypeError):
        await store.update_session("s1", message_count=3)
    with pytest.raises(StoreError, match="nope"):
        await store.update_session("nope", title="x")


async def test_fork_is_independent(store: Store) -> None:
    convo = conversation(8, size=10)
    await store.append("s1", convo)
    await store.set_context("s1", [human("sum"), *convo[4:]])
    await store.update_session("s1", title="orig", todos=[{"t": 1}])
    fork = await store.fork_session("s1", "f1")
    assert (fork.id, fork.title, fork.todos, fork.message_count) == ("f1", "orig", [{"t": 1}], 8)
    assert await store.load_context("f1") == await store.load_context("s1")
    await store.append("f1", [human("only in fork")])
    await store.update_session("f1", title="fork")
    assert await store.load_transcript("s1") == convo
    assert (await store.get_session("s1")).title == "orig"
    assert len(await store.load_transcript("f1")) == 9
    with pytest.raises(StoreError, match="f1"):
        await store.fork_session("s1", "f1")
    with pytest.raises(StoreError, match="ghost"):
        await store.fork_session("ghost", "f2")


async def test_delete(store: Store) -> None:
    await store.append("s1", [human("x")])
    await store.create_session(SessionRecord(id="keep", cwd="/p"))
    await store.delete_session("s1")
    assert await store.get_session("s1") is None
    for call in (store.load_transcript, store.load_context, store.delete_session):
        with pytest.raises(StoreError, match="s1"):
            await call("s1")
    with pytest.raises(StoreError, match="s1"):
        await store.append("s1", [human("x")])
    # The id is free again and starts empty (entries were cascaded away).
    await store.create_session(id="s1", cwd="/p")
    assert await store.load_transcript("s1") == []
    assert await store.get_session("keep") is not None


async def test_errors_are_store_errors(store: Store) -> None:
    with pytest.raises(StoreError, match="already exists"):
        await store.create_session(id="s1", cwd="/x")
    with pytest.raises(StoreError, match="JSON"):
        await store.append("s1", [Message("user", "x", meta={"bad": object()})])
    assert await store.load_transcript("s1") == []


async def test_use_after_close_and_leak_warning(new_store) -> None:
    s = new_store()
    with pytest.raises(StoreError, match="not open"):
        await s.get_session("x")
    await s.open()
    await s.aclose()
    await s.aclose()  # idempotent
    with pytest.raises(StoreError, match="store closed"):
        await s.append("x", [human("hi")])
    with pytest.raises(StoreError, match="store closed"):
        await s.open()

    leaked = new_store()
    await leaked.open()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del leaked
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) for w in caught)


async def test_newer_schema_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "future.db"
    with closing(sqlite3.connect(db)) as raw:
        raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="schema version"):
        await SQLiteStore(db).open()


async def test_two_stores_share_a_file(new_store) -> None:
    async with new_store() as a, new_store() as b:
        await a.create_session(id="x", cwd="/p")
        await b.append("x", [human("from b")])
        await a.append("x", [ai("from a")])
        assert [m.content for m in await b.load_transcript("x")] == ["from b", "from a"]


async def test_append_cost_is_flat(tmp_path: Path) -> None:
    """An append touches the same rows whatever the history length: SQLite runs as many
    VM instructions (counted by a progress handler, not timed) to append to a 5,000-message
    session as to a 10-message one. An append that counted or read the history would run
    thousands more."""
    async with SQLiteStore(tmp_path / "perf.db") as s:
        history = conversation(5000, size=20)
        await s.create_session(id="big", cwd="/p")
        await s.create_session(id="small", cwd="/p")
        await s.append("big", history)
        await s.append("small", history[:10])
        steps = 0

        def count() -> int:
            nonlocal steps
            steps += 1
            return 0  # carry on

        # The connection lives on the store's worker thread: install the counter there.
        await s._worker.run(lambda conn: conn.set_progress_handler(count, 1))
        await s.append("small", [human("warm")])  # an inline write after a job sets busy_timeout

        async def cost(sid: str, message: Message) -> int:
            nonlocal steps
            steps = 0
            await s.append(sid, [message])
            return steps

        for m in conversation(8, size=20):  # every kind of message: user, tool call, result
            small, big = await cost("small", m), await cost("big", m)
            assert small > 0, "the progress handler saw no instruction"
            assert big == small, f"appending to 5,000 messages ran {big} instructions, to 10: {small}"
        assert len(await s.load_transcript("big")) == 5008


async def test_cancelled_append_still_lands(store: Store) -> None:
    with anyio.move_on_after(0):
        await store.append("s1", [human("queued before the cancel")])
    assert [m.content for m in await store.load_transcript("s1")] == ["queued before the cancel"]


async def test_ties_in_updated_at_paginate_by_id(new_store) -> None:
    async with new_store() as s:
        for i in range(5):
            await s.create_session(id=f"t{i}", cwd="/p", updated_at="2024-01-01T00:00:00Z")
        ids, cursor = [], None
        while True:
            page, cursor = await s.list_sessions(limit=2, cursor=cursor)
            ids += [r.id for r in page]
            if cursor is None:
                break
        assert ids == ["t0", "t1", "t2", "t3", "t4"]
        assert page[0].updated_at == "2024-01-01T00:00:00.000+00:00"


async def test_sqlite_errors_become_store_errors(tmp_path: Path) -> None:
    db = tmp_path / "garbage.db"
    db.write_bytes(b"not a database" * 100)
    with pytest.raises(StoreError, match="connect failed") as info:
        await SQLiteStore(db).open()
    assert isinstance(info.value.__cause__, sqlite3.Error)


class LagProbe:
    """Ticks every millisecond on the event loop and records the longest gap: how long the
    loop could not run anything else (stream a token, answer a request)."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._stop = anyio.Event()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        last = time.perf_counter()
        task_status.started()
        while not self._stop.is_set():
            await anyio.sleep(0.001)
            now = time.perf_counter()
            self.worst, last = max(self.worst, now - last), now

    def stop(self) -> None:
        self._stop.set()


async def test_fork_and_delete_of_a_long_session_do_not_stall_the_loop(tmp_path: Path) -> None:
    # Every SQLite call runs on the store's worker thread: a fork copies ~2.5 MB of rows
    # and a delete cascades them (~180 ms on the loop thread when they ran there).
    async with SQLiteStore(tmp_path / "crow.db") as s:
        await s.create_session(id="big", cwd="/p")
        await s.append("big", conversation(5000))
        probe = LagProbe()
        async with anyio.create_task_group() as tg:
            await tg.start(probe.run)
            await s.fork_session("big", "copy")
            await s.delete_session("copy")
            await s.delete_session("big")
            probe.stop()
        assert await s.get_session("big") is None
    assert probe.worst < 0.05, f"the event loop stalled {probe.worst * 1e3:.0f} ms"


async def test_waiting_for_another_process_write_lock_does_not_stall_the_loop(tmp_path: Path) -> None:
    # Another crow process on the same database holds its write lock for a while: this
    # store's append waits for it (busy_timeout) on the worker thread, not on the loop.
    db = tmp_path / "crow.db"
    async with SQLiteStore(db) as s:
        await s.create_session(id="s", cwd="/p")
        holder = textwrap.dedent(f"""
            import sqlite3, sys, time
            conn = sqlite3.connect({str(db)!r}, isolation_level=None)
            conn.execute("BEGIN IMMEDIATE")
            print("held", flush=True)
            time.sleep(0.4)
            conn.execute("COMMIT")
        """)
        async with await anyio.open_process([sys.executable, "-c", holder]) as proc:
            assert proc.stdout is not None
            assert (await proc.stdout.receive()).startswith(b"held")
            probe = LagProbe()
            async with anyio.create_task_group() as tg:
                await tg.start(probe.run)
                started = time.perf_counter()
                await s.append("s", [human("after the other writer")])
                waited = time.perf_counter() - started
                probe.stop()
        assert [m.content for m in await s.load_transcript("s")] == ["after the other writer"]
    assert waited > 0.1, "the other process did not hold the write lock long enough to matter"
    assert probe.worst < 0.05, f"the event loop stalled {probe.worst * 1e3:.0f} ms"


async def test_a_small_write_never_overtakes_a_queued_job(tmp_path: Path) -> None:
    # Appends run at once when the worker is idle; with a fork queued, an append must wait
    # its turn, or the fork (asked for first) would copy a message sent after it.
    async with SQLiteStore(tmp_path / "crow.db") as s:
        await s.create_session(id="s", cwd="/p")
        await s.append("s", [human(f"m{i}") for i in range(2000)])
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.fork_session, "s", "f")
            await anyio.lowlevel.checkpoint()  # the fork's job is queued
            await s.append("s", [human("after the fork")])
        assert (await s.load_transcript("s"))[-1].content == "after the fork"
        assert (await s.load_transcript("f"))[-1].content == "m1999"


async def test_small_writes_on_the_loop_still_checkpoint_the_wal(tmp_path: Path) -> None:
    # Inline writes run with SQLite's automatic checkpoint off (it fsyncs); the worker
    # checkpoints every CHECKPOINT_EVERY (200) of them, so the WAL does not grow without end.
    db = tmp_path / "crow.db"
    async with SQLiteStore(db) as s:
        await s.create_session(id="s", cwd="/p")
        for i in range(2000):
            await s.append("s", [human("x" * 2000 + str(i))])
        await s.get_session("s")  # the last checkpoint queued has run
        wal = Path(f"{db}-wal").stat().st_size
    # 2,000 appends write ~40 MB of WAL frames (a few pages each); reused after a checkpoint
    assert wal < 12_000_000, f"WAL is {wal} bytes"


async def test_a_wal_checkpoint_sends_no_small_write_to_the_thread(tmp_path: Path, monkeypatch) -> None:
    # Small writes asked for while a checkpoint is queued or fsyncing wait for it on the
    # loop, then run inline. Queued behind it, each was a hop of its own, and under a
    # steady stream of writes (50 busy sessions) a third of all writes hopped.

    from crow.store import _worker

    monkeypatch.setattr(_worker, "CHECKPOINT_EVERY", 10)
    writers: list[str] = []

    def trace(statement: str) -> None:
        if statement.startswith("INSERT INTO entries"):
            writers.append(threading.current_thread().name)

    db = tmp_path / "crow.db"
    async with SQLiteStore(db) as s:
        await s.create_session(id="s", cwd="/p")
        await s._run(lambda conn: conn.set_trace_callback(trace))
        for i in range(45):
            await s.append("s", [human("x" * 2000 + str(i))])
        await s.get_session("s")  # every checkpoint queued has run
        assert writers == [threading.current_thread().name] * 45, writers
        wal = Path(f"{db}-wal").stat().st_size
        assert len(await s.load_transcript("s")) == 45
    assert wal < 45 * 2 * 4096, f"the checkpoints let the WAL be reused: {wal} bytes"


async def _occupy(s: SQLiteStore) -> tuple[threading.Event, asyncio.Future[object]]:
    """The worker thread held by a job until the event is set: calls made meanwhile wait
    in the line. Such a call is issued: cancelling its caller stops the waiting, not the
    call (found in review: they were dropped while memory kept them)."""
    go = threading.Event()
    job = asyncio.ensure_future(s._run(lambda conn: go.wait(5)))
    await asyncio.sleep(0)
    return go, job


async def test_an_unlock_waiting_for_a_job_is_not_overtaken_by_a_later_lock(tmp_path: Path) -> None:
    # A turn's unlock waits behind a queued job; the next turn's lock of the same session,
    # made once that job had settled but before the unlock ran, must still come after it:
    # else the unlock releases the new turn's lock and another process may write too.
    import sqlite3
    import time
    from contextlib import closing

    db = tmp_path / "crow.db"
    async with SQLiteStore(db) as s:
        await s.create_session(id="s", cwd="/p")
        await s.lock_session("s")
        go, job = await _occupy(s)
        unlock = asyncio.ensure_future(s.unlock_session("s"))  # waits behind the job
        await asyncio.sleep(0)
        go.set()
        time.sleep(0.2)  # the job's settling is ready on the loop, the lock right after it
        lock = asyncio.ensure_future(s.lock_session("s"))
        await asyncio.gather(job, unlock, lock)
        with closing(sqlite3.connect(db)) as conn:
            owners = conn.execute("SELECT owner FROM session_locks WHERE session_id = 's'").fetchall()
        assert "s" in s._held and owners == [(s._token,)], owners
        await s.unlock_session("s")


async def test_a_small_write_made_before_a_fork_is_in_the_fork(tmp_path: Path) -> None:
    # An append waiting behind a queued job, then a fork: the fork runs after the append.
    async with SQLiteStore(tmp_path / "crow.db") as s:
        await s.create_session(id="s", cwd="/p")
        go, job = await _occupy(s)
        append = asyncio.ensure_future(s.append("s", [human("asked before the fork")]))
        await asyncio.sleep(0)
        fork = asyncio.ensure_future(s.fork_session("s", "f"))
        await asyncio.sleep(0)
        go.set()
        await asyncio.gather(job, append, fork)
        assert [m.content for m in await s.load_transcript("f")] == ["asked before the fork"]


async def test_a_call_cancelled_while_it_waits_its_turn_still_runs_in_it(tmp_path: Path) -> None:
    # Made, it is issued (as a queued job is): Session.add keeps a cancelled append in
    # memory, so the store must have it too; the calls after it still go.
    async with SQLiteStore(tmp_path / "crow.db") as s:
        await s.create_session(id="s", cwd="/p")
        go, job = await _occupy(s)
        first = asyncio.ensure_future(s.append("s", [human("cancelled")]))
        second = asyncio.ensure_future(s.append("s", [human("kept")]))
        third = asyncio.ensure_future(s.get_session("s"))
        await asyncio.sleep(0)
        first.cancel()
        go.set()
        await asyncio.gather(job, second, third)
        assert first.cancelled()
        assert [m.content for m in await s.load_transcript("s")] == ["cancelled", "kept"]
        assert not s._worker._line


async def test_a_large_append_is_written_off_the_event_loop(sqlite_store: SQLiteStore) -> None:
    """A message with an image (megabytes of JSON) is encoded and written on the worker
    thread; a small one inline. Inline, a 1.4 MB row held the event loop 20-40 ms."""

    writers: list[str] = []

    def trace(statement: str) -> None:
        if statement.startswith("INSERT INTO entries"):
            writers.append(threading.current_thread().name)

    await sqlite_store._run(lambda conn: conn.set_trace_callback(trace))
    loop_thread = threading.current_thread().name
    await sqlite_store.append("s1", [human("small")])
    await sqlite_store.append("s1", [human("look", Image("image/png", "A" * 200_000))])
    await sqlite_store.append("s1", [human("x" * 100_000)])
    assert writers[0] == loop_thread, "a small write stays inline (no hop)"
    assert loop_thread not in writers[1:], writers
    assert [m.content[:5] for m in await sqlite_store.load_context("s1")] == ["small", "look", "xxxxx"]


async def test_prefix_lookups(new_store) -> None:
    """match_ids and short_ids order ids as SQLite does (by code point), whatever the
    database's collation."""
    async with new_store() as s:
        for sid in ("abc", "abcd", "abce", "b" * 32, "zz\U0010ffff", "ab_x", "AB"):
            await s.create_session(id=sid, cwd="/p", title=sid)
        assert await s.match_ids("abc") == [("abc", "abc")], "an exact id wins over the ids it starts"
        assert await s.match_ids("ab") == [
            ("ab_x", "ab_x"),
            ("abc", "abc"),
            ("abcd", "abcd"),
            ("abce", "abce"),
        ]
        assert await s.match_ids("ab", 2) == [("ab_x", "ab_x"), ("abc", "abc")]
        assert await s.match_ids("") == [] and await s.match_ids("c") == [] and await s.match_ids("%") == []
        assert await s.match_ids("a_") == [] and await s.match_ids("zz") == [("zz\U0010ffff", "zz\U0010ffff")]
        short = await s.short_ids(["abcd", "b" * 32, "abc", "AB"], minimum=2)
        assert short == {"abcd": "abcd", "b" * 32: "bb", "abc": "abc", "AB": "AB"}
        assert await s.short_ids(["b" * 32]) == {"b" * 32: "b" * 8}


async def test_a_small_append_cancelled_in_the_line_is_stored_as_memory_keeps_it(tmp_path: Path) -> None:
    # Session.add keeps the messages in memory on a cancel ("a queued append still runs"),
    # store/base.py: "a write whose caller is cancelled after it was issued still lands".
    async with SQLiteStore(tmp_path / "crow.db") as s:
        await s.create_session(id="s", cwd="/p")
        session = Session("s", tmp_path, store=s)
        go, job = await _occupy(s)  # a heartbeat `touch`, a checkpoint, a get_session...
        add = asyncio.ensure_future(session.add(human("the model's answer")))
        await asyncio.sleep(0)
        add.cancel()  # the user's session/cancel
        await asyncio.sleep(0)
        go.set()
        await job
        with suppress(asyncio.CancelledError):
            await add
        memory = [m.content for m in session.messages]
        stored = [m.content for m in await s.load_context("s")]
        assert memory == stored, (memory, stored)


async def test_a_large_append_cancelled_behind_a_waiting_small_write_is_stored(tmp_path: Path) -> None:
    # New in c80268c: `run` (a job) used to be queued at its first step; now it may wait
    # in the line, and a cancel there drops it.
    async with SQLiteStore(tmp_path / "crow.db") as s:
        await s.create_session(id="s", cwd="/p")
        session = Session("s", tmp_path, store=s)
        go, job = await _occupy(s)
        small = asyncio.ensure_future(s.update_session("s", title="t"))  # waits in the line
        await asyncio.sleep(0)
        add = asyncio.ensure_future(session.add(human("x" * 70_000)))  # > INLINE_BYTES: a job
        await asyncio.sleep(0)
        add.cancel()
        await asyncio.sleep(0)
        go.set()
        await asyncio.gather(job, small)
        with suppress(asyncio.CancelledError):
            await add
        assert len(session.messages) == 1
        assert len(await s.load_context("s")) == 1, "the cancelled job was never queued"


async def test_a_turn_cancelled_while_its_answer_waits_in_the_line_keeps_the_answer(tmp_path: Path) -> None:
    # The end-to-end effect: memory has A(c1) + the cancel's answer; the store only the
    # answer, which without_stray_results then drops on the next load: A is gone for good.
    async with SQLiteStore(tmp_path / "crow.db") as s:
        await s.create_session(id="s", cwd="/p")
        session = Session("s", tmp_path, store=s)
        await session.add(human("do it"))
        go, job = await _occupy(s)
        a = Message(role="assistant", content="I will run it", tool_calls=(ToolCall("c1", "bash", {}),))
        add = asyncio.ensure_future(session.add(a))
        await asyncio.sleep(0)
        add.cancel()
        await asyncio.sleep(0)
        go.set()
        await job
        with suppress(asyncio.CancelledError):
            await add
        await session.add(tool_msg("c1", "bash", "interrupted", is_error=True))  # loop._close_dangling
        stored = await s.load_context("s")
        assert [m.role for m in stored] == [m.role for m in session.messages], [m.role for m in stored]


async def _close_cancelled_behind_a_write(
    s: SQLiteStore,
) -> tuple[threading.Event, asyncio.Future[object], asyncio.Future[None]]:
    """The worker held (`_occupy`), a small write in the line, then a close whose caller is
    cancelled at once (Agent.aclose cut short: close's finally queues the end anyway)."""
    await s.create_session(id="s", cwd="/p")
    go, job = await _occupy(s)
    small = asyncio.ensure_future(s.append("s", [human("before the close")]))
    await asyncio.sleep(0)
    closer = asyncio.ensure_future(s._worker.close())
    await asyncio.sleep(0)
    closer.cancel()
    with suppress(asyncio.CancelledError):
        await closer
    return go, job, small


async def test_a_close_cancelled_in_the_line_still_closes_the_connection(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "crow.db") as s:
        w = s._worker
        go, job, small = await _close_cancelled_behind_a_write(s)
        go.set()
        await asyncio.gather(job, small)
        await asyncio.sleep(0.2)
        assert not w._thread.is_alive()
        assert w._slot.conn is None, "the thread ended without closing the connection"


async def test_a_busy_write_after_a_cancelled_close_is_told_not_hung(tmp_path: Path) -> None:
    db = tmp_path / "crow.db"
    async with SQLiteStore(db) as s:
        w = s._worker
        go, job, small = await _close_cancelled_behind_a_write(s)
        with closing(sqlite3.connect(db, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")  # another crow process writing
            go.set()
            await job
            await asyncio.sleep(0.3)  # the thread has ended (None after the job)
            other.execute("COMMIT")
            try:
                await asyncio.wait_for(asyncio.shield(small), 3)
            except TimeoutError:
                pytest.fail(f"the write hangs: queued behind the end of the thread (pending={w._pending})")


async def test_callers_resume_in_the_order_their_calls_were_made(tmp_path: Path) -> None:
    # A job, then a small write behind it: the job's caller hears first (the write used to
    # run and be told before the job's own caller resumed).
    async with SQLiteStore(tmp_path / "crow.db") as s:
        await s.create_session(id="s", cwd="/p")
        order: list[str] = []
        go = threading.Event()

        async def job() -> None:
            await s._run(lambda c: go.wait(5))
            order.append("job")

        async def small() -> None:
            await s.update_session("s", title="t")
            order.append("small")

        first = asyncio.ensure_future(job())
        await asyncio.sleep(0)
        second = asyncio.ensure_future(small())
        await asyncio.sleep(0)
        go.set()
        await asyncio.gather(first, second)
        assert order == ["job", "small"]


async def test_a_second_close_made_while_the_first_waits_is_no_error(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "crow.db") as s:
        await s.create_session(id="s", cwd="/p")
        go, job = await _occupy(s)
        small = asyncio.ensure_future(s.append("s", [human("x")]))
        await asyncio.sleep(0)
        closes = [asyncio.ensure_future(s._worker.close()) for _ in range(2)]
        await asyncio.sleep(0)
        go.set()
        assert await asyncio.gather(job, small, *closes, return_exceptions=True) == [True, None, None, None]
        s._state = "closed"


async def test_close_soon_comes_after_the_calls_already_made(tmp_path: Path) -> None:
    # What an unclosed store's __del__ does: the close goes behind the calls in the line,
    # not straight to the thread ahead of them (an issued append was dropped).
    s = SQLiteStore(tmp_path / "crow.db")
    await s.open()
    await s.create_session(id="s", cwd="/p")
    go, job = await _occupy(s)
    add = asyncio.ensure_future(s.append("s", [human("issued before the close")]))
    await asyncio.sleep(0)
    add.cancel()
    s._state = "closed"
    s._worker.close_soon()
    go.set()
    await job
    for _ in range(100):
        if not s._worker._thread.is_alive():
            break
        await asyncio.sleep(0.02)
    with closing(sqlite3.connect(tmp_path / "crow.db")) as conn:
        assert conn.execute("SELECT count(*) FROM entries").fetchone()[0] == 1
