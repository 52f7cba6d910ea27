"""Session store: loading a 5,000-message session (in process: SQLiteStore + replay
conversion; end to end: ACP `session/load`), appending to a long vs a short session, how
long the event loop stalls while a long session is forked and deleted, and what `crow
sessions list` costs next to `crow --help`."""

from __future__ import annotations

import asyncio
import subprocess
import time
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import (
    CROW_CMD,
    Ctx,
    Figure,
    agent_env,
    describe,
    initialize,
    median,
    ms,
    not_measured,
    prompt_text,
    spawn,
)
from bench.loop import history

G = "store"
LONG = 5_000


async def _fill(home: Path, sid: str, n: int) -> None:
    from crow.store import SQLiteStore

    messages = history(n)
    async with SQLiteStore(home / "crow.db") as store:
        await store.create_session(id=sid, cwd=str(home), title="bench")
        for i in range(0, n, 500):
            await store.append(sid, messages[i : i + 500])


async def _in_process(ctx: Ctx, home: Path) -> list[Figure]:
    from crow.acp import view as acp_view
    from crow.messages import human
    from crow.store import SQLiteStore

    n = ctx.reps(15, 4)
    loads: list[float] = []
    appends: dict[str, list[float]] = {"long": [], "short": []}
    async with SQLiteStore(home / "crow.db") as store:
        for _ in range(n):
            t0 = time.perf_counter()
            updates = list(acp_view.replay(await store.load_transcript("long"), home, "long"))
            loads.append(time.perf_counter() - t0)
        assert len(updates) >= LONG * 3 // 4, len(updates)  # a finished tool call is one update
        for i in range(ctx.reps(300, 60)):  # interleaved; the long one grows by 0.1 % per call
            for sid in ("long", "short") if i % 2 else ("short", "long"):
                t0 = time.perf_counter()
                await store.append(sid, [human(f"one more {i}")])
                appends[sid].append(time.perf_counter() - t0)
        locks: list[float] = []
        for _ in range(ctx.reps(300, 60)):  # what a turn adds: taking and releasing its session
            t0 = time.perf_counter()
            await store.lock_session("short")
            await store.unlock_session("short")
            locks.append(time.perf_counter() - t0)
    return [
        Figure(
            G,
            f"load {LONG:,} msgs: load_transcript + replay",
            ms(median(loads)),
            target="< 300 ms",
            check=("value", "<", 300),
            samples=n,
        ),
        Figure(
            G,
            f"append 1 msg to {LONG:,}-msg session",
            ms(median(appends["long"])),
            baseline=ms(median(appends["short"])),
            baseline_name="10-msg session",
            target="ratio <= 1.2",
            check=("ratio", "<=", 1.2),
            samples=len(appends["long"]),
        ),
        Figure(
            G,
            "lock + unlock a session (once per turn)",
            ms(median(locks)),
            baseline=ms(median(appends["short"])),
            baseline_name="append 1 msg",
            target="ratio <= 3",
            check=("ratio", "<=", 3),
            samples=len(locks),
            note="two small write transactions; appends take no lock",
        ),
    ]


async def _worst_lag(work: Any) -> float:
    """The longest the event loop could not run a 1 ms ticker while `work()` ran, beyond
    the tick itself: what every other session's streaming would wait."""
    worst, done = 0.0, False

    async def tick() -> None:
        nonlocal worst
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            worst, last = max(worst, now - last - 0.001), now

    ticker = asyncio.ensure_future(tick())
    await asyncio.sleep(0.005)
    try:
        await work()
    finally:
        done = True
        await ticker
    return worst


async def _stall(ctx: Ctx, home: Path) -> list[Figure]:
    """Fork then delete the long session while a ticker probes the loop; the baseline is
    the same probe over an idle loop for as long."""
    from crow.store import SQLiteStore

    busy, idle = [], []
    async with SQLiteStore(home / "crow.db") as store:

        async def fork_and_delete() -> None:
            await store.fork_session("long", "long-copy")
            await store.delete_session("long-copy")

        for _ in range(ctx.reps(7, 3)):
            t0 = time.perf_counter()
            busy.append(await _worst_lag(fork_and_delete))
            took = time.perf_counter() - t0
            idle.append(await _worst_lag(partial(asyncio.sleep, took)))
    return [
        Figure(
            G,
            f"event-loop stall during fork + delete of a {LONG:,}-msg session",
            ms(median(busy)),
            baseline=ms(median(idle)),
            baseline_name="idle loop, same probe",
            target="< 5 ms",
            check=("value", "<", 5),
            samples=len(busy),
            note="longest gap of a 1 ms ticker beyond its tick; SQLite runs on the store's worker thread",
        )
    ]


def _cli_list(ctx: Ctx) -> list[Figure]:
    """`crow sessions list` on an empty store vs `crow --help`, fresh processes, interleaved."""
    home = ctx.home("cli")
    env = agent_env(home)
    subprocess.run([*CROW_CMD, "sessions", "list"], env=env, check=True)  # creates the empty store
    runs: dict[str, list[float]] = {"help": [], "list": []}
    for _ in range(ctx.reps(20, 6)):
        for name, args in (("help", ["--help"]), ("list", ["sessions", "list"])):
            t0 = time.perf_counter()
            subprocess.run([*CROW_CMD, *args], env=env, check=True, stdout=subprocess.DEVNULL)
            runs[name].append(time.perf_counter() - t0)
    return [
        Figure(
            G,
            "crow sessions list, empty store",
            ms(median(runs["list"])),
            baseline=ms(median(runs["help"])),
            baseline_name="crow --help",
            target="ratio <= 1.3",
            check=("ratio", "<=", 1.3),
            samples=len(runs["list"]),
        )
    ]


async def _end_to_end(ctx: Ctx, home: Path) -> list[Figure]:
    """`session/load` of the long session against a crow that has finished warming up."""
    from tests.llm_server import Reply, ScriptedLLM

    n = ctx.reps(5, 2)
    warm, cold = [], []
    with ScriptedLLM(default=Reply(text="ok")) as llm:
        for _ in range(n):
            async with spawn(CROW_CMD, agent_env(home, llm), home) as (conn, _proc, client):
                t0 = time.perf_counter()
                init = await initialize(conn)
                if not init.agent_capabilities.load_session:
                    return [not_measured(G, "session/load end to end", "crow does not advertise loadSession")]
                # cold: what an editor does right after starting crow
                await conn.load_session(cwd=str(home), session_id="long", mcp_servers=[])
                cold.append(time.perf_counter() - t0)
                fresh = await conn.new_session(cwd=str(home), mcp_servers=[])
                await prompt_text(conn, fresh.session_id, "warm up")
                # warm: the store open, everything imported; another copy of the session
                before = client.updates
                t0 = time.perf_counter()
                await conn.load_session(cwd=str(home), session_id="long2", mcp_servers=[])
                warm.append(time.perf_counter() - t0)
                if client.updates - before < LONG * 3 // 4:  # a finished tool call is one update
                    raise RuntimeError(f"replay sent {client.updates - before} updates")
    raw = await _raw_load(home, n)
    return [
        Figure(
            G,
            f"session/load {LONG:,} msgs, warm crow, raw JSON reader",
            ms(median(raw)),
            target="< 300 ms",
            check=("value", "<", 300),
            samples=n,
            note="crow's side: the client only splits lines and finds the response",
        ),
        Figure(
            G,
            f"session/load {LONG:,} msgs, warm crow, ACP Python client",
            ms(median(warm)),
            samples=n,
            note="includes the SDK client validating every notification",
        ),
        Figure(
            G,
            f"initialize + session/load {LONG:,} msgs, cold",
            ms(median(cold)),
            samples=n,
            note="includes crow's background warm-up (MCP import, store open), which load awaits",
        ),
    ]


async def _raw_load(home: Path, n: int) -> list[float]:
    """The same warm `session/load`, read as raw JSON lines: what crow itself costs."""
    import asyncio
    import json

    proc = await asyncio.create_subprocess_exec(
        *CROW_CMD,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=agent_env(home),
        limit=2**26,
    )
    assert proc.stdin is not None and proc.stdout is not None
    stdout = proc.stdout

    async def call(rid: int, method: str, params: dict) -> None:
        proc.stdin.write(
            (json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n").encode()
        )
        while json.loads(await stdout.readline()).get("id") != rid:
            pass

    times = []
    try:
        await call(1, "initialize", {"protocolVersion": 1})
        await call(2, "session/list", {})  # waits for the warm-up
        for i in range(n):
            t0 = time.perf_counter()
            await call(10 + i, "session/load", {"sessionId": "long2", "cwd": str(home), "mcpServers": []})
            times.append(time.perf_counter() - t0)
            await call(100 + i, "session/close", {"sessionId": "long2"})
    finally:
        proc.stdin.close()
        await proc.wait()
    return times


async def run(ctx: Ctx) -> list[Figure]:
    home = ctx.home("store")
    await _fill(home, "long", LONG)
    await _fill(home, "long2", LONG)
    await _fill(home, "short", 10)
    try:
        figures = await _end_to_end(ctx, home)
    except Exception as exc:
        figures = [not_measured(G, "session/load end to end", describe(exc))]
    return [*await _in_process(ctx, home), *await _stall(ctx, home), *_cli_list(ctx), *figures]
