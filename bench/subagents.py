"""Subagents (the `task` tool, builtin_hooks/subagents.py), in process, against a model in
its own process (this file run as a script: asyncio, one thread, like bench/llm_proc.py;
the threaded tests.llm_server would measure its own GIL contention with crow's):

- child start: from the task call reaching the hooks (an outermost probe hook) to the
  child's first model request arriving at the model; target < 5 ms. Beside it, for
  comparison, a plain session's prompt (`Agent.run_turn`) to its first request.
- 4 children at once against a 20 ms model (each child reply takes 20 ms): from the first
  task call's start to the last one's end, against one child's; target <= 1.3x. Measured
  with the start-up objects frozen out of the GC, as the `crow` command runs.
- cancel with 4 children waiting on their model: from the cancel to the prompt settled
  (every child's history closed, SubagentFinished sent); target < 500 ms.

The model answers a prompt "FANOUT n" with n task calls (prompts "CHILD ..."), a child
after `--latency` seconds (never, for "CHILD STALL"), anything after a tool result with
text. Times are CLOCK_MONOTONIC (`time.monotonic`), the same in both processes; GET
/arrivals returns when each request arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import re
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import PY, Ctx, Figure, median, ms, serving
from bench.llm_proc import _HEAD, _chunk, read_request

G = "subagents"
LATENCY = 0.020  # seconds each child reply takes
BASE = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "scripted"}


# ---------------------------------------------------------------- the model (a process)
def _reply(delta: dict[str, Any], finish: str) -> bytes:
    usage = {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
    out = [
        _chunk({**BASE, "choices": [{"index": 0, "delta": {"role": "assistant", **delta}}]}),
        _chunk({**BASE, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}),
        _chunk({**BASE, "choices": [], "usage": usage}),
    ]
    return b"".join([_HEAD, *out, _chunk(b"[DONE]"), b"0\r\n\r\n"])


def _tasks(n: int, stall: bool) -> bytes:
    args = [{"description": f"Part {i}", "prompt": f"CHILD {i}" + " STALL" * stall} for i in range(n)]
    calls = [
        {
            "index": i,
            "id": f"t{i}",
            "type": "function",
            "function": {"name": "task", "arguments": json.dumps(a)},
        }
        for i, a in enumerate(args)
    ]
    return _reply({"tool_calls": calls}, "tool_calls")


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, arrivals: list[Any]) -> None:
    try:
        while True:
            head, body = await read_request(reader)
            if head.startswith(b"GET /arrivals"):
                data = json.dumps(arrivals).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
                arrivals.clear()
                await writer.drain()
                continue
            last = (body.get("messages") or [{}])[-1]
            text = last.get("content") if isinstance(last.get("content"), str) else ""
            arrivals.append([text[:40] if last.get("role") == "user" else "tool", time.monotonic()])
            if last.get("role") == "user" and text.startswith("CHILD"):
                await (asyncio.Event().wait() if "STALL" in text else asyncio.sleep(float(sys.argv[-1])))
                writer.write(_reply({"content": "child answer"}, "stop"))
            elif last.get("role") == "user" and (fan := re.match(r"FANOUT (\d+)", text)):
                writer.write(_tasks(int(fan.group(1)), "STALL" in text))
            else:
                writer.write(_reply({"content": "done"}, "stop"))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _main() -> None:
    arrivals: list[Any] = []
    server = await asyncio.start_server(lambda r, w: _serve(r, w, arrivals), "127.0.0.1", 0, backlog=512)
    print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", flush=True)
    async with server:
        await server.serve_forever()


# ---------------------------------------------------------------- the figures
async def run(ctx: Ctx) -> list[Figure]:
    # Logging as the `crow` command sets it up, before MCPServer's basicConfig can put a rich
    # handler at INFO on the root logger (a line per HTTP request: not crow's cost).
    root = logging.getLogger()
    root.handlers[:] = [logging.StreamHandler(sys.stderr)]
    root.setLevel(logging.WARNING)
    try:
        with _model(LATENCY) as base_url:
            return await _measure(ctx, base_url)
    finally:
        gc.unfreeze()  # the groups after this one measure this process as they found it


def _model(latency: float) -> contextlib.AbstractContextManager[str]:
    """This file as the model's process; yields its base URL."""
    return serving([PY, __file__, str(latency)])


async def _measure(ctx: Ctx, base_url: str) -> list[Figure]:
    import os

    import anyio
    import httpx

    from crow import Agent, Message, SubagentFinished, SubagentStarted
    from crow.config import Config
    from crow.events import ToolCallEnd, ToolCallStart

    os.environ.update(OPENAI_BASE_URL=base_url, OPENAI_API_KEY="x")
    home, ws = ctx.home("home"), ctx.home("ws")
    figures: list[Figure] = []
    reached: list[float] = []
    spans: list[tuple[str, float]] = []

    async def arrivals() -> list[tuple[str, float]]:
        async with httpx.AsyncClient() as http:
            return [tuple(a) for a in (await http.get(base_url.removesuffix("/v1") + "/arrivals")).json()]

    async def probe(ctx: Any, call: Any, call_next: Any) -> Any:  # the outermost hook
        if call.name == "task":
            reached.append(time.monotonic())
        return await call_next(call)

    async def sink(event: Any) -> None:
        if isinstance(event, ToolCallStart | ToolCallEnd) and event.call.name == "task":
            spans.append((type(event).__name__, time.monotonic()))
        elif isinstance(event, SubagentStarted | SubagentFinished):
            spans.append((type(event).__name__, time.monotonic()))

    async with Agent(Config(model="openai:scripted", home=Path(home), mode="yolo")) as agent:
        agent.hooks.register("wrap_tool_call", probe, name="bench_probe", order=-1000)

        async def prompt(session: Any, text: str) -> None:
            await agent.run_turn(session, Message("user", text), sink)

        session = agent.create_session(ws)
        await prompt(session, "FANOUT 1")  # imports, the store, the connection pool
        plain_session = agent.create_session(ws)
        await prompt(plain_session, "warm up")
        # As the `crow` command does once its warm-up has imported everything
        # (crow.startup.imports_done): the start-up objects frozen out of every later
        # collection. Without it this process's collections walk the imports' objects,
        # which a `crow` process never does (4 children: 1.40x vs 1.27x one child's time).
        gc.collect()
        gc.freeze()

        # (a) child start, against a plain session's prompt to its first request
        n = ctx.reps(30, 8)
        start, plain = [], []
        for _ in range(n):
            await arrivals()
            reached.clear()
            await prompt(session, "FANOUT 1")
            child = next(t for text, t in await arrivals() if text.startswith("CHILD"))
            start.append(child - reached[0])
            t0 = time.monotonic()
            await prompt(plain_session, "plain")
            plain.append((await arrivals())[0][1] - t0)
        figures.append(
            Figure(G, "child start: task call -> child's first model request", ms(median(start)),
                   baseline=ms(median(plain)), baseline_name="plain prompt -> first request",
                   target="< 5 ms", check=("value", "<", 5), samples=n)
        )  # fmt: skip

        # (b) 4 children at once against one, 20 ms per child reply
        def span(first: str, last: str) -> float:
            return max(t for kind, t in spans if kind == last) - min(t for kind, t in spans if kind == first)

        calls: dict[int, list[float]] = {1: [], 4: []}  # the task calls, parent's side included
        children: dict[int, list[float]] = {1: [], 4: []}  # the child sessions alone
        m = ctx.reps(15, 4)
        for _ in range(m):
            for fan in (1, 4):
                spans.clear()
                await prompt(session, f"FANOUT {fan}")
                calls[fan].append(span("ToolCallStart", "ToolCallEnd"))
                children[fan].append(span("SubagentStarted", "SubagentFinished"))
        figures += [
            Figure(G, "4 children at once, 20 ms model: task calls start -> all ended", ms(median(calls[4])),
                   baseline=ms(median(calls[1])), baseline_name="one child",
                   target="ratio <= 1.3", check=("ratio", "<=", 1.3), samples=m),
            Figure(G, "4 children at once, 20 ms model: first child started -> last finished",
                   ms(median(children[4])), baseline=ms(median(children[1])), baseline_name="one child",
                   samples=m, note="the children alone, without the parent's tool-call steps around them"),
        ]  # fmt: skip

        # (c) cancel with 4 children waiting on their model
        settle = []
        k = ctx.reps(10, 3)
        for _ in range(k):
            fresh = agent.create_session(ws)
            await agent.session_ready(fresh)
            await arrivals()
            async with anyio.create_task_group() as tg:
                tg.start_soon(prompt, fresh, "FANOUT 4 STALL")
                children = 0
                with anyio.fail_after(20):
                    while children < 4:
                        await anyio.sleep(0.005)  # a poll of the other process, not a wait on crow
                        children += sum(text.startswith("CHILD") for text, _ in await arrivals())
                t0 = time.monotonic()
                tg.cancel_scope.cancel()
            settle.append(time.monotonic() - t0)
        figures.append(
            Figure(G, "cancel with 4 children running -> prompt settled", ms(median(settle)),
                   target="< 500 ms", check=("value", "<", 500), samples=k,
                   note=f"worst of {k}: {ms(max(settle)):.0f} ms")
        )  # fmt: skip
    return figures


if __name__ == "__main__":
    asyncio.run(_main())
