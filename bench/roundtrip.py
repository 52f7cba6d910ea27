"""Prompt round trip in steady state: a later prompt against an instant scripted model,
crow vs the bare streaming agent (one httpx call per prompt), interleaved prompt by prompt."""

from __future__ import annotations

import contextlib
import time

from bench.common import (
    CROW_CMD,
    STREAM_CMD,
    Ctx,
    Figure,
    agent_env,
    initialize,
    median,
    ms,
    not_measured,
    prompt_text,
    spawn,
    stderr_tail,
)

G = "roundtrip"


async def run(ctx: Ctx) -> list[Figure]:
    from tests.llm_server import Reply, ScriptedLLM

    n = ctx.reps(60, 20)
    with ScriptedLLM(default=Reply(text="ok")) as llm:
        async with contextlib.AsyncExitStack() as stack:
            return await _measure(ctx, llm, stack, n)


async def _measure(ctx: Ctx, llm: object, stack: contextlib.AsyncExitStack, n: int) -> list[Figure]:
    warm = 5
    times: dict[str, list[float]] = {"crow": [], "stream": []}
    agents = {}
    for name, cmd in (("crow", CROW_CMD), ("stream", STREAM_CMD)):
        home = ctx.home(name)
        conn, _proc, client = await stack.enter_async_context(spawn(cmd, agent_env(home, llm), home))
        await initialize(conn)
        session = await conn.new_session(cwd=str(home), mcp_servers=[])
        agents[name] = (conn, session.session_id, client, home)
    for i in range(warm + n):
        order = ["crow", "stream"] if i % 2 else ["stream", "crow"]
        for name in order:
            conn, sid, client, home = agents[name]
            t0 = time.perf_counter()
            reply = await prompt_text(conn, sid, f"prompt {i}")
            dt = time.perf_counter() - t0
            if client.text() != "ok" or reply.stop_reason != "end_turn":
                why = f"{name} answered {reply.stop_reason}; {stderr_tail(home)}"
                return [not_measured(G, "later prompt round trip", why)]
            if i >= warm:
                times[name].append(dt)
    return [
        Figure(G, "later prompt round trip", ms(median(times["crow"])),
               baseline=ms(median(times["stream"])), baseline_name="stream agent",
               target="ratio <= 2.0", check=("ratio", "<=", 2.0), samples=n),
    ]
