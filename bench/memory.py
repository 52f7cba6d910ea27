"""Memory: peak RSS (VmHWM) of the agent process after its first prompt, crow vs the echo
agent; resident memory (VmRSS) of one crow process holding 1, then 100, then 200 idle
sessions (the service target: 200 idle sessions in < 150 MB)."""

from __future__ import annotations

import asyncio

from bench.common import (
    CROW_CMD,
    ECHO_CMD,
    Ctx,
    Figure,
    agent_env,
    initialize,
    median,
    not_measured,
    prompt_text,
    spawn,
    stderr_tail,
    vm_hwm_kb,
)

G = "memory"


async def _peak_after_first_prompt(ctx: Ctx, cmd: list[str], llm: object) -> float:
    home = ctx.home("mem")
    async with spawn(cmd, agent_env(home, llm), home) as (conn, proc, _client):
        await initialize(conn)
        session = await conn.new_session(cwd=str(home), mcp_servers=[])
        reply = await prompt_text(conn, session.session_id, "hello")
        if reply.stop_reason != "end_turn":
            raise RuntimeError(f"prompt ended {reply.stop_reason}: {stderr_tail(home)}")
        kb = vm_hwm_kb(proc.pid)
    if kb is None:
        raise RuntimeError("no /proc/<pid>/status")
    return kb / 1024


async def _settled_rss(pid: int, quiet: float = 1.0, limit: float = 30.0) -> float:
    """VmRSS once it has stopped moving (sessions connect their tools in the background)."""
    last, still, waited = -1, 0.0, 0.0
    while waited < limit:
        await asyncio.sleep(0.25)
        waited += 0.25
        kb = vm_hwm_kb(pid, "VmRSS") or 0
        if abs(kb - last) < 256:
            still += 0.25
            if still >= quiet:
                return kb / 1024
        else:
            still = 0.0
        last = kb
    return last / 1024


async def _idle_sessions(ctx: Ctx, llm: object, counts: tuple[int, ...]) -> list[float]:
    """Settled RSS of one crow process as it holds each count of idle sessions in turn."""
    home = ctx.home("idle")
    rss: list[float] = []
    async with spawn(CROW_CMD, agent_env(home, llm), home) as (conn, proc, _client):
        await initialize(conn)
        first = await conn.new_session(cwd=str(home), mcp_servers=[])
        await prompt_text(conn, first.session_id, "hello")  # everything imported and warm
        held = 1
        for n in counts:
            for _ in range(n - held):
                await conn.new_session(cwd=str(home), mcp_servers=[])
            held = n
            rss.append(await _settled_rss(proc.pid))
    return rss


async def run(ctx: Ctx) -> list[Figure]:
    from tests.llm_server import Reply, ScriptedLLM

    reps = ctx.reps(3, 1)
    crow, echo = [], []
    with ScriptedLLM(default=Reply(text="ok")) as llm:
        try:
            for _ in range(reps):
                echo.append(await _peak_after_first_prompt(ctx, ECHO_CMD, None))
                crow.append(await _peak_after_first_prompt(ctx, CROW_CMD, llm))
        except Exception as exc:
            return [not_measured(G, "peak RSS after first prompt", str(exc))]
        figures = [Figure(G, "peak RSS after first prompt", median(crow), "MB", baseline=median(echo),
                          baseline_name="echo agent", target="< 80 MB", check=("value", "<", 80),
                          samples=reps)]
        one, hundred, two_hundred = await _idle_sessions(ctx, llm, (1, 100, 200))
    figures += [
        Figure(G, "RSS, 1 idle session", one, "MB"),
        Figure(G, "RSS, 100 idle sessions", hundred, "MB", baseline=one, baseline_name="1 session",
               note=f"{(hundred - one) * 1024 / 99:.0f} KB per extra idle session"),
        Figure(G, "RSS, 200 idle sessions", two_hundred, "MB", baseline=one, baseline_name="1 session",
               target="< 150 MB", check=("value", "<", 150),
               note=f"one process, the same as the 100; {(two_hundred - one) * 1024 / 199:.0f} KB per extra "
                    "idle session"),
    ]
    return figures
