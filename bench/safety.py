"""Safety: what the sandbox and the environment policy cost.

- `execute true` under the bubblewrap sandbox vs the same backend without it (target: less
  than 15 ms more), interleaved call by call;
- the environment policy's work per tool call (the cached `child_environment(config)` and
  the copy a command hook makes) vs the same copy of the whole environment, as before the
  policy (target: less than 0.1 ms more);
- computing the policy once for a session (no target: it is cached).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.common import Ctx, Figure, median, ms, not_measured

G = "safety"


async def _pair(
    n: int, a: Callable[[], Awaitable[Any]], b: Callable[[], Awaitable[Any]]
) -> tuple[float, float]:
    """Median seconds of each, interleaved, after a few unrecorded rounds."""
    ta: list[float] = []
    tb: list[float] = []
    for i in range(n + 3):
        for fn, sink in ((a, ta), (b, tb)) if i % 2 else ((b, tb), (a, ta)):
            t0 = time.perf_counter()
            await fn()
            if i >= 3:
                sink.append(time.perf_counter() - t0)
    return median(ta), median(tb)


def _sync_pair(n: int, a: Callable[[], Any], b: Callable[[], Any], batch: int = 100) -> tuple[float, float]:
    """Median seconds per call of each, over interleaved batches of `batch` calls."""
    ta: list[float] = []
    tb: list[float] = []
    for i in range(n):
        for fn, sink in ((a, ta), (b, tb)) if i % 2 else ((b, tb), (a, ta)):
            t0 = time.perf_counter()
            for _ in range(batch):
                fn()
            sink.append((time.perf_counter() - t0) / batch)
    return median(ta), median(tb)


async def _sandbox(ctx: Ctx) -> Figure:
    from crow.environment import child_environment
    from mcp_servers.filesystem.backend import LocalBackend
    from mcp_servers.filesystem.sandbox import Sandbox, find_bwrap, probe

    name = "execute `true`, sandboxed (bwrap)"
    target = "< 15 ms more"
    bwrap = find_bwrap()
    why = "bubblewrap is not installed" if bwrap is None else probe(bwrap)
    if why is not None:
        return not_measured(G, name, why, target)
    ws = ctx.home("ws")
    env = child_environment()
    boxed = LocalBackend(ws, Sandbox.create([ws], hidden=[ctx.home("crow-home")], bwrap=bwrap), env)
    plain = LocalBackend(ws, None, env)

    async def run_boxed() -> None:
        result = await boxed.run("true", ws, 10)
        assert result.exit_code == 0, result

    async def run_plain() -> None:
        result = await plain.run("true", ws, 10)
        assert result.exit_code == 0, result

    n = ctx.reps(60, 15)
    sandboxed, unsandboxed = await _pair(n, run_boxed, run_plain)
    return Figure(G, name, ms(sandboxed), baseline=ms(unsandboxed), baseline_name="unsandboxed",
                  target=target, check=("diff", "<", 15.0), samples=n)  # fmt: skip


def _policy(ctx: Ctx) -> list[Figure]:
    from crow.config import Config
    from crow.environment import child_environment, compute_environment, provider_key_variables

    config = Config()
    child_environment(config)  # the session's first call computes it
    extra = {"CROW_HOOK_EVENT": "agent_stop", "CROW_SESSION_ID": "s"}

    def with_policy() -> dict[str, str]:
        return {**child_environment(config), **extra}

    def before() -> dict[str, str]:
        return {**os.environ, **extra}

    n = ctx.reps(200, 50)
    policy, whole = _sync_pair(n, with_policy, before)
    figures = [
        Figure(G, "environment policy per tool call", ms(policy), baseline=ms(whole),
               baseline_name="whole environment", target="< 0.1 ms more", check=("diff", "<", 0.1),
               samples=n),
    ]  # fmt: skip
    secrets = provider_key_variables(config)
    once, _ = _sync_pair(ctx.reps(40, 10), lambda: compute_environment(config.environment, os.environ, secrets),
                         lambda: None, batch=20)  # fmt: skip
    figures.append(Figure(G, "environment policy computed (once a session)", ms(once), target="-",
                          note=f"{len(os.environ)} variables in the environment", samples=40))  # fmt: skip
    return figures


async def run(ctx: Ctx) -> list[Figure]:
    return [await _sandbox(ctx), *_policy(ctx)]
