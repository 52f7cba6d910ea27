"""Concurrency: 50 sessions in one agent process, each running 10 prompts back to back,
all at once, against a scripted model that takes 20 ms per answer. Fully concurrent, that
is 10 x 20 ms; crow is compared with that ideal and with the bare streaming agent.

The model is bench/llm_proc.py (asyncio, own process), not tests.llm_server: see there."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.common import (
    CROW_CMD,
    STREAM_CMD,
    Ctx,
    Figure,
    agent_env,
    describe,
    initialize,
    median,
    model_process,
    ms,
    not_measured,
    prompt_text,
    spawn,
)

G = "concurrency"
SESSIONS, TURNS, LATENCY = 50, 10, 0.020


async def _wall(ctx: Ctx, cmd: list[str], llm: Any) -> float:
    home = ctx.home("conc")
    async with spawn(cmd, agent_env(home, llm), home) as (conn, _proc, _client):
        await initialize(conn)
        sids = [(await conn.new_session(cwd=str(home), mcp_servers=[])).session_id
                for _ in range(SESSIONS)]

        async def turns(sid: str, n: int) -> None:
            for i in range(n):
                reply = await prompt_text(conn, sid, f"turn {i}")
                if reply.stop_reason != "end_turn":
                    raise RuntimeError(f"prompt ended {reply.stop_reason}")

        await asyncio.gather(*(turns(s, 1) for s in sids))  # warm: tools connected, titles set
        t0 = time.perf_counter()
        await asyncio.gather(*(turns(s, TURNS) for s in sids))
        return time.perf_counter() - t0


async def run(ctx: Ctx) -> list[Figure]:
    reps = ctx.reps(3, 1)
    crow: list[float] = []
    bare: list[float] = []
    with model_process(LATENCY) as llm:
        try:
            for _ in range(reps):
                bare.append(await _wall(ctx, STREAM_CMD, llm))
                crow.append(await _wall(ctx, CROW_CMD, llm))
        except Exception as exc:
            return [not_measured(G, f"{SESSIONS} sessions x {TURNS} turns", describe(exc))]
    ideal = TURNS * LATENCY
    name = f"{SESSIONS} sessions x {TURNS} turns, {LATENCY * 1000:.0f} ms model"
    return [
        Figure(G, name, ms(median(crow)), baseline=ms(ideal), baseline_name="ideal",
               samples=reps, note=f"ideal = {TURNS} x {LATENCY * 1000:.0f} ms, every session in parallel"),
        Figure(G, name, ms(median(crow)), baseline=ms(median(bare)), baseline_name="stream agent",
               samples=reps),
    ]
