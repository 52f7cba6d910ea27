"""Loop overhead per iteration, in process: `Agent.run_turn` with a `ScriptedProvider` that
asks for a trivial programmatic tool K times and then answers, at several history sizes.

overhead per iteration = (turn time - time inside the provider handler - time inside the
tool function) / model calls. The baseline is `bare_loop`: a hand-written loop making the
same provider and tool calls directly, measured the same way.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.common import Ctx, Figure, median, ms, not_measured

G = "loop"
TOOL_CALLS = 10  # per turn; one more model call answers with text
SIZES = [(10, None), (50, 1.0), (1_000, 2.0), (5_000, None)]


class Clock:
    """Time spent inside the provider handler and the tool, which the loop does not own."""

    def __init__(self) -> None:
        self.provider = 0.0
        self.tool = 0.0
        self.calls = 0


def history(n: int) -> list[Any]:
    """Exactly n messages of ordinary chat: question/answer pairs, every third one with a
    tool exchange in between (an odd n ends on a question)."""
    from crow.messages import Message, ToolCall

    out: list[Any] = []
    i = 0
    while len(out) < n:
        question = Message("user", f"question {i}: " + "lorem ipsum " * 20)
        answer = Message("assistant", f"answer {i}: " + "dolor sit amet " * 30)
        call = ToolCall(f"h{i}", "bump", {"n": i})
        block = [question, answer]
        if i % 3 == 0 and len(out) + 4 <= n:
            block[1:1] = [Message("assistant", "", (call,)),
                          Message("tool", "x" * 200, tool_call_id=call.id, name="bump")]
        out += block[: n - len(out)]
        i += 1
    return out


def scripted(clock: Clock) -> Any:
    from crow.llm.base import ModelResponse, ScriptedProvider, Usage
    from crow.messages import Message, ToolCall

    state = {"left": TOOL_CALLS}

    def handler(request: Any) -> Any:
        t0 = time.perf_counter()
        clock.calls += 1
        if state["left"] > 0:
            state["left"] -= 1
            call = ToolCall.from_raw(f"c{clock.calls}", "bump", '{"n": 1}')
            resp = ModelResponse(Message("assistant", "", (call,)), Usage(100, 10), "tool_use")
        else:
            state["left"] = TOOL_CALLS
            resp = ModelResponse(Message("assistant", "done"), Usage(100, 10), "end_turn")
        clock.provider += time.perf_counter() - t0
        return resp

    return ScriptedProvider(handler)


def make_tool(clock: Clock) -> Any:
    async def bump(n: int) -> str:  # async like every builtin tool: a sync one runs in a thread
        """Add one."""
        t0 = time.perf_counter()
        out = str(n + 1)
        clock.tool += time.perf_counter() - t0
        return out

    return bump


class NullStore:
    """Stands in for the SQLite store, to split the loop's own cost from persistence."""

    async def create_session(self, **fields: Any) -> None: ...
    async def append(self, *args: Any, **kwargs: Any) -> None: ...
    async def set_context(self, *args: Any) -> None: ...
    async def update_session(self, *args: Any, **kwargs: Any) -> None: ...
    async def aclose(self) -> None: ...


async def crow_turns(home: Path, size: int, turns: int, *, hooks: bool, store: bool) -> float:
    from crow.agent import Agent
    from crow.config import Config
    from crow.messages import Messages, human

    clock = Clock()
    agent = Agent(Config(home=home, mode="yolo"), provider=scripted(clock), builtin_hooks=hooks,
                  store=None if store else NullStore())
    agent.tool(make_tool(clock))
    try:
        session = agent.create_session(home)
        await agent.session_ready(session)
        prefill = history(size)

        async def emit(event: Any) -> None:
            return None

        per_iter: list[float] = []
        for i in range(turns + 1):
            session.messages = Messages(prefill)
            session.last_usage, session.usage_covers = None, 0
            clock.provider = clock.tool = 0.0
            calls0 = clock.calls
            t0 = time.perf_counter()
            result = await agent.run_turn(session, human(f"go {i}"), emit)
            dt = time.perf_counter() - t0
            if result.stop_reason != "end_turn" or result.error:
                raise RuntimeError(f"turn ended {result.stop_reason}: {result.error}")
            tool_out = session.messages[size + 2]
            if tool_out.role != "tool" or tool_out.is_error:
                raise RuntimeError(f"the tool did not run: {tool_out.content[:200]}")
            if i:  # the first turn warms caches
                per_iter.append((dt - clock.provider - clock.tool) / (clock.calls - calls0))
        return median(per_iter)
    finally:
        await agent.aclose()


async def bare_loop(size: int, turns: int) -> float:
    """The same provider and tool calls, straight: the floor for any loop."""
    from crow.llm.base import ModelRequest, ModelResponse
    from crow.messages import system

    clock = Clock()
    provider = scripted(clock)
    tool = make_tool(clock)
    prefill = history(size)
    per_iter: list[float] = []
    for i in range(turns + 1):
        messages = list(prefill)
        messages.append(system(f"go {i}"))
        clock.provider = clock.tool = 0.0
        calls0 = clock.calls
        t0 = time.perf_counter()
        while True:
            request = ModelRequest(messages=[system("prompt"), *messages])
            response = None
            async for event in provider.stream(request):
                if isinstance(event, ModelResponse):
                    response = event
            assert response is not None
            messages.append(response.message)
            if not response.message.tool_calls:
                break
            for call in response.message.tool_calls:
                messages.append(system(await tool(**call.args)))
        dt = time.perf_counter() - t0
        if i:
            per_iter.append((dt - clock.provider - clock.tool) / (clock.calls - calls0))
    return median(per_iter)


async def run(ctx: Ctx) -> list[Figure]:
    turns = ctx.reps(15, 4)
    figures: list[Figure] = []
    try:
        await crow_turns(ctx.home("loop"), 10, 1, hooks=True, store=True)
    except Exception as exc:
        return [not_measured(G, "per iteration", f"Agent.run_turn failed: {exc!r}")]
    for size, limit in SIZES:
        crow: list[float] = []
        bare: list[float] = []
        for _ in range(3 if not ctx.quick else 1):  # interleave in rounds
            bare.append(await bare_loop(size, turns))
            crow.append(await crow_turns(ctx.home("loop"), size, turns, hooks=True, store=True))
        target = f"< {limit:g} ms" if limit else "-"
        figures.append(Figure(
            G, f"per iteration, {size:,} msgs, hooks on", ms(median(crow)),
            baseline=ms(median(bare)), baseline_name="bare loop", target=target,
            check=("value", "<", limit) if limit else None, samples=turns * len(crow),
        ))
    # where the time goes at 50 messages: without the SQLite store, without hooks
    nostore = await crow_turns(ctx.home("loop"), 50, turns, hooks=True, store=False)
    nohooks = await crow_turns(ctx.home("loop"), 50, turns, hooks=False, store=False)
    figures.append(Figure(G, "per iteration, 50 msgs, no store", ms(nostore), note=""))
    figures.append(Figure(G, "per iteration, 50 msgs, no store, no hooks", ms(nohooks)))
    return figures
