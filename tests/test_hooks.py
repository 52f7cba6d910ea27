"""The hook API: phases, aliases, registration checks, onion order, actions, and the loop's
handling of hook failures and actions (driven with ScriptedProvider, no network)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from crow.agent import Agent
from crow.config import Config
from crow.context import HookContext
from crow.errors import HookError
from crow.events import Notice, TextDelta
from crow.hooks import ALIASES, PHASE_ARGS, PHASES, Continue, Hook, HookRegistry, Replace, Stop
from crow.llm.base import ModelRequest, ModelResponse, ScriptedProvider
from crow.messages import Message, ToolCall, ToolResult, ai, human

pytestmark = pytest.mark.anyio


def test_hook_base_class_defines_exactly_the_eight_async_phases() -> None:
    assert len(PHASES) == 8
    for phase in PHASES:
        assert inspect.iscoroutinefunction(getattr(Hook, phase)), phase
    async_methods = {n for n, f in vars(Hook).items() if inspect.iscoroutinefunction(f)}
    assert async_methods == set(PHASES)
    for phase in PHASES:  # the names a phase offers are the base class's parameter names
        assert tuple(inspect.signature(getattr(Hook, phase)).parameters)[1:] == PHASE_ARGS[phase], phase
    assert set(ALIASES.values()) <= set(PHASES)
    for seed in ("pre_request", "mid_react", "post_react_loop", "post_request", "AfterLLMCall", "OnError"):
        assert seed in ALIASES


def test_only_overridden_phases_are_wired() -> None:
    class OnlyStop(Hook):
        async def agent_stop(self, ctx: Any) -> None:
            return None

    registry = HookRegistry()
    registry.register(OnlyStop())
    assert registry.names("agent_stop") == ["OnlyStop"]
    assert all(registry.names(p) == [] for p in PHASES if p != "agent_stop")


def test_a_hook_class_with_a_method_named_by_an_alias_fails_registration() -> None:
    """Aliases name phases for functions and entry points; on a class such a method was
    never called, silently (seed 001's classes spell phases `WrapToolCall`)."""

    class Seedish(Hook):
        async def before_agent(self, ctx: Any) -> None: ...

        async def mid_react(self, ctx: Any, response: Any) -> None: ...

    registry = HookRegistry()
    with pytest.raises(
        HookError,
        match=r"hook 'Seedish' defines mid_react, which a Hook class never runs: "
        r"name the method after_model_call",
    ):
        registry.register(Seedish())

    class BeforeTool(Hook):
        async def BeforeToolExec(self, ctx: Any, call: Any) -> None: ...

    with pytest.raises(HookError, match=r"defines BeforeToolExec, .*: name the method wrap_tool_call"):
        registry.register(BeforeTool())
    assert registry.names() == []


def test_registration_is_validated_and_atomic() -> None:
    registry = HookRegistry()

    def sync_fn(ctx: Any) -> None: ...

    async def no_next(ctx: Any, call: Any) -> None: ...

    async def ok(ctx: Any) -> None: ...

    with pytest.raises(HookError, match="must be an async function"):
        registry.register("mid_react", sync_fn)
    with pytest.raises(HookError, match="must accept call_next"):
        registry.register("wrap_tool_call", no_next)
    with pytest.raises(HookError, match="unknown hook phase 'nope'"):
        registry.register("nope", ok)

    class Broken(Hook):
        async def before_agent(self, ctx: Any) -> None: ...

        def agent_stop(self, ctx: Any) -> None:  # type: ignore[override]  # sync: invalid
            ...

    with pytest.raises(HookError):
        registry.register(Broken())
    assert registry.names() == [], "nothing half-registered"
    registry.register("pre_request", ok, name="ok")
    with pytest.raises(HookError, match="already registered"):
        registry.register("post_request", ok, name="ok")
    registry.freeze()
    with pytest.raises(HookError, match="frozen"):
        registry.register("post_request", ok, name="late")


def make_agent(tmp_path: Path, handler: Any) -> tuple[Agent, ScriptedProvider]:
    provider = ScriptedProvider(handler)
    agent = Agent(Config(home=tmp_path / "home", mode="yolo"), provider=provider, builtin_hooks=False)
    return agent, provider


def echo_agent(tmp_path: Path, *calls: ToolCall, seen: list[str] | None = None) -> Agent:
    """An agent whose model calls the `echo` tool (`calls`, in one turn), then answers "done"."""
    answers = iter([ModelResponse(ai("", *calls), stop_reason="tool_use"), ModelResponse(ai("done"))])
    agent, _ = make_agent(tmp_path, lambda req: next(answers))

    @agent.tool(read_only=True)
    async def echo(text: str) -> str:
        """Echo."""
        if seen is not None:
            seen.append("tool")
        return text

    return agent


async def run(agent: Agent, tmp_path: Path, text: str = "hi") -> tuple[Any, Any, list[Any]]:
    events: list[Any] = []

    async def emit(event: Any) -> None:
        events.append(event)

    session = agent.create_session(tmp_path)
    try:
        result = await agent.run_turn(session, human(text), emit)
    finally:
        await agent.aclose()
    return result, session, events


async def test_onion_order_and_every_phase_fires(tmp_path: Path) -> None:
    order: list[str] = []
    agent = echo_agent(tmp_path, ToolCall("c1", "echo", {"text": "x"}), seen=order)

    def wrapper(name: str) -> Any:
        async def wrap_model(ctx: Any, request: ModelRequest, call_next: Any) -> ModelResponse:
            order.append(f"{name}>model")
            response = await call_next(request)
            order.append(f"{name}<model")
            return response

        async def wrap_tool(ctx: Any, call: ToolCall, call_next: Any) -> ToolResult:
            order.append(f"{name}>tool")
            result = await call_next(call)
            order.append(f"{name}<tool")
            return result

        return wrap_model, wrap_tool

    for rank, name in enumerate(("outer", "inner")):  # by name alone "inner" would be outside
        model, tool = wrapper(name)
        agent.hooks.register("wrap_model_call", model, name=f"{name}-model", order=rank)
        agent.hooks.register("wrap_tool_call", tool, name=f"{name}-tool", order=rank)
    for phase in ("pre_request", "modify_request", "mid_react", "post_react_loop", "post_request"):

        async def observer(ctx: Any, *args: Any, phase: str = phase) -> None:
            order.append(phase)

        agent.hooks.register(phase, observer, name=phase)

    result, _, _ = await run(agent, tmp_path)
    assert result.stop_reason == "end_turn"
    assert order == [
        "pre_request",
        "modify_request",
        "outer>model",
        "inner>model",
        "inner<model",
        "outer<model",
        "mid_react",
        "outer>tool",
        "inner>tool",
        "tool",
        "inner<tool",
        "outer<tool",
        "modify_request",
        "outer>model",
        "inner>model",
        "inner<model",
        "outer<model",
        "mid_react",
        "post_react_loop",
        "post_request",
    ]


async def test_failing_observer_is_skipped_and_failing_wrapper_becomes_a_tool_error(tmp_path: Path) -> None:
    agent = echo_agent(tmp_path, ToolCall("c1", "echo", {"text": "x"}))

    async def broken_observer(ctx: Any) -> None:
        raise RuntimeError("observer broke")

    async def broken_wrapper(ctx: Any, call: Any, call_next: Any) -> Any:
        raise RuntimeError("wrapper broke")

    agent.hooks.register("pre_request", broken_observer)
    agent.hooks.register("wrap_tool_call", broken_wrapper)
    result, session, _ = await run(agent, tmp_path)
    assert result.stop_reason == "end_turn"
    tool = [m for m in session.messages if m.role == "tool"][0]
    assert tool.is_error and "wrapper broke" in tool.content


async def test_continue_is_bounded_and_replace_is_validated(tmp_path: Path) -> None:
    agent, provider = make_agent(tmp_path, lambda req: ModelResponse(ai("answer")))
    agent.config.max_continues = 2

    async def again(ctx: Any) -> Continue:
        return Continue(["Are you sure?"])

    agent.hooks.register("post_react_loop", again)
    result, session, _ = await run(agent, tmp_path)
    assert result.stop_reason == "end_turn"
    assert len(provider.requests) == 3, "one answer plus two continues"
    assert [m.content for m in session.messages if m.role == "user"] == [
        "hi",
        "Are you sure?",
        "Are you sure?",
    ]


async def test_an_invalid_replace_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    agent, _ = make_agent(tmp_path, lambda req: ModelResponse(ai("long answer")))

    async def invalid(ctx: Any) -> Replace:
        return Replace([Message("tool", "orphan", tool_call_id="x", name="f")])

    agent.hooks.register("mid_react", invalid, name="invalid")
    _, session, _ = await run(agent, tmp_path)
    assert [m.content for m in session.messages] == ["hi", "long answer"]
    assert "hook invalid: Replace refused: " in caplog.text


async def test_a_valid_replace_at_agent_stop_is_applied(tmp_path: Path) -> None:
    agent, _ = make_agent(tmp_path, lambda req: ModelResponse(ai("long answer")))

    async def valid(ctx: Any) -> Replace:
        return Replace([human("summary of it all")])

    agent.hooks.register("post_react_loop", valid, name="valid")
    _, session, _ = await run(agent, tmp_path)
    assert [m.content for m in session.messages] == ["summary of it all"]


async def test_stop_after_tool_calls_answers_them(tmp_path: Path) -> None:
    agent, provider = make_agent(
        tmp_path, lambda req: ModelResponse(ai("", ToolCall("c1", "echo", {})), stop_reason="tool_use")
    )

    async def stop(ctx: Any) -> Stop:
        return Stop()

    agent.hooks.register("mid_react", stop)
    result, session, _ = await run(agent, tmp_path)
    assert result.stop_reason == "end_turn" and len(provider.requests) == 1
    session.messages.validate()
    assert "stopped the turn" in session.messages[-1].content


async def test_before_tool_exec_can_block_and_after_can_rewrite(tmp_path: Path) -> None:
    agent = echo_agent(tmp_path, ToolCall("c1", "echo", {"text": "rm -rf"}), ToolCall("c2", "echo", {"text": "fine"}))

    async def guard(ctx: Any, call: ToolCall) -> ToolResult | None:
        if "rm" in call.args.get("text", ""):
            return ToolResult(call.id, call.name, error="blocked by policy")
        return None

    async def shout(ctx: Any, call: ToolCall, result: ToolResult) -> ToolResult:
        return result.replace(output=result.output.upper())

    agent.hooks.register("BeforeToolExec", guard)
    agent.hooks.register("AfterToolExec", shout)
    _, session, _ = await run(agent, tmp_path)
    results = {m.tool_call_id: m for m in session.messages if m.role == "tool"}
    assert results["c1"].is_error and "blocked by policy" in results["c1"].content
    assert results["c2"].content == "FINE"


async def test_inject_context_reaches_the_system_prompt(tmp_path: Path) -> None:
    agent, provider = make_agent(tmp_path, lambda req: ModelResponse(ai("ok")))

    async def weather(ctx: Any) -> None:
        if "weather" in ctx.prompt:
            ctx.inject_context("Current weather: sunny")

    agent.hooks.register("pre_request", weather)
    await run(agent, tmp_path, "what's the weather?")
    assert "Current weather: sunny" in provider.requests[0].messages[0].content


# ------------------------------------------------------------------ calling hooks by name
async def test_functions_are_called_by_parameter_name(tmp_path: Path) -> None:
    agent = echo_agent(tmp_path, ToolCall("c1", "echo", {"text": "x"}))
    seen: dict[str, Any] = {}

    async def response_only(response: ModelResponse) -> None:
        seen.setdefault("response_only", response)

    async def ctx_and_response(ctx: HookContext, response: ModelResponse) -> None:
        seen.setdefault("ctx_and_response", (ctx, response))

    async def keywords(*, response: ModelResponse, ctx: HookContext) -> None:
        seen.setdefault("keywords", (ctx, response))

    async def wrap(call_next: Any, call: ToolCall) -> ToolResult:  # any order
        seen["wrap"] = call.id
        return await call_next(call)

    agent.hooks.register("after_model_call", response_only)
    agent.hooks.register("mid_react", ctx_and_response)
    agent.hooks.register("AfterLLMCall", keywords)
    agent.hooks.register("wrap_tool_call", wrap)
    result, session, _ = await run(agent, tmp_path)
    assert result.stop_reason == "end_turn" and session.messages[-1].content == "done"
    assert isinstance(seen["response_only"], ModelResponse)
    for name in ("ctx_and_response", "keywords"):
        ctx, response = seen[name]
        assert isinstance(ctx, HookContext) and isinstance(response, ModelResponse), name
    assert seen["wrap"] == "c1"


def test_a_parameter_the_phase_does_not_offer_fails_at_registration() -> None:
    registry = HookRegistry()

    async def misnamed(ctx: Any, resp: Any) -> None: ...

    with pytest.raises(
        HookError,
        match=r"hook 'misnamed' at after_model_call: .*misnamed\(ctx: 'Any', resp: 'Any'\) has a parameter "
        r"'resp' this phase does not offer; it offers \(ctx, response\)",
    ):
        registry.register("mid_react", misnamed, name="misnamed")

    async def with_default(ctx: Any, response: Any, verbose: bool = False) -> None: ...

    registry.register("after_model_call", with_default, name="with_default")  # a default: left alone

    class Renamed(Hook):
        async def wrap_tool_call(self, ctx: Any, tool_call: Any, handler: Any) -> Any: ...

    with pytest.raises(HookError, match=r"hook 'Renamed' at wrap_tool_call: .*'tool_call'"):
        registry.register(Renamed())

    async def block(ctx: Any, req: Any) -> None: ...

    with pytest.raises(HookError, match=r"hook 'block' at BeforeLLMCall: .*'req'.*\(ctx, request\)"):
        registry.register("BeforeLLMCall", block, name="block")
    assert registry.names() == ["with_default"], "nothing half-registered"


async def test_before_llm_call_that_raises_stops_the_call_and_says_why(tmp_path: Path) -> None:
    agent, provider = make_agent(tmp_path, lambda req: ModelResponse(ai("answer")))

    async def budget(request: ModelRequest) -> None:
        raise RuntimeError("over the budget")

    agent.hooks.register("BeforeLLMCall", budget, name="budget")
    result, session, events = await run(agent, tmp_path)
    assert provider.requests == [], "the model was not called"
    why = "blocked by hook budget (BeforeLLMCall): over the budget"
    assert result.stop_reason == "end_turn" and result.error == why
    told = f"Model call {why}"
    assert [e.text for e in events if isinstance(e, Notice)] == [told]  # the user is told
    # ... and the model reads it at its next call
    assert [(m.role, m.content) for m in session.messages] == [("user", "hi"), ("assistant", f"[{told}]")]


async def test_a_failing_modify_request_is_skipped(tmp_path: Path) -> None:
    agent, provider = make_agent(tmp_path, lambda req: ModelResponse(ai("answer")))

    async def broken(request: ModelRequest) -> None:
        raise RuntimeError("observer broke")

    agent.hooks.register("modify_request", broken)
    result, _, _ = await run(agent, tmp_path)
    assert result.error is None and len(provider.requests) == 1


async def test_before_tool_exec_that_raises_fails_that_call_only(tmp_path: Path) -> None:
    seen: list[str] = []
    agent = echo_agent(
        tmp_path, ToolCall("c1", "echo", {"text": "rm -rf"}), ToolCall("c2", "echo", {"text": "fine"}), seen=seen
    )

    async def guard(call: ToolCall) -> None:
        if "rm" in call.args["text"]:
            raise PermissionError("rm is not allowed here")

    async def broken_observer(result: ToolResult) -> None:  # AfterToolExec observes: fail-open
        raise RuntimeError("observer broke")

    agent.hooks.register("BeforeToolExec", guard, name="guard")
    agent.hooks.register("AfterToolExec", broken_observer)
    result, session, _ = await run(agent, tmp_path)
    results = {m.tool_call_id: m for m in session.messages if m.role == "tool"}
    assert results["c1"].is_error
    assert results["c1"].content == "Error: blocked by hook guard (BeforeToolExec): rm is not allowed here"
    assert not results["c2"].is_error and results["c2"].content == "fine"
    assert seen == ["tool"], "the blocked call never ran"
    assert result.stop_reason == "end_turn" and session.messages[-1].content == "done"


async def test_a_wrap_model_call_returning_no_response_fails_that_call_by_name(tmp_path: Path) -> None:
    agent, _ = make_agent(tmp_path, lambda req: ModelResponse(ai("answer")))

    async def forgetful(request: ModelRequest, call_next: Any) -> None:
        await call_next(request)  # ... and forgets to return the response

    agent.hooks.register("wrap_model_call", forgetful, name="forgetful")
    result, _, events = await run(agent, tmp_path)
    why = "hook forgetful failed at wrap_model_call: TypeError('returned None, not a ModelResponse')"
    assert result.stop_reason == "end_turn" and result.error == why
    assert [e.text for e in events if isinstance(e, Notice)] == [f"Model call failed: {why}"]


async def test_a_wrap_tool_call_returning_no_result_is_named(tmp_path: Path) -> None:
    agent = echo_agent(tmp_path, ToolCall("c1", "echo", {"text": "x"}))

    async def forgetful(call: ToolCall, call_next: Any) -> str:
        return "x"

    agent.hooks.register("wrap_tool_call", forgetful, name="forgetful")
    _, session, _ = await run(agent, tmp_path)
    [result] = [m for m in session.messages if m.role == "tool"]
    assert result.is_error
    assert (
        result.content
        == "Error: hook forgetful failed at wrap_tool_call: TypeError(\"returned 'x', not a ToolResult\")"
    )


@pytest.mark.parametrize(
    ("action", "why"),
    [
        (Continue("again"), "Continue takes a list of messages, not one string"),
        (Continue([123]), "Continue's messages must be Message objects or strings; got 123"),
        (Continue([]), "Continue without messages: nothing new for the model to answer"),
        (Replace("hello"), "Replace takes a list of messages, not one string"),  # type: ignore[arg-type]
        (Replace(["hello"]), "Replace's messages must be Message objects; got 'hello'"),  # type: ignore[list-item]
    ],
)
async def test_a_malformed_action_is_refused_not_crashed_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, action: Any, why: str
) -> None:
    agent, _ = make_agent(tmp_path, lambda req: ModelResponse(ai("answer")))

    async def buggy(ctx: Any) -> Any:
        return action

    agent.hooks.register("agent_stop", buggy, name="buggy")
    result, session, _ = await run(agent, tmp_path)
    assert result.stop_reason == "end_turn" and result.error is None
    assert [(m.role, m.content) for m in session.messages] == [("user", "hi"), ("assistant", "answer")]
    assert f"hook buggy: {type(action).__name__} refused: {why}" in caplog.text


def test_an_order_that_is_not_an_int_fails_registration_and_registers_nothing() -> None:
    class Odd(Hook):
        order = "5"  # type: ignore[assignment]

        async def before_agent(self, ctx: Any) -> None: ...

    async def first(ctx: Any) -> None: ...

    registry = HookRegistry()
    registry.register("before_agent", first, name="first")
    with pytest.raises(HookError, match=r"hook 'Odd': order must be an int, got '5'"):
        registry.register(Odd())
    assert registry.names("before_agent") == ["first"], "nothing half-registered"


async def test_an_object_with_an_async_call_is_a_hook_function(tmp_path: Path) -> None:
    """Seed 004's hook is `class Hook(Protocol): async def __call__(self, ctx)`."""
    agent, _ = make_agent(tmp_path, lambda req: ModelResponse(ai("answer")))

    class SkillHook:
        def __init__(self) -> None:
            self.prompts: list[str] = []

        async def __call__(self, ctx: HookContext) -> None:
            self.prompts.append(ctx.prompt)

    skill = SkillHook()
    agent.hooks.register("pre_request", skill, name="skill")
    with pytest.raises(HookError, match="must be an async function"):
        agent.hooks.register("pre_request", SkillHook, name="the-class")  # the class is not one
    await run(agent, tmp_path, "weather?")
    assert skill.prompts == ["weather?"]


async def test_a_failing_sink_is_not_blamed_on_the_wrap_hook_around_it(tmp_path: Path) -> None:
    """What the innermost step raises (here the front end's sink, while the answer streams)
    passes every layer unchanged, as it would with no hook at all."""
    agent, _ = make_agent(tmp_path, lambda req: ModelResponse(ai("answer")))

    async def passthrough(request: ModelRequest, call_next: Any) -> ModelResponse:
        return await call_next(request)

    agent.hooks.register("wrap_model_call", passthrough, name="passthrough")

    async def broken_sink(event: Any) -> None:
        if isinstance(event, TextDelta):
            raise BrokenPipeError("the terminal went away")

    session = agent.create_session(tmp_path)
    try:
        with pytest.raises(BrokenPipeError, match="the terminal went away"):
            await agent.run_turn(session, human("hi"), broken_sink)
    finally:
        await agent.aclose()
