"""Tools: a call through the ToolHub (in-process MCP) vs the tool function called directly,
the filesystem server's grep vs the rg binary run directly with the same arguments, and
the local file I/O (atomic write, symlink-safe read) vs plain open/write and open/read."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import Ctx, Figure, median, ms, not_measured

G = "tools"
STDLIB = Path("/root/.pyenv/versions/3.11.7/lib/python3.11")
GREP_QUERIES = [  # (pattern, output_mode): few enough matches that no cap cuts the scan short
    ("__init_subclass__", "content"),
    ("lru_cache", "files_with_matches"),
]


async def echo(text: str) -> str:
    """Return the text."""
    return text


async def _pair(n: int, direct: Any, via_hub: Any, warm: int = 10) -> tuple[float, float]:
    """Median seconds of each, interleaved call by call, after `warm` unrecorded rounds."""
    a: list[float] = []
    b: list[float] = []
    for i in range(n + warm):
        for fn, sink in ((direct, a), (via_hub, b)) if i % 2 else ((via_hub, b), (direct, a)):
            t0 = time.perf_counter()
            await fn()
            if i >= warm:
                sink.append(time.perf_counter() - t0)
    return median(a), median(b)


def _through_session(server: Any) -> Any:
    """The server with a middleware of its own, which only an MCP session runs: the hub
    then connects it through `mcp.Client` instead of calling it directly."""

    async def through(ctx: Any, call_next: Any) -> Any:
        return await call_next(ctx)

    server.middleware.append(through)
    return server


async def _hub_figures(ctx: Ctx, direct_calls: bool = True) -> list[Figure]:
    """As crow calls its own servers (direct), or through an MCP session (info only)."""
    from crow import function_server
    from crow.messages import ToolCall
    from crow.tools import ServerSpec, ToolHub

    n = ctx.reps(400, 100)
    ws = ctx.home("ws")
    (ws / "small.txt").write_text("".join(f"line {i}\n" for i in range(40)))
    how = "" if direct_calls else " through an MCP session"
    target = ("overhead < 0.5 ms", ("diff", "<", 0.5)) if direct_calls else ("-", None)
    served = (lambda server: server) if direct_calls else _through_session
    specs = [ServerSpec("fn", "inprocess", server=served(function_server([(echo, True)])))]
    fs_server = None
    try:
        from mcp_servers.filesystem.server import build_server

        fs_server = build_server(ws)
        specs.append(ServerSpec("fs", "inprocess", server=served(fs_server)))
    except ImportError as exc:
        fs_missing = f"mcp_servers.filesystem: {exc}"
    hub = ToolHub()
    await hub.connect(specs)
    figures = []
    try:
        if hub.failures:
            raise RuntimeError("; ".join(hub.failures))

        async def hub_echo() -> None:
            result = await hub.call(ToolCall("c1", "echo", {"text": "hi"}))
            assert result.output == "hi", result

        direct, via = await _pair(n, lambda: echo("hi"), hub_echo)
        figures.append(Figure(G, f"ToolHub call{how}, async function tool", ms(via), baseline=ms(direct),
                              baseline_name="direct await", target=target[0], check=target[1], samples=n))
        if fs_server is None:
            figures.append(not_measured(G, "ToolHub call, read_file", fs_missing))
            return figures
        read_file = fs_server._tool_manager.get_tool("read_file").fn  # the undecorated tool

        async def hub_read() -> None:
            result = await hub.call(ToolCall("c2", "read_file", {"path": "small.txt"}))
            assert not result.is_error and "line 39" in result.output, result

        direct, via = await _pair(n, lambda: read_file(path="small.txt"), hub_read)
        figures.append(Figure(G, f"ToolHub call{how}, read_file (40 lines)", ms(via), baseline=ms(direct),
                              baseline_name="direct tool fn", target=target[0], check=target[1], samples=n))
    finally:
        await hub.aclose()
    return figures


def _rg_direct(argv: list[str]) -> None:
    subprocess.run(argv, cwd=STDLIB, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=False)


async def _grep_figures(ctx: Ctx) -> list[Figure]:
    from crow.messages import ToolCall
    from crow.tools import ServerSpec, ToolHub

    try:
        from mcp_servers.filesystem import search
        from mcp_servers.filesystem.server import build_server
    except ImportError as exc:
        return [not_measured(G, "grep vs rg", f"mcp_servers.filesystem: {exc}")]
    rg = search.find_rg()
    if rg is None:
        return [not_measured(G, "grep vs rg", "no rg binary")]
    hub = ToolHub()
    await hub.connect([ServerSpec("fs", "inprocess", server=build_server(STDLIB))])
    n = ctx.reps(7, 2)
    figures = []
    try:
        for pattern, mode in GREP_QUERIES:
            # the argv search._grep_rg builds for this query
            flag = {"content": ["--json"], "files_with_matches": ["-l", "--null"]}[mode]
            argv = [rg, "--no-config", "--no-messages", "--hidden", "--no-require-git", "--color=never",
                    "--glob", "!.git", *flag, "-e", pattern, "--", "."]
            call = ToolCall("g", "grep", {"pattern": pattern, "output_mode": mode, "max_results": 10_000})
            _rg_direct(argv)  # warm the page cache
            first = await hub.call(call)
            if first.is_error or (first.meta or {}).get("structured", {}).get("truncated"):
                raise RuntimeError(f"grep failed: {first.text[:200]}")

            async def via_hub(call: ToolCall = call) -> None:
                await hub.call(call)

            async def direct(argv: list[str] = argv) -> None:
                _rg_direct(argv)

            base, tool = await _pair(n, direct, via_hub, warm=0)
            figures.append(Figure(G, f"grep {mode} {pattern!r} over stdlib", ms(tool), baseline=ms(base),
                                  baseline_name="rg direct", target="ratio <= 1.2",
                                  check=("ratio", "<=", 1.2), samples=n))
    finally:
        await hub.aclose()
    return figures


async def _file_io_figures(ctx: Ctx) -> list[Figure]:
    """What write_file/read_file do to the disk (localfs: temp file + fsync + rename; a
    walk from the root with O_NOFOLLOW) against the plain calls, same files, interleaved."""
    try:
        from mcp_servers.filesystem import LocalBackend
    except ImportError as exc:
        return [not_measured(G, "write_file 1 MB, atomic vs plain", f"mcp_servers.filesystem: {exc}")]
    ws = ctx.home("io")
    (ws / "src" / "pkg").mkdir(parents=True)
    backend = LocalBackend(ws)
    big = "".join(f"line {i:07d} of a one megabyte file\n" for i in range(1 << 20 >> 5))[: 1 << 20]
    atomic_path, plain_path = ws / "src" / "pkg" / "atomic.txt", ws / "src" / "pkg" / "plain.txt"
    small = ws / "src" / "pkg" / "small.py"
    small.write_text("".join(f"line {i}\n" for i in range(40)))

    async def plain_write() -> None:
        with open(plain_path, "w", encoding="utf-8", newline="") as f:
            f.write(big)

    async def plain_durable_write() -> None:
        with open(plain_path, "w", encoding="utf-8", newline="") as f:
            f.write(big)
            f.flush()
            os.fsync(f.fileno())

    async def atomic_write() -> None:
        await backend.write_text(atomic_path, big)

    async def plain_read() -> None:
        with open(small, "rb") as f:
            f.read().decode("utf-8")

    async def safe_read() -> None:
        await backend.read_text(small)

    n = ctx.reps(60, 15)
    figures = [await _write_file_tool_figure(ctx, ws, big, n)]
    plain, atomic = await _pair(n, plain_write, atomic_write, warm=5)
    figures.append(Figure(G, "write 1 MB to disk, atomic (temp + fsync + rename)", ms(atomic),
                          baseline=ms(plain), baseline_name="open/write/close", target="-", samples=n,
                          note="the disk work alone: two fsyncs and a new inode per write (a plain "
                               "write reuses the old one)"))  # fmt: skip
    durable, atomic = await _pair(n, plain_durable_write, atomic_write, warm=5)
    figures.append(Figure(G, "write 1 MB to disk, atomic vs a plain durable write", ms(atomic),
                          baseline=ms(durable), baseline_name="open/write/fsync/close", target="-",
                          samples=n))  # fmt: skip
    n = ctx.reps(2000, 300)
    plain, safe = await _pair(n, plain_read, safe_read)
    figures.append(Figure(G, "read_file 40 lines from disk, O_NOFOLLOW walk (depth 3)", ms(safe),
                          baseline=ms(plain), baseline_name="open/read/close", target="overhead < 0.05 ms",
                          check=("diff", "<", 0.05), samples=n))  # fmt: skip
    return figures


async def _write_file_tool_figure(ctx: Ctx, ws: Path, big: str, n: int) -> Figure:
    """The write_file tool as crow calls it, overwriting a 1 MB file: the atomic path
    against the same server writing the way crow did before (open, truncate, write; in a
    worker thread above 256 KB)."""
    import anyio

    from crow.messages import ToolCall
    from crow.tools import ServerSpec, ToolHub
    from mcp_servers.filesystem import LocalBackend
    from mcp_servers.filesystem.server import build_server

    def write(path: Path, text: str) -> None:
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(text)

    class PlainWrites(LocalBackend):
        async def write_text(self, path: Path, text: str) -> None:
            await anyio.to_thread.run_sync(write, path, text)

    hub = ToolHub()
    await hub.connect([
        ServerSpec("atomic", "inprocess", server=build_server(ws)),
        ServerSpec("plain", "inprocess", server=build_server(ws, backend=PlainWrites(ws))),
    ])  # fmt: skip
    try:
        plain_name = next(s.name for s in hub.specs() if s.name != "write_file" and s.name.endswith("write_file"))

        async def call(name: str, path: str) -> None:
            result = await hub.call(ToolCall("w", name, {"path": path, "content": big}))
            assert not result.is_error, result.text

        plain, atomic = await _pair(
            n, lambda: call(plain_name, "plain.txt"), lambda: call("write_file", "atomic.txt"), warm=5
        )
    finally:
        await hub.aclose()
    return Figure(G, "write_file 1 MB (overwrite), atomic path", ms(atomic), baseline=ms(plain),
                  baseline_name="same tool, plain write", target="ratio < 1.3", check=("ratio", "<", 1.3),
                  samples=n, note="temp file + fsync + rename + folder fsync, under the per-path lock")  # fmt: skip


async def run(ctx: Ctx) -> list[Figure]:
    return [
        *await _hub_figures(ctx),
        *await _hub_figures(ctx, direct_calls=False),
        *await _grep_figures(ctx),
        *await _file_io_figures(ctx),
    ]
