"""Images: what a 1 MB image costs crow itself.

A prompt carrying a 1 MB PNG against the same prompt without it, each the second prompt
of a fresh session of one crow (a context that grows with every image would measure the
history, not the image; a session's first prompt also prepares it), against an instant
scripted model; crow's time is the round trip minus the
scripted server's time on its requests (reading the 1.4 MB body is the model's side).
The bare echo agent gets the same two prompts, interleaved: what the image adds there
(the client writing it, the pipe, the SDK parsing it) is the baseline, so value minus
baseline is what crow's own work on the image adds. read_file of a 1 MB PNG against
read_file of a small text file is shown for information."""

from __future__ import annotations

import base64
import contextlib
import time
from typing import Any

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
    spawn,
    stderr_tail,
)

G = "images"
SIZE = 1024 * 1024


async def run(ctx: Ctx) -> list[Figure]:
    from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec
    from tests.support.images import png_of_size

    picture = png_of_size(SIZE)

    def answer(request: Any) -> Reply:
        last = request.messages[-1]
        if last["role"] == "user" and last["content"].startswith("read "):
            return Reply(
                tool_calls=[ToolCallSpec("read_file", {"path": last["content"].removeprefix("read ")})]
            )
        return Reply(text="ok")

    n = ctx.reps(30, 10)
    with ScriptedLLM(default=answer) as llm:
        async with contextlib.AsyncExitStack() as stack:
            agents = {}
            for name, cmd in (("crow", CROW_CMD), ("echo", ECHO_CMD)):
                home = ctx.home(name)
                (home / "big.png").write_bytes(picture)
                (home / "small.txt").write_text("hello\n")
                conn, _proc, client = await stack.enter_async_context(spawn(cmd, agent_env(home, llm), home))
                await initialize(conn)
                agents[name] = (conn, client, home)
            return await _measure(agents, llm, base64.b64encode(picture).decode(), n)


async def _measure(agents: dict[str, Any], llm: Any, data: str, n: int) -> list[Figure]:
    import acp

    prompts = {
        "plain": [acp.text_block("describe")],
        "image": [acp.text_block("describe"), acp.image_block(data, "image/png")],
        "read text": [acp.text_block("read small.txt")],
        "read image": [acp.text_block("read big.png")],
    }
    runs = [(agent, name) for agent in agents for name in prompts if agent == "crow" or "read" not in name]
    own: dict[tuple[str, str], list[float]] = {run: [] for run in runs}
    warm = 3
    for i in range(warm + n):
        for agent, name in runs if i % 2 else list(reversed(runs)):
            conn, client, home = agents[agent]
            sid = (await conn.new_session(cwd=str(home), mcp_servers=[])).session_id
            await conn.prompt(session_id=sid, prompt=prompts["plain"])  # prepared: a later prompt is timed
            client.text()
            before = len(llm.requests)
            t0 = time.perf_counter()
            reply = await conn.prompt(session_id=sid, prompt=prompts[name])
            dt = time.perf_counter() - t0
            expected = "ok" if agent == "crow" else "describe"
            if client.text() != expected or reply.stop_reason != "end_turn":
                why = f"{agent} / {name}: answered {reply.stop_reason}; {stderr_tail(home)}"
                return [not_measured(G, "prompt with a 1 MB image", why)]
            if i >= warm:
                own[agent, name].append(dt - sum(r.elapsed for r in llm.requests[before:]))

    def added(agent: str, name: str, base: str) -> float:
        return ms(median(own[agent, name]) - median(own[agent, base]))

    return [
        Figure(G, "time a 1 MB prompt image adds", added("crow", "image", "plain"),
               baseline=added("echo", "image", "plain"), baseline_name="echo agent: the transport's share",
               target="crow's own < 50 ms", check=("diff", "<", 50.0), samples=n,
               note="value: crow's round trip minus the model's time, with the image minus without"),
        Figure(G, "read_file of a 1 MB PNG", ms(median(own["crow", "read image"])),
               baseline=ms(median(own["crow", "read text"])), baseline_name="read_file of a text file",
               note="crow's time; the image goes to the model and to the editor", samples=n),
    ]  # fmt: skip
