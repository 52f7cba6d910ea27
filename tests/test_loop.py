"""How the loop ends turns: actions checked against the loop's state, after_agent always
run, every started tool call given a final status, and model-call failures named after
their cause (configuration, provider, hook). Driven through `Agent.run_turn`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anyio
import pytest

import crow.loop
from crow.actions import Compact, Continue, LoopState, Replace, Stop, refusal
from crow.agent import Agent
from crow.config import Config
from crow.errors import AuthRequired
from crow.events import Notice, ToolCallEnd, ToolCallRunning, ToolCallStart
from crow.llm.base import ModelRequest, ModelResponse
from crow.messages import Message, ToolCall, ai, human
from tests.test_hooks import echo_agent, make_agent, run

pytestmark = pytest.mark.anyio


# ------------------------------------------------------------------ actions
def test_the_one_rule_for_actions() -> None:
    call = ToolCall("c1", "echo", {})
    stop_state = LoopState("agent_stop", pending=(), continues_left=1, can_compact=True)
    waiting = LoopState("after_model_call", pending=(call,), continues_left=1, can_compact=True)
    assert refusal(Continue(["again"]), stop_state) is None
    assert refusal(Continue(["again"]), waiting) == "Continue is honoured at agent_stop only"
    assert refusal(Continue(["again"]), stop_state._replace(continues_left=0)) == (
        "the limit of continues for this prompt is reached"
    )
    assert refusal(Replace([human("summary")]), stop_state) is None
    assert refusal(Replace([human("summary")]), waiting) == (
        "the model's tool calls (c1) wait for their results; return Compact, or Replace at agent_stop"
    )
    assert refusal(Replace([Message("tool", "orphan", tool_call_id="x", name="f")]), stop_state) == (
        "message 0 (tool): answers no open tool call ('x')"
    )
    assert refusal(Compact(), waiting) is None
    assert refusal(Compact(), waiting._replace(can_compact=False)) == "this agent has no compaction service"
    assert refusal(Stop(), waiting) is None
    assert refusal(Stop("blocked"), waiting) is None, "a Stop always stops (unknown reasons end as end_turn)"


async def test_replace_while_tool_calls_wait_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Seed 002's runtime hook returns a Replace whatever the response holds: the tool
    calls then run and their results must not land after the replacement."""
    agent = echo_agent(tmp_path, ToolCall("c1", "echo", {"text": "x"}))

    async def summarize(ctx: Any, response: ModelResponse) -> Replace | None:
        if response.message.tool_calls:
            return Replace([human("Compacted summary of the conversation")])
        return None

    agent.hooks.register("mid_react", summarize, name="auto_compact")
    result, session, _ = await run(agent, tmp_path)
    session.messages.validate()
    assert [m.role for m in session.messages] == ["user", "assistant", "tool", "assistant"]
    assert session.messages[0].content == "hi" and session.messages[-1].content == "done"
    assert "hook auto_compact: Replace refused: the model's tool calls (c1) wait" in caplog.text
    assert result.stop_reason == "end_turn"


async def test_stop_with_an_unknown_reason_still_stops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[str] = []
    agent = echo_agent(tmp_path, ToolCall("c1", "echo", {"text": "x"}), seen=seen)

    async def guard(ctx: Any) -> Stop:
        return Stop("blocked")

    agent.hooks.register("after_model_call", guard, name="guard")
    result, session, _ = await run(agent, tmp_path)
    assert result.stop_reason == "end_turn" and seen == []
    assert (
        "hook guard: Stop reason 'blocked' is not one of end_turn, max_tokens, max_turn_requests"
        in caplog.text
    )
    session.messages.validate()


# ------------------------------------------------------------------ after_agent and cancels
def slow_tool_agent(tmp_path: Path, ran: list[str]) -> Agent:
    """The model calls `wait` (sleeps 30 s); hooks record after_agent into `ran`."""
    answers = iter([ModelResponse(ai("", ToolCall("c1", "wait", {})), stop_reason="tool_use")])
    agent, _ = make_agent(tmp_path, lambda req: next(answers))

    @agent.tool(read_only=True)
    async def wait() -> str:
        """Wait a long time."""
        await anyio.sleep(30)
        return "waited"

    async def record(ctx: Any) -> None:
        await anyio.sleep(0.05)  # a checkpoint: only a shielded hook gets past it after a cancel
        ran.append("after_agent")

    agent.hooks.register("post_request", record, name="record")
    return agent


async def test_cancel_ends_started_tool_calls_and_runs_after_agent(tmp_path: Path) -> None:
    ran: list[str] = []
    agent = slow_tool_agent(tmp_path, ran)
    events: list[Any] = []
    session = agent.create_session(tmp_path)

    with anyio.CancelScope() as scope:

        async def emit(event: Any) -> None:
            events.append(event)
            if isinstance(event, ToolCallRunning):
                scope.cancel()  # the user cancels while the tool runs

        await agent.run_turn(session, human("wait"), emit)
    await agent.aclose()
    assert scope.cancelled_caught
    assert [type(e) for e in events if isinstance(e, ToolCallStart | ToolCallRunning | ToolCallEnd)] == [
        ToolCallStart,
        ToolCallRunning,
        ToolCallEnd,
    ]
    end = events[-1]
    assert isinstance(end, ToolCallEnd) and end.call.id == "c1"
    assert end.result.error == "Cancelled by the user before this tool finished."
    assert ran == ["after_agent"], "after_agent runs, shielded, after a cancel"
    session.messages.validate()


async def test_after_agent_is_bounded_after_a_cancel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crow.loop, "CANCEL_GRACE", 0.3)
    ran: list[str] = []
    agent = slow_tool_agent(tmp_path, ran)

    async def hang(ctx: Any) -> None:
        await anyio.sleep(30)
        ran.append("never")

    agent.hooks.register("post_request", hang, name="hang", order=1)  # after record
    session = agent.create_session(tmp_path)
    started = anyio.current_time()
    with anyio.CancelScope() as scope:

        async def emit(event: Any) -> None:
            if isinstance(event, ToolCallRunning):
                scope.cancel()

        await agent.run_turn(session, human("wait"), emit)
    await agent.aclose()
    assert scope.cancelled_caught and ran == ["after_agent"]
    assert anyio.current_time() - started < 2


async def test_after_agent_runs_when_the_turn_fails(tmp_path: Path) -> None:
    ran: list[str] = []
    agent = slow_tool_agent(tmp_path, ran)
    session = agent.create_session(tmp_path)

    async def broken_sink(event: Any) -> None:
        if isinstance(event, ToolCallStart):
            raise ConnectionResetError("the client went away")

    with pytest.raises(ConnectionResetError):
        await agent.run_turn(session, human("wait"), broken_sink)
    await agent.aclose()
    assert ran == ["after_agent"]
    session.messages.validate()


# ------------------------------------------------------------------ model-call failures, named
def notices(events: list[Any]) -> list[str]:
    return [e.text for e in events if isinstance(e, Notice)]


async def test_a_missing_api_key_ends_the_turn_as_auth_required(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The user is told (a notice, kept), the history is valid, and the front end gets
    `AuthRequired` (ACP: auth_required) so it can have the user log in."""
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    agent = Agent(Config(home=tmp_path / "home", model="openai:gpt-4.1-mini"), builtin_hooks=False)
    caplog.set_level(logging.INFO)
    events: list[Any] = []
    session = agent.create_session(tmp_path)
    with pytest.raises(AuthRequired) as info:
        await agent.run_turn(session, human("hi"), _append(events))
    await agent.aclose()
    missing = "openai: no API key; set OPENAI_API_KEY or run `crow login`"
    assert str(info.value) == f"Authentication required: {missing}"
    assert notices(events) == [f"Cannot call the model: {missing}"]
    assert [m.role for m in session.messages] == ["user"]
    session.messages.validate()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], "no traceback"


def _append(events: list[Any]) -> Any:
    async def emit(event: Any) -> None:
        events.append(event)

    return emit


async def test_a_provider_bug_is_named_as_the_provider_s(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(request: ModelRequest) -> ModelResponse:
        raise KeyError("choices")

    agent, _ = make_agent(tmp_path, broken)
    result, _, events = await run(agent, tmp_path)
    why = "provider scripted failed unexpectedly (a bug in the provider): KeyError('choices')"
    assert notices(events) == [f"Model call failed: {why}"] and result.error == why
    assert [r.getMessage() for r in caplog.records if r.exc_info] == ["provider scripted failed unexpectedly"]


async def test_a_failing_wrap_model_call_hook_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent, _ = make_agent(tmp_path, lambda req: ModelResponse(ai("answer")))
    errors: list[Exception] = []

    async def flaky(request: ModelRequest, call_next: Any) -> ModelResponse:
        await call_next(request)
        raise ValueError("lost the response")

    async def on_error(error: Exception) -> None:
        errors.append(error)

    agent.hooks.register("wrap_model_call", flaky, name="flaky")
    agent.hooks.register("on_error", on_error)
    result, _, events = await run(agent, tmp_path)
    why = "hook flaky failed at wrap_model_call: ValueError('lost the response')"
    assert notices(events) == [f"Model call failed: {why}"] and result.error == why
    assert [str(e) for e in errors] == [why]
    assert [r.getMessage() for r in caplog.records if r.exc_info] == ["hook flaky failed at wrap_model_call"]
