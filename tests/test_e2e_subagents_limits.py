"""End to end: the `task` tool's limits and a hostile model (builtin_hooks/subagents.py).

Depth (a child calling `task`), a child calling `exit_plan_mode`, the concurrency cap (5
and 50 tasks in one reply), max turns per child, a plan-mode parent's child, and bad
arguments: each answered with a clear result, the parent going on."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from crow import Agent, Message, SubagentEvent, SubagentFinished, SubagentStarted
from crow.config import HooksConfig
from crow.events import ToolCallEnd
from crow.messages import validate
from tests.llm_server import RecordedRequest, Reply, ScriptedLLM, Stall, ToolCallSpec
from tests.test_e2e_subagents import (
    Events,
    calls_then_answers,
    config,
    is_child,
    model_env,
    task,
    tool_results,
)

pytestmark = pytest.mark.anyio
__all__ = ["model_env"]  # the fixture, shared


def subagents(**settings: Any) -> HooksConfig:
    return HooksConfig(settings={"subagents": settings})


def most_running(events: Events) -> int:
    """The most children running at once, as the front end saw them start and finish."""
    running = most = 0
    for event in events:
        if isinstance(event, SubagentStarted):
            running += 1
            most = max(most, running)
        elif isinstance(event, SubagentFinished):
            running -= 1
    return most


async def test_a_child_calling_task_is_refused_at_the_depth_limit(
    model_env: ScriptedLLM, tmp_path: Path
) -> None:
    llm = model_env

    plan = ToolCallSpec("exit_plan_mode", {"plan": "x"}, id="c2")
    llm.rule(is_child, calls_then_answers(task("c1", "GRANDCHILD"), plan, answer="did it myself"))
    llm.push(Reply(tool_calls=[task("t1", "CHILD go deeper")]), Reply(text="parent done"))
    events = Events()
    async with Agent(config(tmp_path / "home")) as agent:
        session = agent.create_session(tmp_path)
        await agent.prompt(session, Message("user", "delegate"), events)
        child_request = next(r for r in llm.requests if is_child(r))
        assert "task" not in child_request.tool_names and "exit_plan_mode" not in child_request.tool_names
        assert "read_file" in child_request.tool_names
        assert not any("GRANDCHILD" in r.last_user_text for r in llm.requests)
        (started,) = events.of(SubagentStarted)
        results = tool_results(await agent.store.load_context(started.session_id))
        assert results["c1"].content.startswith("Error: task is not available here")
        assert "max_depth is 1" in results["c1"].content
        assert results["c2"].content.startswith("Error: exit_plan_mode is not available to a subagent")
        assert session.mode == "yolo"
        assert tool_results(list(session.messages))["t1"].content.startswith("did it myself")


async def test_with_max_depth_two_a_child_runs_its_own_child(model_env: ScriptedLLM, tmp_path: Path) -> None:
    llm = model_env
    llm.rule(lambda r: "GRANDCHILD" in r.last_user_text, Reply(text="grandchild answer"))

    llm.rule(is_child, calls_then_answers(task("c1", "GRANDCHILD look"), answer="child relays it"))
    llm.push(Reply(tool_calls=[task("t1", "CHILD go deeper")]), Reply(text="parent done"))
    events = Events()
    async with Agent(config(tmp_path / "home", hooks=subagents(max_depth=2))) as agent:
        session = agent.create_session(tmp_path)
        await agent.prompt(session, Message("user", "delegate"), events)
        grandchild = next(r for r in llm.requests if "GRANDCHILD" in r.last_user_text)
        assert "task" not in grandchild.tool_names  # depth 2 is the limit
        nested = [e.event for e in events.of(SubagentEvent) if isinstance(e.event, SubagentStarted)]
        assert len(nested) == 1 and nested[0].parent_call_id == "c1"
        assert tool_results(list(session.messages))["t1"].content.startswith("child relays it")


async def test_five_tasks_run_at_most_four_at_once_and_all_are_answered(
    model_env: ScriptedLLM, tmp_path: Path
) -> None:
    llm = model_env
    held = threading.Condition()
    arrived = [0]

    def after_four(request: RecordedRequest) -> Reply:  # proves four run at once
        with held:
            arrived[0] += 1
            held.notify_all()
            held.wait_for(lambda: arrived[0] >= 4, timeout=20)
        return Reply(text=f"answer to {request.last_user_text}")

    llm.rule(is_child, after_four)
    llm.push(Reply(tool_calls=[task(f"t{i}", f"CHILD {i}") for i in range(5)]), Reply(text="parent done"))
    events = Events()
    async with Agent(config(tmp_path / "home")) as agent:
        session = agent.create_session(tmp_path)
        await agent.prompt(session, Message("user", "delegate"), events)
        assert most_running(events) == 4
        results = tool_results(list(session.messages))
        assert [results[f"t{i}"].content.split("\n")[0] for i in range(5)] == [
            f"answer to CHILD {i}" for i in range(5)
        ]


async def test_fifty_tasks_in_one_reply_are_all_answered_within_the_cap(
    model_env: ScriptedLLM, tmp_path: Path
) -> None:
    llm = model_env
    llm.rule(is_child, lambda r: Reply(text=f"answer to {r.last_user_text}"))
    llm.push(Reply(tool_calls=[task(f"t{i}", f"CHILD {i}") for i in range(50)]), Reply(text="parent done"))
    events = Events()
    async with Agent(config(tmp_path / "home", hooks=subagents(max_concurrent=3))) as agent:
        session = agent.create_session(tmp_path)
        result = await agent.prompt(session, Message("user", "delegate"), events)
        assert result.stop_reason == "end_turn"
        assert most_running(events) <= 3
        results = tool_results(list(session.messages))
        assert all(results[f"t{i}"].content.startswith(f"answer to CHILD {i}\n") for i in range(50))
        validate(list(session.messages))


async def test_a_child_at_its_turn_limit_returns_what_it_has(model_env: ScriptedLLM, tmp_path: Path) -> None:
    llm = model_env
    looking = Reply(text="so far: two files", tool_calls=[ToolCallSpec("ls", {"path": "."})])
    llm.rule(is_child, looking)
    llm.push(Reply(tool_calls=[task("t1", "CHILD never done")]), Reply(text="parent done"))
    events = Events()
    async with Agent(config(tmp_path / "home", hooks=subagents(max_turns=2))) as agent:
        session = agent.create_session(tmp_path)
        await agent.prompt(session, Message("user", "delegate"), events)
        assert len([r for r in llm.requests if is_child(r)]) == 2
        result = tool_results(list(session.messages))["t1"].content
        assert result.startswith("so far: two files\n\n[The subagent stopped at its limit of 2 model calls")
        (finished,) = events.of(SubagentFinished)
        assert finished.stop_reason == "max_turn_requests" and finished.turns == 2
        validate(await agent.store.load_context(finished.session_id))


async def test_a_plan_mode_parents_child_runs_read_only(model_env: ScriptedLLM, tmp_path: Path) -> None:
    llm = model_env

    write = ToolCallSpec("write_file", {"path": "x.txt", "content": "no"}, id="w1")
    llm.rule(is_child, calls_then_answers(write, answer="could not write"))
    llm.push(Reply(tool_calls=[task("t1", "CHILD write")]), Reply(text="parent done"))
    events = Events()
    async with Agent(config(tmp_path / "home")) as agent:
        session = agent.create_session(tmp_path)
        session.mode = "plan"
        await agent.prompt(session, Message("user", "delegate"), events)
        assert not (tmp_path / "x.txt").exists()
        (started,) = events.of(SubagentStarted)
        record = await agent.store.get_session(started.session_id)
        assert record.mode == "read_only"
        results = tool_results(await agent.store.load_context(started.session_id))
        assert "read-only mode" in results["w1"].content


async def test_bad_task_arguments_get_clear_errors_and_start_nothing(
    model_env: ScriptedLLM, tmp_path: Path
) -> None:
    llm = model_env
    llm.push(
        Reply(
            tool_calls=[
                task("empty_title", "CHILD x", description="  "),
                task("long_title", "CHILD x", description="t" * 5000),
                task("empty_prompt", "   "),
                task("huge_prompt", "CHILD " + "x" * 1_000_000),
                task("unknown_agent", "CHILD x", agent="nope"),
            ]
        ),
        Reply(text="parent done"),
    )
    events = Events()
    async with Agent(config(tmp_path / "home")) as agent:
        session = agent.create_session(tmp_path)
        result = await agent.prompt(session, Message("user", "delegate"), events)
        assert result.stop_reason == "end_turn"
        assert not events.of(SubagentStarted) and not any(is_child(r) for r in llm.requests)
        results = {k: v.content for k, v in tool_results(list(session.messages)).items()}
        assert "`description` is empty" in results["empty_title"]
        assert "`description` is 5,000 characters; keep it under 200" in results["long_title"]
        assert "`prompt` is empty" in results["empty_prompt"]
        assert "`prompt` is 1,000,006 characters; keep it under 100,000" in results["huge_prompt"]
        assert results["unknown_agent"] == "Error: unknown agent 'nope'; the agents are: general-purpose"


async def test_a_cancel_ends_running_and_waiting_children_alike(
    model_env: ScriptedLLM, tmp_path: Path
) -> None:
    llm = model_env
    llm.rule(is_child, Stall(seconds=60))
    llm.push(Reply(tool_calls=[task(f"t{i}", f"CHILD {i}") for i in range(6)]))
    events = Events()
    async with Agent(config(tmp_path / "home", hooks=subagents(max_concurrent=2))) as agent:
        session = agent.create_session(tmp_path)
        async with anyio.create_task_group() as tg:

            async def prompt() -> None:
                await agent.prompt(session, Message("user", "delegate"), events)

            tg.start_soon(prompt)
            await anyio.to_thread.run_sync(llm.wait_for_requests, 3, 20.0)  # two children wait on the model
            tg.cancel_scope.cancel()
        started = events.of(SubagentStarted)
        assert len(started) == 2  # the four waiting for a slot never started
        assert [f.stop_reason for f in events.of(SubagentFinished)] == ["cancelled", "cancelled"]
        ended = {e.call.id: e.result for e in events.of(ToolCallEnd)}
        assert sorted(ended) == [f"t{i}" for i in range(6)] and all(r.is_error for r in ended.values())
        for sid in [session.id, *(s.session_id for s in started)]:
            validate(await agent.store.load_context(sid))
