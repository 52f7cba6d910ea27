"""One prompt turn: the react loop through the hook stack.

    before_agent                                  once
    repeat up to max_iterations:
        modify_request                            on a copy (the request is frozen)
        wrap_model_call onion -> provider.stream  deltas go to the sink as they arrive
        after_model_call                          may return an action
        tool calls, each through the wrap_tool_call onion
                                                  concurrently; conflicting calls (one path,
                                                  a command) in the order given: crow.batch
        no tool calls -> agent_stop               continue / replace / compact / stop
    after_agent

The loop knows nothing about ACP: it emits `crow.events` to a sink.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import anyio

from crow.batch import run_batch, waits_for
from crow.context import HookContext
from crow.errors import ContextLengthError, ProviderError, StreamCutError
from crow.events import (
    Emit,
    Notice,
    TextDelta,
    ThoughtDelta,
    ToolCallEnd,
    ToolCallRunning,
    ToolCallStart,
    UsageUpdated,
)
from crow.hooks import ActionPicker, Compact, Continue, HookRegistry, Replace, Stop, build_chain
from crow.llm.base import ModelRequest, ModelResponse, Provider, ToolSpec
from crow.messages import (
    InvalidMessages,
    Message,
    ToolCall,
    ToolResult,
    close_dangling_tool_calls,
    human,
    system,
    validate,
)
from crow.rules import FILE_TOOLS
from crow.tool_kinds import presented

if TYPE_CHECKING:
    from crow.session import Session

log = logging.getLogger("crow.loop")

TurnStop = Literal["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"]


@dataclass
class TurnResult:
    stop_reason: TurnStop
    error: str | None = None  # a model failure the user was told about


@dataclass
class LoopSettings:
    system_prompt: str = ""
    max_iterations: int = 25
    max_continues: int = 5
    compact_threshold: float = 0.85
    hook_settings: dict[str, Any] = field(default_factory=dict)


class Turn:
    """Runs one prompt against a session. Build one per prompt; call `run`."""

    def __init__(
        self,
        session: Session,
        *,
        hooks: HookRegistry,
        provider: Provider | None,
        emit: Emit,
        settings: LoopSettings,
        compactor: Any = None,
        no_model_message: str = "No model is configured.",
    ) -> None:
        self.session = session
        self.hooks = hooks
        self.provider = provider
        self.emit = emit
        self.settings = settings
        self.compactor = compactor
        self.no_model_message = no_model_message
        self._tool_specs: dict[str, ToolSpec] = {}
        self._partial: list[str] = []  # text of the model call in flight already shown

    async def run(self, prompt: Message) -> TurnResult:
        hooks, session = self.hooks, self.session
        hooks.freeze()
        ctx = HookContext(
            session,
            prompt.content,
            self.provider,
            self.emit,
            settings=self.settings.hook_settings,
            compact_threshold=self.settings.compact_threshold,
            compactor=self.compactor,
        )
        self.ctx = ctx
        await session.add(prompt)
        try:
            await self._observe("before_agent", ctx)
            result = await self._react(ctx)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._settle_interrupted()
            raise
        await self._observe("after_agent", ctx)
        return result

    # ------------------------------------------------------------ the loop
    async def _react(self, ctx: HookContext) -> TurnResult:
        continues = 0
        compacted_for_length = False
        for iteration in range(self.settings.max_iterations):
            ctx.iteration = iteration
            if self.provider is None:
                await self.emit(Notice(self.no_model_message))
                return TurnResult("end_turn", self.no_model_message)
            try:
                response = await self._call_model(ctx)
            except ContextLengthError as exc:
                if compacted_for_length or self.compactor is None:
                    return await self._model_failed(ctx, exc)
                compacted_for_length = True
                result = await self.compactor.compact(self.session, self.provider, emit=self.emit)
                if not result.compacted:
                    return await self._model_failed(ctx, exc)
                continue
            except ProviderError as exc:
                return await self._model_failed(ctx, exc)

            msg = self.session.unique_tool_ids(response.message)
            if msg is not response.message:
                response = ModelResponse(msg, response.usage, response.stop_reason, response.model)
            ctx.response = response
            if msg.content or msg.tool_calls or msg.thinking:
                await self.session.add(msg)
            if response.usage is not None:
                self.session.last_usage = response.usage
                self.session.usage_covers = len(self.session.messages)
                ctx.usage = ctx.usage + response.usage
            await self.emit(UsageUpdated(self.session.context_tokens(), ctx.context_window))

            picker = ActionPicker()
            for impl in self.hooks.at("after_model_call"):
                picker.offer(impl.name, await self._guarded(impl, ctx, response))
            if (done := await self._apply(picker, ctx, allow_continue=False)) is not None:
                return done

            if msg.tool_calls:
                await self._run_tools(ctx, msg.tool_calls)
                continue
            if response.stop_reason in ("max_tokens", "refusal"):
                return TurnResult(response.stop_reason)

            picker = ActionPicker()
            for impl in self.hooks.at("agent_stop"):
                picker.offer(impl.name, await self._guarded(impl, ctx))
            if isinstance(picker.chosen, Continue):
                if continues >= self.settings.max_continues:
                    log.warning(
                        "hook %s asked to continue again; limit of %d reached",
                        picker.chosen_by,
                        self.settings.max_continues,
                    )
                    return TurnResult("end_turn")
                continues += 1
                extra = [m if isinstance(m, Message) else human(m) for m in picker.chosen.messages]
                await self.session.add(*extra)
                continue
            done = await self._apply(picker, ctx, allow_continue=False)
            return done or TurnResult("end_turn")
        return TurnResult("max_turn_requests")

    async def _apply(
        self, picker: ActionPicker, ctx: HookContext, *, allow_continue: bool
    ) -> TurnResult | None:
        action = picker.chosen
        if action is None:
            return None
        if isinstance(action, Stop):
            # Tool calls the model asked for will not run: answer them so the history stays valid.
            fixed = close_dangling_tool_calls(
                list(self.session.messages), f"Not run: hook {picker.chosen_by} stopped the turn."
            )
            if len(fixed) != len(self.session.messages):
                await self.session.add(*fixed[len(self.session.messages) :])
            return TurnResult(
                action.reason if action.reason in ("end_turn", "max_tokens", "refusal") else "end_turn"
            )  # type: ignore[arg-type]
        if isinstance(action, Compact):
            if self.compactor is not None:
                await self.compactor.compact(
                    self.session, self.provider, instructions=action.instructions, emit=self.emit
                )
            return None
        if isinstance(action, Replace):
            try:
                validate(action.messages)
            except InvalidMessages as exc:
                log.warning("hook %s returned an invalid replace: %s; ignored", picker.chosen_by, exc)
                return None
            await self.session.set_messages(action.messages)
            return None
        if isinstance(action, Continue) and not allow_continue:
            log.warning("hook %s returned continue outside agent_stop; ignored", picker.chosen_by)
        return None

    # ------------------------------------------------------------ model calls
    def build_request(self, ctx: HookContext) -> ModelRequest:
        hub = self.session.tools
        specs = hub.specs() if hub is not None else []
        self._tool_specs = {s.name: s for s in specs}
        prompt = "\n\n".join(p for p in (self.settings.system_prompt, *ctx.injected) if p)
        messages: list[Message] = [system(prompt)] if prompt else []
        messages.extend(self.session.messages)
        return ModelRequest(
            messages=messages, tools=specs, model=self.provider.model if self.provider else ""
        )

    async def _call_model(self, ctx: HookContext) -> ModelResponse:
        request = self.build_request(ctx)
        for impl in self.hooks.at("modify_request"):
            changed = await self._guarded(impl, ctx, request)
            if isinstance(changed, ModelRequest):
                request = changed
        chain = build_chain(self.hooks.at("wrap_model_call"), ctx, self._stream_model)
        try:
            response = await chain(request)
        except ProviderError:
            raise
        except Exception as exc:  # a wrap hook failed: that is this step's error
            log.exception("model call failed inside a wrap_model_call hook")
            raise ProviderError(f"a hook around the model call failed: {exc!r}") from exc
        ctx.request = request
        self.session.last_request = request
        return response

    async def _stream_model(self, request: ModelRequest) -> ModelResponse:
        assert self.provider is not None
        if self._partial:
            # A wrap hook retries after the user already saw text: say so, never replay silently.
            await self.emit(Notice("\n[retrying the model call; the partial answer above is discarded]"))
            self._partial = []
        response: ModelResponse | None = None
        # Read the stream to its end even after the response: leaving early closes the
        # HTTP connection instead of returning it to the keep-alive pool.
        async for event in self.provider.stream(request):
            if isinstance(event, TextDelta):
                self._partial.append(event.text)
                await self.emit(event)
            elif isinstance(event, ThoughtDelta):
                await self.emit(event)
            elif isinstance(event, ModelResponse):
                response = event
        if response is None:
            raise ProviderError("the model ended its stream without a response")
        self._partial = []
        return response

    async def _keep_partial(self, note: str) -> None:
        """What the user saw of an unfinished answer stays in the history, marked."""
        if self._partial:
            text = "".join(self._partial)
            self._partial = []
            await self.session.add(Message("assistant", f"{text}\n\n[{note}]"))

    async def _model_failed(self, ctx: HookContext, exc: ProviderError) -> TurnResult:
        if isinstance(exc, StreamCutError) and exc.partial:
            await self._keep_partial("answer cut off: the connection to the model broke")
        self._partial = []
        await self._observe("on_error", ctx, exc)
        text = f"Model call failed: {exc}"
        await self.emit(Notice(text))
        return TurnResult("end_turn", str(exc))

    # ------------------------------------------------------------ tool calls
    async def _run_tools(self, ctx: HookContext, calls: Sequence[ToolCall]) -> None:
        for call in calls:
            await self.emit(ToolCallStart(call, self._tool_specs.get(call.name)))
        chain = build_chain(self.hooks.at("wrap_tool_call"), ctx, self._execute)

        async def one(call: ToolCall) -> None:
            spec = self._tool_specs.get(call.name)
            await self.emit(ToolCallRunning(call))  # its turn has come: it really starts now
            try:
                result = await chain(call)
            except Exception as exc:  # a wrap hook failed: this call's error, not the turn's
                log.exception("tool call %s failed inside a wrap_tool_call hook", call.name)
                result = ToolResult(call.id, call.name, error=f"a hook around this tool failed: {exc!r}")
            if not isinstance(result, ToolResult):
                result = ToolResult(call.id, call.name, error="a hook returned no tool result")
            result = presented(result.replace(tool_call_id=call.id, name=call.name), call, spec)
            await self.session.add(result.to_message())
            await self.emit(ToolCallEnd(call, result))

        # Effects in the order the model gave: a call waits for the earlier calls it
        # conflicts with (same path, or a command); the others run side by side.
        def read_only(name: str) -> bool:
            spec = self._tool_specs.get(name)
            return bool(spec and spec.read_only)

        # Another server's `path` argument need not be all its tool touches.
        paths_of = FILE_TOOLS.__contains__
        await run_batch(calls, waits_for(calls, read_only, str(self.session.cwd), paths_of), one)

    async def _execute(self, call: ToolCall) -> ToolResult:
        if call.parse_error:
            return ToolResult(
                call.id,
                call.name,
                error=f"{call.parse_error}. Send the arguments again as one valid JSON object.",
            )
        hub = self.session.tools
        if hub is None or not hub.has(call.name):
            known = ", ".join(sorted(self._tool_specs)) or "none"
            return ToolResult(
                call.id, call.name, error=f"unknown tool {call.name!r}; available tools: {known}"
            )
        return await hub.call(call)

    # ------------------------------------------------------------ helpers
    async def _observe(self, phase: str, ctx: HookContext, *args: Any) -> None:
        for impl in self.hooks.at(phase):
            await self._guarded(impl, ctx, *args)

    async def _guarded(self, impl: Any, ctx: HookContext, *args: Any) -> Any:
        """Run an observer: a failure is logged with name and phase, and the turn goes on."""
        try:
            return await impl(ctx, *args)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception:
            log.exception("hook %s failed at %s; skipped", impl.name, impl.phase)
            return None

    async def _settle_interrupted(self) -> None:
        """After a cancel: keep what was shown, answer open tool calls: the history stays valid."""
        await self._keep_partial("interrupted by the user")
        fixed = close_dangling_tool_calls(
            list(self.session.messages), "Cancelled by the user before this tool finished."
        )
        extra = fixed[len(self.session.messages) :] if len(fixed) > len(self.session.messages) else []
        if extra and fixed[: len(self.session.messages)] == list(self.session.messages):
            await self.session.add(*extra)
