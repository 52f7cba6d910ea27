"""The session store in PostgreSQL (`store: postgresql://…`): appending one message, against
the SQLite append measured in the same run, on a throwaway PostgreSQL cluster on this
machine (tests/support/postgres.py: a unix socket, fsync off as in the tests); loading a
1,000-message session; a turn's lock and unlock. Not measured (with the reason) where no
PostgreSQL server can start."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.common import Ctx, Figure, describe, median, ms, not_measured
from bench.loop import history

G = "store_pg"
APPEND = "append to PostgreSQL, median"


async def _append_times(store: object, sid: str, n: int) -> list[float]:
    from crow.messages import human

    times = []
    for i in range(n):
        t0 = time.perf_counter()
        await store.append(sid, [human(f"one more message {i}")])  # type: ignore[attr-defined]
        times.append(time.perf_counter() - t0)
    return times


async def _measure(ctx: Ctx, url: str, home: Path) -> list[Figure]:
    from crow.store import SQLiteStore
    from crow.store.postgres import PostgresStore

    n = ctx.reps(400, 60)
    messages = history(1_000)
    async with PostgresStore(url) as pg, SQLiteStore(home / "crow.db") as lite:
        for store in (pg, lite):
            await store.create_session(id="s", cwd=str(home))
            await store.append("s", messages)
            await _append_times(store, "s", 20)  # warm: prepared statements, pool
        pg_times: list[float] = []
        lite_times: list[float] = []
        for store in (pg, lite):  # as in a turn: under the session's lock (PostgreSQL's
            await store.lock_session("s")  # append then checks it is still this store's)
        for _ in range(4):  # interleaved: the machine's noise falls on both
            pg_times += await _append_times(pg, "s", n // 4)
            lite_times += await _append_times(lite, "s", n // 4)
        for store in (pg, lite):
            await store.unlock_session("s")
        loads: dict[str, list[float]] = {"pg": [], "lite": []}
        locks: list[float] = []
        for _ in range(ctx.reps(15, 4)):
            for name, store in (("pg", pg), ("lite", lite)):
                t0 = time.perf_counter()
                await store.load_both("s")
                loads[name].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await pg.lock_session("s")
            await pg.unlock_session("s")
            locks.append(time.perf_counter() - t0)
    note = "one message in a turn (the lock held), one statement, committed; unix socket, same machine (fsync off)"
    return [
        Figure(G, APPEND, ms(median(pg_times)), baseline=ms(median(lite_times)),
               baseline_name="SQLite append", target="< 2 ms", check=("value", "<", 2.0),
               note=note, samples=len(pg_times)),
        Figure(G, "load 1,000-message session from PostgreSQL", ms(median(loads["pg"])),
               baseline=ms(median(loads["lite"])), baseline_name="from SQLite",
               samples=len(loads["pg"])),
        Figure(G, "lock + unlock a session in PostgreSQL", ms(median(locks)), samples=len(locks),
               note="advisory lock on the store's own connection, and the session_locks row"),
    ]  # fmt: skip


async def on_postgres(
    group: str, what: str, target: str, measure: Callable[[str], Awaitable[list[Figure]]]
) -> list[Figure]:
    """`measure(url)` on a fresh database of a throwaway cluster; `what` not measured, with
    the reason, where no PostgreSQL server can start."""
    try:
        from tests.support.postgres import postgres_server

        server = postgres_server()
        pg = server.__enter__()
    except BaseException as exc:  # no server here (pytest's skip says why)
        return [not_measured(group, what, f"no PostgreSQL server could start: {describe(exc)}", target)]
    try:
        return await measure(pg.new_database())
    finally:
        server.__exit__(None, None, None)


async def run(ctx: Ctx) -> list[Figure]:
    return await on_postgres(G, APPEND, "< 2 ms", lambda url: _measure(ctx, url, ctx.home("store-pg")))
