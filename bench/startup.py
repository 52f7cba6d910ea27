"""Startup: spawn -> `initialize` answered (crow vs the bare echo agent), `session/new`
right after `initialize` and again once crow is warm, `session/delete` of the prompted
session, and spawn -> initialize + session/new + first prompt answered."""

from __future__ import annotations

import time

from bench.common import (
    CROW_CMD,
    ECHO_CMD,
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

G = "startup"


def _trusted_project(ctx: Ctx, env: dict[str, str]) -> str:
    """A repository whose crow.yaml the user trusted (`crow trust`)."""
    import subprocess
    from pathlib import Path

    root = ctx.home("project")
    (Path(root) / ".git").mkdir()
    (Path(root) / "crow.yaml").write_text("mode: accept_edits\npermissions:\n  allow: [read_file]\n")
    subprocess.run([*CROW_CMD, "trust", str(root)], env=env, check=True, capture_output=True)
    return str(root)


async def _one(
    ctx: Ctx, cmd: list[str], llm: object, *, full: bool, project: bool = False
) -> dict[str, float]:
    home = ctx.home("home")
    env = agent_env(home, llm)
    cwd = _trusted_project(ctx, env) if project else str(home)
    t0 = time.perf_counter()
    out: dict[str, float] = {}
    async with spawn(cmd, env, home) as (conn, _proc, client):
        await initialize(conn)
        out["init"] = time.perf_counter() - t0
        if full:
            t1 = time.perf_counter()
            session = await conn.new_session(cwd=cwd, mcp_servers=[])
            out["new"] = time.perf_counter() - t1
            out["to_new"] = time.perf_counter() - t0
            reply = await prompt_text(conn, session.session_id, "hello")
            out["to_prompt"] = time.perf_counter() - t0
            if reply.stop_reason != "end_turn" or "ok" not in client.text():
                raise RuntimeError(f"first prompt: stop_reason={reply.stop_reason}; {stderr_tail(home)}")
            t3 = time.perf_counter()  # the SDK 0.12.1 has no session/delete method: sent raw
            await conn._conn.send_request("session/delete", {"sessionId": session.session_id})
            out["delete"] = time.perf_counter() - t3
            t2 = time.perf_counter()
            await conn.new_session(cwd=str(home), mcp_servers=[])
            out["new_warm"] = time.perf_counter() - t2
    return out


async def run(ctx: Ctx) -> list[Figure]:
    from tests.llm_server import Reply, ScriptedLLM

    n = ctx.reps(12, 3)
    crow: list[dict[str, float]] = []
    echo: list[dict[str, float]] = []
    with ScriptedLLM(default=Reply(text="ok")) as llm:
        await _one(ctx, ECHO_CMD, None, full=False)  # warm the page cache, .pyc files
        try:
            await _one(ctx, CROW_CMD, llm, full=True)
        except Exception as exc:
            return [not_measured(G, "spawn -> initialize", f"crow failed to start: {exc}")]
        for i in range(n):  # interleaved, alternating who goes first
            pair = [(ECHO_CMD, None, False, echo), (CROW_CMD, llm, True, crow)]
            for cmd, model, full, sink in pair if i % 2 else pair[::-1]:
                sink.append(await _one(ctx, cmd, model, full=full))
        # session/new in a trusted project: its crow.yaml composed over the user's config
        projects = [await _one(ctx, CROW_CMD, llm, full=True, project=True) for _ in range(ctx.reps(6, 2))]
    base = median([r["init"] for r in echo])
    return [
        Figure(G, "spawn -> initialize", ms(median([r["init"] for r in crow])), baseline=ms(base),
               baseline_name="echo agent", target="ratio <= 1.15", check=("ratio", "<=", 1.15),
               samples=n),
        Figure(G, "session/new after initialize", ms(median([r["new"] for r in crow])),
               target="< 10 ms", check=("value", "<", 10), samples=n),
        Figure(G, "session/new after initialize, in a trusted project", ms(median([r["new"] for r in projects])),
               baseline=ms(median([r["new"] for r in crow])), baseline_name="no project file",
               target="< 10 ms", check=("value", "<", 10), samples=len(projects)),
        Figure(G, "session/new on a warm crow (after a prompt)", ms(median([r["new_warm"] for r in crow])),
               target="< 10 ms", check=("value", "<", 10), samples=n),
        Figure(G, "session/delete (a session with one prompt, live)", ms(median([r["delete"] for r in crow])),
               target="< 20 ms", check=("value", "<", 20), samples=n),
        Figure(G, "spawn -> session/new", ms(median([r["to_new"] for r in crow])),
               baseline=ms(base), baseline_name="echo: initialize", samples=n),
        Figure(G, "spawn -> first prompt answered", ms(median([r["to_prompt"] for r in crow])),
               baseline=ms(base), baseline_name="echo: initialize", target="< 2000 ms",
               check=("value", "<", 2000), samples=n),
    ]
