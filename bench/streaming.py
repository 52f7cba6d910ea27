"""Streaming latency: how long a chunk takes from the model server's socket to the ACP
client, through crow vs through the bare streaming agent, for a 5,000-chunk answer.

The model server (in this process, on asyncio) writes one SSE event per chunk, every
PACE seconds, and each chunk's text is the wall-clock time it was written. The client notes
when each agent_message_chunk arrives. crow's added latency is its p99 minus the bare
agent's p99 (both paths include the same client and transport); "growth" compares the last
500 chunks with the first 500, so a per-chunk cost that rises with the answer shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from bench.common import (
    CROW_CMD,
    STREAM_CMD,
    Ctx,
    Figure,
    QuietClient,
    agent_env,
    initialize,
    median,
    ms,
    not_measured,
    prompt_text,
    spawn,
    stderr_tail,
)

G = "streaming"
PACE = 0.001


class _Server:
    """OpenAI `/chat/completions` and Anthropic `/v1/messages`, streaming timestamped chunks."""

    def __init__(self, chunks: int) -> None:
        self.chunks = chunks

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                anthropic = b"/messages" in head.split(b"\r\n")[0]
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                )
                for event in (_anthropic if anthropic else _openai)(self.chunks):
                    if event is None:
                        await asyncio.sleep(PACE)
                        continue
                    data = event() if callable(event) else event
                    writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
                await writer.drain()


def _sse(obj: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + json.dumps(obj).encode() + b"\n\n"


def _stamp() -> str:
    return f"{time.time():.6f} "


def _openai(n: int) -> Any:
    base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    for _ in range(n):
        yield lambda: _sse({**base, "choices": [{"index": 0, "delta": {"content": _stamp()}}]})
        yield None
    yield _sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    yield _sse(
        {**base, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5}}
    )
    yield b"data: [DONE]\n\n"


def _anthropic(n: int) -> Any:
    yield _sse(
        {
            "type": "message_start",
            "message": {
                "id": "m",
                "type": "message",
                "role": "assistant",
                "model": "m",
                "content": [],
                "stop_reason": None,
                "usage": {"input_tokens": 5, "output_tokens": 0},
            },
        },
        "message_start",
    )
    yield _sse(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        "content_block_start",
    )
    for _ in range(n):
        yield lambda: _sse(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": _stamp()}},
            "content_block_delta",
        )
        yield None
    yield _sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
    yield _sse(
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": n}},
        "message_delta",
    )
    yield _sse({"type": "message_stop"}, "message_stop")


class _StampClient(QuietClient):
    def __init__(self) -> None:
        super().__init__()
        self.delays: list[float] = []

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        now = time.time()
        if type(update).__name__ == "AgentMessageChunk":
            for word in update.content.text.split():
                self.delays.append(now - float(word))


def _p(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _one(ctx: Ctx, cmd: list[str], env: dict[str, str], home: Any) -> list[float] | str:
    client = _StampClient()
    async with spawn(cmd, env, home, client) as (conn, _proc, _client):
        await initialize(conn)
        session = await conn.new_session(cwd=str(home), mcp_servers=[])
        await prompt_text(conn, session.session_id, "warm up")
        client.delays.clear()
        reply = await prompt_text(conn, session.session_id, "stream")
        if reply.stop_reason != "end_turn":
            return f"answered {reply.stop_reason}: {stderr_tail(home)}"
    return client.delays


async def run(ctx: Ctx) -> list[Figure]:
    chunks = ctx.reps(5000, 2000)
    # p99 of one run is at the mercy of the machine (on 2 shared cores both agents' p50 flip
    # between ~0.6 and ~1.3 ms from run to run, old and new crow alike): take the median run
    reps = ctx.reps(5, 1)
    server = _Server(chunks)
    root = await server.start()
    figures: list[Figure] = []
    try:
        runs = {
            "stream agent (openai)": (STREAM_CMD, {"OPENAI_BASE_URL": f"{root}/v1"}),
            "crow (openai)": (CROW_CMD, {"OPENAI_BASE_URL": f"{root}/v1", "CROW_MODEL": "openai:m"}),
            "crow (anthropic)": (
                CROW_CMD,
                {"ANTHROPIC_BASE_URL": root, "ANTHROPIC_API_KEY": "x", "CROW_MODEL": "anthropic:m"},
            ),
        }
        delays: dict[str, list[list[float]]] = {name: [] for name in runs}
        names = list(runs)
        for rep in range(reps):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:  # rotate who goes first
                cmd, extra = runs[name]
                home = ctx.home("streaming")
                got = await _one(ctx, cmd, agent_env(home, None, OPENAI_API_KEY="x", **extra), home)
                if isinstance(got, str):
                    return [not_measured(G, name, got)]
                delays[name].append(got)
        base = delays["stream agent (openai)"]
        for name in ("crow (openai)", "crow (anthropic)"):
            runs_ = delays[name]
            added = median([_p(d, 0.99) - _p(b, 0.99) for d, b in zip(runs_, base, strict=True)])
            figures.append(
                Figure(
                    G,
                    f"{name}: added latency per chunk, p99",
                    ms(added),
                    target="< 1 ms",
                    check=("value", "<", 1.0),
                    samples=reps * chunks,
                    note=f"median over {reps} runs of (crow p99 - bare agent p99)",
                )
            )
            figures.append(
                Figure(
                    G,
                    f"{name}: chunk latency p50",
                    ms(median([_p(d, 0.5) for d in runs_])),
                    baseline=ms(median([_p(b, 0.5) for b in base])),
                    baseline_name="stream agent p50",
                    samples=reps * chunks,
                )
            )
            growth = median([sorted(d[-500:])[250] / sorted(d[:500])[250] for d in runs_])
            figures.append(
                Figure(
                    G,
                    f"{name}: last 500 vs first 500 chunks (median)",
                    growth,
                    unit="x",
                    target="<= 1.5",
                    check=("value", "<=", 1.5),
                    samples=reps * 1000,
                )
            )
    finally:
        server.server.close()
    return figures
