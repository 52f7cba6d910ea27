"""Concurrency: 50 sessions in one agent process, each running 10 prompts back to back,
all at once, against a scripted model that takes 20 ms per answer. Fully concurrent, that
is 10 x 20 ms; crow is compared with that ideal and with the bare streaming agent.

Three ways in, one process each time:
- stdio, the ACP Python SDK client (what an editor does): today's figure;
- stdio, a raw JSON-lines client that only splits lines and matches ids: crow's own share
  (the SDK client validates every notification with pydantic, on the same 2 cores);
- ONE WebSocket connection to `crow serve --listen ws://127.0.0.1:0` carrying all 50
  sessions, with the SDK's own WebSocket client (`acp.ws`): the service figure, target
  <= 3x the ideal. The SDK client is used, not a raw one: over stdio it costs ~0.2 s of
  CPU in a run of ~1.5 s (measured beside the raw client), so it does not decide the figure.

The model is bench/llm_proc.py (asyncio, own process), not tests.llm_server: see there."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.common import (
    CROW_CMD,
    STREAM_CMD,
    Ctx,
    Figure,
    QuietClient,
    agent_env,
    describe,
    initialize,
    median,
    model_process,
    ms,
    not_measured,
    prompt_text,
    spawn,
    stderr_tail,
)

G = "concurrency"
SESSIONS, TURNS, LATENCY = 50, 10, 0.020
LISTENING = re.compile(r"crow: listening on (ws://\S+)")

Prompt = Callable[[str, str], Awaitable[str]]  # (session id, text) -> stop reason
Timed = tuple[float, float | None]  # wall seconds, the agent's CPU seconds (None: unknown)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU of process `pid` so far (Linux), None elsewhere. On a loaded
    machine it is the steadier figure: wall time waits for the other processes."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _rounds(new_session: Callable[[], Awaitable[str]], prompt: Prompt, pid: int) -> Timed:
    """Make the sessions, warm each with one turn (tools connected, titles set), then time
    TURNS turns in every session at once: the wall time, and agent `pid`'s CPU in it."""
    sids = [await new_session() for _ in range(SESSIONS)]

    async def turns(sid: str, n: int) -> None:
        for i in range(n):
            stop = await prompt(sid, f"turn {i}")
            if stop != "end_turn":
                raise RuntimeError(f"prompt ended {stop}")

    await asyncio.gather(*(turns(s, 1) for s in sids))
    cpu0, t0 = cpu_seconds(pid), time.perf_counter()
    await asyncio.gather(*(turns(s, TURNS) for s in sids))
    wall, cpu1 = time.perf_counter() - t0, cpu_seconds(pid)
    return wall, None if cpu0 is None or cpu1 is None else cpu1 - cpu0


async def _sdk_stdio(ctx: Ctx, cmd: list[str], llm: Any) -> Timed:
    home = ctx.home("conc")
    async with spawn(cmd, agent_env(home, llm), home) as (conn, proc, _client):
        await initialize(conn)
        return await _rounds(*_sdk_calls(conn, home), proc.pid)


def _sdk_calls(conn: Any, home: Path) -> tuple[Callable[[], Awaitable[str]], Prompt]:
    async def new_session() -> str:
        return (await conn.new_session(cwd=str(home), mcp_servers=[])).session_id

    async def prompt(sid: str, text: str) -> str:
        return (await prompt_text(conn, sid, text)).stop_reason

    return new_session, prompt


class _RawStdio:
    """JSON-RPC over crow's stdio with nothing but json.loads: requests matched to answers
    by id, notifications counted, a request from crow refused."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self._stdin, self._stdout = proc.stdin, proc.stdout
        self._next = 0
        self._waiting: dict[int, asyncio.Future[dict]] = {}
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        while line := await self._stdout.readline():
            msg = json.loads(line)
            if "method" not in msg:
                self._waiting.pop(msg["id"]).set_result(msg)
            elif "id" in msg:
                self._send({"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": "no"}})
        for fut in self._waiting.values():
            fut.set_exception(RuntimeError("crow closed its stdout"))

    def _send(self, msg: dict) -> None:
        self._stdin.write(json.dumps(msg).encode() + b"\n")

    async def call(self, method: str, params: dict) -> dict:
        self._next += 1
        fut = asyncio.get_running_loop().create_future()
        self._waiting[self._next] = fut
        self._send({"jsonrpc": "2.0", "id": self._next, "method": method, "params": params})
        msg = await fut
        if "error" in msg:
            raise RuntimeError(f"{method}: {msg['error']}")
        return msg["result"]


async def _raw_stdio(ctx: Ctx, llm: Any) -> Timed:
    home = ctx.home("conc-raw")
    with open(home / "agent-stderr.log", "wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *CROW_CMD, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
            env=agent_env(home, llm), cwd=str(home), limit=2**24,
        )  # fmt: skip
    raw = _RawStdio(proc)
    try:
        await raw.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})

        async def new_session() -> str:
            return (await raw.call("session/new", {"cwd": str(home), "mcpServers": []}))["sessionId"]

        async def prompt(sid: str, text: str) -> str:
            params = {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}
            return (await raw.call("session/prompt", params))["stopReason"]

        return await _rounds(new_session, prompt, proc.pid)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        await proc.wait()


@contextlib.asynccontextmanager
async def serving_ws(home: Path, llm: Any) -> AsyncIterator[tuple[str, str, int]]:
    """`crow serve --listen ws://127.0.0.1:0` with a fresh token: (its URL, the token, its
    pid), the port read from crow's stderr line `crow: listening on ws://HOST:PORT`."""
    token = secrets.token_urlsafe(24)
    err_path = home / "agent-stderr.log"
    with open(err_path, "wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *CROW_CMD, "serve", "--listen", "ws://127.0.0.1:0", stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=err, env=agent_env(home, llm, CROW_SERVER_TOKEN=token),
            cwd=str(home),
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (found := LISTENING.search(err_path.read_text(errors="replace"))):
            if proc.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"crow serve --listen did not start: {stderr_tail(home)}")
            await asyncio.sleep(0.05)
        yield found.group(1), token, proc.pid
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()


async def _sdk_ws(ctx: Ctx, llm: Any) -> Timed:
    import acp
    from acp.ws import create_websocket_stream

    home = ctx.home("conc-ws")
    async with serving_ws(home, llm) as (url, token, pid):
        transport = await create_websocket_stream(url, headers={"Authorization": f"Bearer {token}"})
        conn = acp.connect_to_agent(QuietClient(), transport)
        try:
            await initialize(conn)
            return await _rounds(*_sdk_calls(conn, home), pid)
        finally:
            await conn.close()


async def run(ctx: Ctx) -> list[Figure]:
    reps = ctx.reps(3, 1)
    name = f"{SESSIONS} sessions x {TURNS} turns, {LATENCY * 1000:.0f} ms model"
    ideal = TURNS * LATENCY
    walls: dict[str, list[float]] = {"bare": [], "stdio": [], "raw": [], "ws": []}
    cpus: dict[str, list[float]] = {k: [] for k in walls}
    errors: dict[str, str] = {}
    with model_process(LATENCY) as llm:
        for _ in range(reps):  # interleaved, so the machine's load falls on all alike
            for key, measure in (
                ("bare", lambda: _sdk_stdio(ctx, STREAM_CMD, llm)),
                ("stdio", lambda: _sdk_stdio(ctx, CROW_CMD, llm)),
                ("raw", lambda: _raw_stdio(ctx, llm)),
                ("ws", lambda: _sdk_ws(ctx, llm)),
            ):
                if key in errors:
                    continue
                try:
                    wall, cpu = await measure()
                except Exception as exc:
                    errors[key] = describe(exc)
                    continue
                walls[key].append(wall)
                if cpu is not None:
                    cpus[key].append(cpu)
    got = {k: median(v) for k, v in walls.items() if v and k not in errors}

    def cpu(key: str) -> str:  # the agent's own CPU over the timed turns, beside the wall
        return f"; agent CPU {ms(median(cpus[key])):.0f} ms" if cpus[key] else ""

    figures: list[Figure] = []
    if "stdio" in got:
        figures.append(Figure(G, name, ms(got["stdio"]), baseline=ms(ideal), baseline_name="ideal", samples=reps,
                              note=f"stdio, ACP SDK client; ideal = {TURNS} x {LATENCY * 1000:.0f} ms, "
                                   f"every session in parallel{cpu('stdio')}"))  # fmt: skip
        if "bare" in got:
            figures.append(Figure(G, name, ms(got["stdio"]), baseline=ms(got["bare"]),
                                  baseline_name="stream agent", samples=reps,
                                  note=f"stream agent{cpu('bare')}"))  # fmt: skip
    else:
        figures.append(not_measured(G, name, errors.get("stdio") or errors.get("bare", "?")))
    if "raw" in got:
        figures.append(Figure(G, f"{name}, raw JSON client", ms(got["raw"]), baseline=ms(ideal),
                              baseline_name="ideal", samples=reps,
                              note=f"stdio; crow's share: the client only splits lines and matches ids{cpu('raw')}"))  # fmt: skip
    ws_name = f"{name}, one WebSocket"
    if "ws" in got:
        beside = ", ".join(f"{label} {ms(got[k]):.0f} ms" for k, label in
                           (("stdio", "stdio"), ("bare", "stream agent (stdio)")) if k in got)  # fmt: skip
        figures.append(Figure(G, ws_name, ms(got["ws"]), baseline=ms(ideal), baseline_name="ideal",
                              target="<= 3x ideal", check=("ratio", "<=", 3.0), samples=reps,
                              note=f"all {SESSIONS} sessions on one connection, ACP SDK ws client; "
                                   f"beside: {beside}{cpu('ws')}"))  # fmt: skip
    else:
        figures.append(not_measured(G, ws_name, errors.get("ws", "?"), target="<= 3x ideal"))
    return figures
