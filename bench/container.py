"""Container backend: a tool call inside a session's container (Podman over its Docker API)
against the same call on the local disk, both through the ToolHub as crow calls them, and the
first call of a session (the container made and started, the helper exec'd) on its own.

The engine: DOCKER_HOST when set (its image: CROW_BENCH_IMAGE), else the test suite's
Podman service and image (tests/support/podman.py; not measured where it cannot run).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import Ctx, Figure, median, ms, not_measured

G = "container"


@contextlib.contextmanager
def _engine(ctx: Ctx) -> Iterator[tuple[str, str]]:
    """(DOCKER_HOST, image)."""
    if os.environ.get("DOCKER_HOST") and os.environ.get("CROW_BENCH_IMAGE"):
        yield os.environ["DOCKER_HOST"], os.environ["CROW_BENCH_IMAGE"]
        return
    from tests.support.podman import podman_service

    with podman_service(ctx.home("podman")) as engine:
        yield engine.docker_host, engine.image


async def run(ctx: Ctx) -> list[Figure]:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per engine request otherwise
    try:
        with _engine(ctx) as (host, image):
            return await _measure(ctx, host, image)
    except BaseException as exc:  # pytest's skip/fail outcomes are BaseExceptions
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return [not_measured(G, "tool calls in a container", f"{type(exc).__name__}: {exc}")]


def _session(host: str, image: str, ws: Path, sid: str) -> Any:
    from crow.config import BackendConfig
    from mcp_servers.filesystem.container.backend import ContainerSession
    from mcp_servers.filesystem.container.engine import DockerEngine

    config = BackendConfig(type="docker", image=image)
    return ContainerSession(config, sid, [ws], lambda: DockerEngine.from_env({"DOCKER_HOST": host}))


async def _hub(server: Any) -> Any:
    from crow.tools import ServerSpec, ToolHub

    hub = ToolHub()
    await hub.connect([ServerSpec("fs", "inprocess", server=server)])
    if hub.failures:
        raise RuntimeError("; ".join(hub.failures))
    return hub


async def _measure(ctx: Ctx, host: str, image: str) -> list[Figure]:
    from crow.messages import ToolCall
    from mcp_servers.filesystem.server import build_server

    ws = ctx.home("ws")
    (ws / "small.txt").write_text("".join(f"line {i}\n" for i in range(40)))
    read = ToolCall("r", "read_file", {"path": "small.txt"})
    true = ToolCall("x", "execute", {"command": "true"})
    n = ctx.reps(200, 40)
    firsts: list[float] = []
    closes: list[float] = []
    for i in range(ctx.reps(5, 2)):  # a new session each time: the container made at its first call
        cs = _session(host, image, ws, f"bench-first-{os.getpid()}-{i}")
        hub = await _hub(build_server(None, files=cs, backend=cs))
        t0 = time.perf_counter()
        result = await hub.call(read)
        firsts.append(time.perf_counter() - t0)
        if result.is_error:
            raise RuntimeError(result.output[:300])
        t0 = time.perf_counter()
        await hub.aclose()
        await cs.aclose()
        closes.append(time.perf_counter() - t0)

    cs = _session(host, image, ws, f"bench-{os.getpid()}")
    local = await _hub(build_server(ws))
    inside = await _hub(build_server(None, files=cs, backend=cs))
    figures: list[Figure] = []
    try:
        for call, name, limit in ((read, "read_file (40 lines)", 5.0), (true, "execute true", 30.0)):
            first = await inside.call(call)
            if first.is_error:
                raise RuntimeError(first.output[:300])
            a: list[float] = []
            b: list[float] = []
            for j in range(n + 10):
                for hub, sink in ((local, a), (inside, b)) if j % 2 else ((inside, b), (local, a)):
                    t0 = time.perf_counter()
                    await hub.call(call)
                    if j >= 10:
                        sink.append(time.perf_counter() - t0)
            figures.append(Figure(
                G, f"{name} in the container", ms(median(b)), baseline=ms(median(a)),
                baseline_name="local disk", target=f"< {limit:g} ms more", check=("diff", "<", limit),
                samples=n,
            ))  # fmt: skip
    finally:
        await inside.aclose()
        await local.aclose()
        await cs.aclose()
    figures.append(Figure(G, "first tool call of a session (container made, started, helper up)",
                          ms(median(firsts)), target="reported", samples=len(firsts)))  # fmt: skip
    figures.append(Figure(G, "session's tools closed (container removed)", ms(median(closes)),
                          target="reported", samples=len(closes)))  # fmt: skip
    return figures
