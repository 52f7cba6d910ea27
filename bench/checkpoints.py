"""Checkpoints: what the checkpoints hook adds to a `write_file` of a 100 KB file (the same
call through the ToolHub without the hook, interleaved, is the baseline), with the turn's
record in CROW_HOME and in PostgreSQL (a throwaway cluster on this machine, as store_pg's);
and putting back a turn that wrote 100 files with `/undo`'s own code (against writing those
100 files atomically, the disk work any restore must do)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.common import Ctx, Figure, median, ms, not_measured

G = "checkpoints"
SIZE = 100 * 1024
FILES = 100


def _content(i: int, size: int = SIZE) -> str:
    line = f"line of turn {i:06d} in a checkpointed file\n"
    return (line * (size // len(line) + 1))[:size]


async def _setup(ctx: Ctx) -> tuple[Any, Any, Any, Path]:
    from builtin_hooks.checkpoints import CheckpointsHook
    from crow.session import Session
    from crow.tools import ServerSpec, ToolHub
    from mcp_servers.filesystem.server import build_server

    home, ws = ctx.home("home"), ctx.home("ws")
    hub = ToolHub()
    await hub.connect([ServerSpec("filesystem", "inprocess", server=build_server(ws))])
    session = Session("bench-session", ws, tools=hub)
    return CheckpointsHook(home), session, hub, ws


def _ctx(session: Any, turn: str) -> Any:
    from crow.context import HookContext

    async def emit(event: Any) -> None:
        return None

    return HookContext(session, "bench", None, emit, prompt_id=turn)


async def _write_figure(ctx: Ctx, store: Any = None) -> Figure:
    """`store`: one keeping side records (PostgreSQL), where the records then go."""
    from crow.messages import ToolCall

    hook, session, hub, _ = await _setup(ctx)
    session.store = store
    n = ctx.reps(200, 40)
    plain: list[float] = []
    checked: list[float] = []
    try:
        for i in range(n + 10):
            # each checkpointed write is a turn's first change to its file: the full cost
            # (copy of the old content, the record, the hash of what it left)
            for path, sink in (("plain.txt", plain), ("checked.txt", checked))[:: 1 if i % 2 else -1]:
                call = ToolCall(f"c{i}", "write_file", {"path": path, "content": _content(i)})
                t0 = time.perf_counter()
                if sink is plain:
                    result = await hub.call(call)
                else:
                    result = await hook.wrap_tool_call(_ctx(session, f"turn-{i}"), call, hub.call)
                if i >= 10:
                    sink.append(time.perf_counter() - t0)
                assert not result.is_error, result
    finally:
        await hub.aclose()
    where = "" if store is None else ", record in PostgreSQL"
    return Figure(G, f"write_file 100 KB, checkpointed (first change of the turn{where})", ms(median(checked)),
                  baseline=ms(median(plain)), baseline_name="write_file without the hook",
                  target="adds < 2 ms", check=("diff", "<", 2.0), samples=n,
                  note="the write itself fsyncs twice; the checkpoint is not fsynced (checked by hash)")  # fmt: skip


async def _undo_figure(ctx: Ctx) -> Figure:
    """The whole `/undo` (`crow.rewind.rewind`): the files put back, then the conversation's
    context and the report stored, in a session on a real SQLite store."""
    from crow import rewind as rw
    from crow.messages import ToolCall, ai, human
    from crow.store import SQLiteStore
    from mcp_servers.filesystem.localfs import write_bytes

    hook, session, hub, ws = await _setup(ctx)
    n = ctx.reps(9, 3)
    undo: list[float] = []
    rewrite: list[float] = []
    try:
        async with SQLiteStore(hook.home / "bench.db", home=hook.home) as store:
            await store.create_session(id=session.id, cwd=str(ws))
            session.store = store
            for rep in range(n):
                for f in range(FILES):
                    (ws / f"src/f{f:03d}.py").parent.mkdir(exist_ok=True)
                    (ws / f"src/f{f:03d}.py").write_text(_content(f, 4096))
                await session.add(rw.as_prompt(human(f"rewrite the sources, take {rep}")))
                tctx = _ctx(session, session.messages[-1].id)
                for f in range(FILES):
                    args = {"path": f"src/f{f:03d}.py", "content": _content(f + rep + 1, 4096)}
                    result = await hook.wrap_tool_call(tctx, ToolCall(f"w{f}", "write_file", args), hub.call)
                    assert not result.is_error, result
                await session.add(ai("done"))
                await hook.after_agent(tctx)
                t0 = time.perf_counter()
                done = await rw.rewind(session, 1, hook.home)
                undo.append(time.perf_counter() - t0)
                assert len(done.files.restored) == FILES and not done.files.skipped, done
                data = [(ws / f"src/f{f:03d}.py", _content(f, 4096).encode()) for f in range(FILES)]
                t0 = time.perf_counter()
                for path, body in data:
                    write_bytes(ws, path, body)
                rewrite.append(time.perf_counter() - t0)
    finally:
        await hub.aclose()
    return Figure(G, f"/undo of a turn that wrote {FILES} files (4 KB each)", ms(median(undo)),
                  baseline=ms(median(rewrite)), baseline_name=f"{FILES} atomic writes alone",
                  target="< 300 ms", check=("value", "<", 300.0), samples=n,
                  note="crow.rewind.rewind: the files, then the context and the report in one transaction")  # fmt: skip


async def run(ctx: Ctx) -> list[Figure]:
    try:
        import mcp_servers.filesystem  # noqa: F401
    except ImportError as exc:
        return [not_measured(G, "checkpoints", f"mcp_servers.filesystem: {exc}")]
    return [await _write_figure(ctx), *await _in_postgres(ctx), await _undo_figure(ctx)]


async def _in_postgres(ctx: Ctx) -> list[Figure]:
    from bench.store_pg import on_postgres

    async def measure(url: str) -> list[Figure]:
        from crow.store.postgres import PostgresStore

        async with PostgresStore(url) as store:
            return [await _write_figure(ctx, store)]

    what = "write_file 100 KB, checkpointed (first change of the turn, record in PostgreSQL)"
    return await on_postgres(G, what, "adds < 2 ms", measure)
