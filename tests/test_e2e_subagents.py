"""End to end: the `task` tool runs a child agent (builtin_hooks/subagents.py).

The child is a real crow session with its own context, run through the same loop and
hooks against the scripted model server; its events reach the parent's front end wrapped
(`SubagentStarted`, `SubagentEvent`, `SubagentFinished`). Limits, bad input and hostile
children: tests/test_e2e_subagents_limits.py; agent definitions:
tests/test_e2e_subagents_definitions.py; a spawned crow: tests/test_e2e_subagents_acp.py."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from crow import Agent, Message, SubagentEvent, SubagentFinished, SubagentStarted, UsageUpdated
from crow.config import Config, ModelSettings, Pricing, ProviderSettings
from crow.events import ToolCallEnd
from crow.messages import validate
from tests.llm_server import Fault, RecordedRequest, Reply, ScriptedLLM, Stall, ToolCallSpec
from tests.test_builtin_hooks import model_env

pytestmark = pytest.mark.anyio
__all__ = ["model_env"]  # the fixture (test_builtin_hooks'), for the other subagent test files



def task(id: str, prompt: str, description: str = "Look it up", **more: Any) -> ToolCallSpec:
    return ToolCallSpec("task", {"description": description, "prompt": prompt, **more}, id=id)


def is_child(request: RecordedRequest) -> bool:
    return "CHILD" in request.last_user_text


def answered(request: RecordedRequest) -> bool:
    """Whether the request carries a tool result (the caller's second model call on)."""
    return any(m["role"] == "tool" for m in request.messages)


def calls_then_answers(*calls: ToolCallSpec, answer: str) -> Callable[[RecordedRequest], Reply]:
    """A child (a rule's step) that makes `calls` in its first reply, then answers."""

    def reply(request: RecordedRequest) -> Reply:
        return Reply(text=answer) if answered(request) else Reply(tool_calls=list(calls))

    return reply


def config(home: Path, **more: Any) -> Config:
    return Config(**{"model": "openai:scripted", "home": home, "mode": "yolo", **more})


class Events(list[Any]):
    async def __call__(self, event: Any) -> None:
        self.append(event)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self if isinstance(e, kind)]


def tool_results(messages: list[Any]) -> dict[str, Any]:
    return {m.tool_call_id: m for m in messages if m.role == "tool"}


async def test_a_task_runs_a_child_with_its_own_context_and_returns_its_answer(
    model_env: ScriptedLLM, tmp_path: Path
) -> None:
    llm = model_env
    llm.rule(is_child, Reply(text="the child found 42"), times=1)
    llm.push(Reply(tool_calls=[task("t1", "CHILD: find it", "Find it")]), Reply(text="parent done"))
    events = Events()
    async with Agent(config(tmp_path / "home")) as agent:
        session = agent.create_session(tmp_path)
        result = await agent.prompt(session, Message("user", "delegate"), events)
        assert result.stop_reason == "end_turn"
        child_request = next(r for r in llm.requests if is_child(r))
        # the child's model saw its own prompt, not the parent's
        assert "delegate" not in str(child_request.messages)
        assert "the child found 42" in str(llm.requests[-1].messages)
        started = events.of(SubagentStarted)
        assert len(started) == 1 and started[0].description == "Find it"
        assert started[0].name == "general-purpose" and started[0].parent_call_id == "t1"
        assert any(isinstance(e, SubagentEvent) for e in events)
        (finished,) = events.of(SubagentFinished)
        assert finished.stop_reason == "end_turn" and finished.turns == 1
        # the result names the child for the front ends, and its footer what it took
        stored = tool_results(list(session.messages))["t1"]
        assert stored.meta["crow/subagent"] == {
            "session_id": started[0].session_id,
            "agent": "general-purpose",
        }
        assert "[subagent general-purpose: 1 model call," in stored.content
        child = await agent.store.get_session(started[0].session_id)
        assert child is not None and child.parent_id == session.id
        # loadable afterwards, its history as it ran
        loaded, transcript = await agent.load_session(child.id)
        assert loaded.parent_id == session.id
        assert [m.content for m in transcript if m.role in ("user", "assistant")] == [
            "CHILD: find it",
            "the child found 42",
        ]


async def test_two_tasks_of_one_reply_run_at_once_each_seeing_only_its_own_prompt(
    model_env: ScriptedLLM, tmp_path: Path
) -> None:
    llm = model_env
    both = threading.Barrier(2, timeout=20)  # each child's first reply waits for the other's request

    def when_both_asked(request: RecordedRequest) -> Reply:
        both.wait()
        return Reply(text=f"answer to {request.last_user_text}")

    llm.rule(is_child, when_both_asked, times=2)
    llm.push(Reply(tool_calls=[task("t1", "CHILD one"), task("t2", "CHILD two")]), Reply(text="done"))
    async with Agent(config(tmp_path / "home")) as agent:
        session = agent.create_session(tmp_path)
        result = await agent.prompt(session, Message("user", "delegate both"), Events())
        assert result.stop_reason == "end_turn"
        children = [r for r in llm.requests if is_child(r)]
        assert sorted(r.last_user_text for r in children) == ["CHILD one", "CHILD two"]
        for request in children:
            said = [m for m in request.messages if m["role"] != "system"]
            assert said == [{"role": "user", "content": request.last_user_text}]
            assert "task" not in request.tool_names and "exit_plan_mode" not in request.tool_names
        results = tool_results(list(session.messages))
        assert results["t1"].content.startswith("answer to CHILD one")
        assert results["t2"].content.startswith("answer to CHILD two")


async def test_a_childs_cost_counts_into_the_parents_as_it_grows(
    model_env: ScriptedLLM, tmp_path: Path
) -> None:
    llm = model_env
    priced = {"openai:scripted": ModelSettings(pricing=Pricing(input=1.0, output=2.0))}
    call = 0.002  # 1000 input and 500 output tokens at $1 and $2 per million
    llm.rule(is_child, Reply(text="child answer", usage=(1000, 500)), times=1)
    llm.push(
        Reply(tool_calls=[task("t1", "CHILD count")], usage=(1000, 500)),
        Reply(text="parent done", usage=(1000, 500)),
    )
    events = Events()
    async with Agent(config(tmp_path / "home", model_settings=priced)) as agent:
        session = agent.create_session(tmp_path)
        await agent.prompt(session, Message("user", "delegate"), events)
        assert session.cost == pytest.approx(3 * call)
        (finished,) = events.of(SubagentFinished)
        assert (finished.turns, finished.input_tokens, finished.output_tokens) == (1, 1000, 500)
        assert finished.cost == pytest.approx(call)
        # the parent's own front end was told the parent's cost with the child's in it,
        # before the parent's next model call
        parents = [e.cost for e in events.of(UsageUpdated)]
        assert parents == pytest.approx([call, 2 * call, 3 * call])
        assert (await agent.store.get_session(session.id)).cost == pytest.approx(3 * call)
        assert (await agent.store.get_session(finished.session_id)).cost == pytest.approx(call)
        assert (
            "1,000 input / 500 output tokens, $0.0020]" in tool_results(list(session.messages))["t1"].content
        )


async def test_a_child_of_an_unpriced_model_makes_the_parents_cost_unknown(
    model_env: ScriptedLLM, tmp_path: Path
) -> None:
    llm = model_env
    llm.rule(is_child, Reply(text="child answer", usage=None), times=1)
    llm.push(Reply(tool_calls=[task("t1", "CHILD count")]), Reply(text="parent done"))
    events = Events()
    async with Agent(config(tmp_path / "home")) as agent:  # openai:scripted has no price
        session = agent.create_session(tmp_path)
        await agent.prompt(session, Message("user", "delegate"), events)
        assert session.cost is None
        assert events.of(UsageUpdated)[-1].cost is None


async def test_a_cancel_during_children_settles_every_history_and_the_next_prompt_works(
    model_env: ScriptedLLM, tmp_path: Path
) -> None:
    llm = model_env
    llm.rule(is_child, Stall(seconds=60))  # the children hang on their model
    llm.push(Reply(tool_calls=[task("t1", "CHILD one"), task("t2", "CHILD two")]))
    events = Events()
    async with Agent(config(tmp_path / "home")) as agent:
        session = agent.create_session(tmp_path)
        async with anyio.create_task_group() as tg:

            async def prompt() -> None:
                await agent.prompt(session, Message("user", "delegate"), events)

            tg.start_soon(prompt)
            await anyio.to_thread.run_sync(llm.wait_for_requests, 3, 20.0)
            tg.cancel_scope.cancel()
        started = events.of(SubagentStarted)
        assert len(started) == 2
        finished = events.of(SubagentFinished)
        assert sorted(f.session_id for f in finished) == sorted(s.session_id for s in started)
        assert {f.stop_reason for f in finished} == {"cancelled"}
        # each child's end is told before the parent's call that ran it ends
        for f in finished:
            end = next(
                i
                for i, e in enumerate(events)
                if isinstance(e, ToolCallEnd) and e.call.id == f.parent_call_id
            )
            assert events.index(f) < end
        for sid in [session.id, *(s.session_id for s in started)]:
            validate(await agent.store.load_context(sid))
        llm.reset()
        llm.push(Reply(text="after the cancel"))
        result = await agent.prompt(session, Message("user", "again"), Events())
        assert result.stop_reason == "end_turn"
        assert session.messages[-1].content == "after the cancel"


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        (Fault(500, "the model is down"), "Error: The subagent's model call failed:"),
        (Fault(401, "invalid api key"), "Error: The subagent failed: Authentication required"),
    ],
)
async def test_a_child_whose_model_fails_is_an_error_result_and_the_parent_goes_on(
    model_env: ScriptedLLM, tmp_path: Path, fault: Fault, said: str
) -> None:
    llm = model_env
    llm.rule(is_child, fault)
    llm.push(Reply(tool_calls=[task("t1", "CHILD fails")]), Reply(text="parent went on"))
    no_retries = {"openai": ProviderSettings(max_retries=0)}
    events = Events()
    async with Agent(config(tmp_path / "home", providers=no_retries)) as agent:
        session = agent.create_session(tmp_path)
        result = await agent.prompt(session, Message("user", "delegate"), events)
        assert result.stop_reason == "end_turn" and session.messages[-1].content == "parent went on"
        stored = tool_results(list(session.messages))["t1"]
        assert stored.content.startswith(said)
        assert str(fault.status) in stored.content
        (finished,) = events.of(SubagentFinished)
        assert finished.stop_reason == "failed" and finished.error
        validate(await agent.store.load_context(finished.session_id))
