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
    after_agent                                   always: after an answer, an error or a cancel

A hook's action is checked by `crow.actions.refusal` against the loop's state then. A
failed model call ends the turn with a notice naming its cause: configuration, provider or
hook. Every ToolCallStart gets a ToolCallEnd, on cancel or failure too.

The loop knows nothing about ACP: it emits `crow.events` to a sink.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from crow import images, notices, steering
from crow.actions import (
    Action,
    ActionPicker,
    Compact,
    Continue,
    LoopState,
    Replace,
    Stop,
    TurnStopReason,
    refusal,
    stop_reason,
)
from crow.batch import run_batch, waits_for
from crow.context import HookContext
from crow.errors import (
    AuthError,
    AuthRequired,
    ConfigError,
    ContextLengthError,
    CrowError,
    HookBlocked,
    HookError,
    MissingKeyError,
    ProviderError,
    StreamCutError,
)
from crow.events import (
    Emit,
    TextDelta,
    ThoughtDelta,
    ToolCallEnd,
    ToolCallRunning,
    ToolCallStart,
    UsageUpdated,
)
from crow.hooks import HookRegistry, build_chain
from crow.llm.base import ModelRequest, ModelResponse, Provider, Retrying, ToolSpec, Usage
from crow.messages import Message, ToolCall, ToolResult, close_dangling_tool_calls, human, system
from crow.pricing import call_ref, record_usage
from crow.reasoning import request_effort
from crow.rewind import as_prompt
from crow.roots import editor_cwd
from crow.rules import FILE_TOOLS
from crow.session import new_message_id
from crow.tool_kinds import presented

if TYPE_CHECKING:
    from crow.session import Session

log = logging.getLogger("crow.loop")

CANCEL_GRACE = 5.0  # seconds a cancelled turn has to settle its history, then for after_agent
CANCELLED = "Cancelled by the user before this tool finished."
FAILED = "Not finished: the turn failed before this tool finished."


@dataclass
class TurnResult:
    stop_reason: TurnStopReason
    error: str | None = None  # a model failure the user was told about
    cause: str | None = None  # its kind (`crow.notices.cause_of`), for front ends to pass on


@dataclass
class LoopSettings:
    system_prompt: str = ""
    max_iterations: int = 25
    max_continues: int = 5
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
        self._message_id = ""  # the id its deltas carry: a new one per model call attempt
        self._open: dict[str, ToolCall] = {}  # calls announced (ToolCallStart) and not ended

    async def run(self, prompt: Message) -> TurnResult:
        hooks, session = self.hooks, self.session
        hooks.freeze()
        ctx = HookContext(
            session,
            prompt.content,
            self.provider,
            self.emit,
            settings=self.settings.hook_settings,
            compactor=self.compactor,
        )
        await session.add(as_prompt(prompt))  # marked: a rewind counts turns by their prompts
        ctx.prompt_id = session.messages[-1].id
        owns_steering = not steering.opened(session)  # else its prompt's: ended with it
        self._steering, ended = steering.begin(session), "it failed"
        cancelled = False
        try:
            await self._observe("before_agent", ctx)
            result = await self._react(ctx)
            ended = result.stop_reason
            return result
        except anyio.get_cancelled_exc_class():
            cancelled, ended = True, "cancelled"
            with anyio.move_on_after(CANCEL_GRACE, shield=True):
                await self._settle("interrupted by the user", CANCELLED)
            raise
        except Exception:
            try:
                await self._settle("interrupted: the turn failed", FAILED)
            except Exception:  # the original error is the one to report
                log.exception("could not settle the history of a failed turn")
            raise
        finally:
            # What it did not take is refused, never dropped (told when the prompt is over).
            (steering.end if owns_steering else steering.close)(session, ended)
            await self._after_agent(ctx, cancelled)

    async def _after_agent(self, ctx: HookContext, cancelled: bool) -> None:
        """after_agent runs however the turn ended; after a cancel, shielded and bounded."""
        if not cancelled:
            await self._observe("after_agent", ctx)
            return
        with anyio.move_on_after(CANCEL_GRACE, shield=True) as scope:
            await self._observe("after_agent", ctx)
        if scope.cancelled_caught:
            log.warning("after_agent hooks ran past %.1f s after a cancel; stopped", CANCEL_GRACE)

    # ------------------------------------------------------------ the loop
    async def _react(self, ctx: HookContext) -> TurnResult:
        continues = 0
        compacted_for_length = False
        can_compact = self.compactor is not None
        for iteration in range(self.settings.max_iterations):
            ctx.iteration = iteration
            await steering.deliver(self.session, self.emit)  # what the user added meanwhile
            if self.provider is None:
                await self.emit(notices.no_model(self.no_model_message))
                cause = notices.no_model_cause(self.no_model_message)
                return TurnResult("end_turn", self.no_model_message, cause)
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
            except (ProviderError, ConfigError, HookError) as exc:
                return await self._model_failed(ctx, exc)

            msg = self.session.unique_tool_ids(response.message)
            msg = msg.replace(id=self._message_id or msg.id)  # the id its streamed chunks carried
            if msg is not response.message:
                response = ModelResponse(msg, response.usage, response.stop_reason, response.model)
            ctx.response = response
            if msg.content or msg.tool_calls or msg.thinking:
                await self.session.add(msg)
            ctx.usage = ctx.usage + (response.usage or Usage())
            await record_usage(self.session, call_ref(self.provider, ctx.request), response.usage)
            used, cost = self.session.context_tokens(), self.session.cost
            await self.emit(UsageUpdated(used, ctx.context_window, cost))

            state = LoopState("after_model_call", pending=msg.tool_calls, can_compact=can_compact)
            action, by = await self._choose(state, ctx, response=response)
            if action is not None and (done := await self._apply(action, by)):
                return done

            if msg.tool_calls:
                await self._run_tools(ctx, msg.tool_calls)
                continue
            if response.stop_reason in ("max_tokens", "refusal"):
                return TurnResult(response.stop_reason)

            left = self.settings.max_continues - continues
            state = LoopState("agent_stop", continues_left=left, can_compact=can_compact)
            action, by = await self._choose(state, ctx)
            done = await self._apply(action, by) if action is not None else None
            if isinstance(action, Continue):
                continues += 1
                continue
            if done is None and not self._steering.finish():
                continue  # the user steered while the model answered: the turn goes on for it
            return done or TurnResult("end_turn")
        return TurnResult("max_turn_requests")

    async def _choose(self, state: LoopState, ctx: HookContext, **offered: Any) -> tuple[Action | None, str]:
        """Run the phase's hooks; the first action offered, if it can apply now (`refusal`:
        the one rule), and the hook that chose it."""
        picker = ActionPicker()
        for impl in self.hooks.at(state.phase):
            picker.offer(impl.name, await self._guarded(impl, ctx=ctx, **offered))
        action, by = picker.chosen, picker.chosen_by
        if action is not None and (why := refusal(action, state)) is not None:
            log.warning("hook %s: %s refused: %s", by, type(action).__name__, why)
            return None, by
        return action, by

    async def _apply(self, action: Action, by: str) -> TurnResult | None:
        """Do an accepted action; a TurnResult when it ends the turn."""
        if isinstance(action, Stop):
            # Tool calls the model asked for will not run: answer them so the history stays valid.
            await self._close_dangling(f"Not run: hook {by} stopped the turn.")
            return TurnResult(stop_reason(action, by))
        if isinstance(action, Compact):
            await self.compactor.compact(
                self.session, self.provider, instructions=action.instructions, emit=self.emit
            )
        elif isinstance(action, Replace):
            await self.session.set_messages(action.messages)
        elif isinstance(action, Continue):
            await self.session.add(*(m if isinstance(m, Message) else human(m) for m in action.messages))
        return None

    # ------------------------------------------------------------ model calls
    def build_request(self, ctx: HookContext) -> ModelRequest:
        hub = self.session.tools
        specs = hub.specs() if hub is not None else []
        self._tool_specs = {s.name: s for s in specs}
        prompt = "\n\n".join(p for p in (self.settings.system_prompt, *ctx.injected) if p)
        messages: list[Message] = [system(prompt)] if prompt else []
        messages.extend(self.session.messages)
        model = self.provider.model if self.provider else ""
        effort = request_effort(self.session, call_ref(self.provider, None))
        return ModelRequest(messages=messages, tools=specs, model=model, reasoning_effort=effort)

    async def _call_model(self, ctx: HookContext) -> ModelResponse:
        self._message_id = ""
        request = self.build_request(ctx)
        for impl in self.hooks.at("modify_request"):
            changed = await self._guarded(impl, ctx=ctx, request=request)
            if isinstance(changed, ModelRequest):
                request = changed
        # A hook's own exception becomes HookFailed (or HookBlocked); the provider's pass.
        chain = build_chain(
            self.hooks.at("wrap_model_call"), ctx, self._stream_model, passes=(ProviderError, ConfigError)
        )
        response = await chain(request)
        ctx.request = request
        self.session.last_request = request
        return response

    async def _stream_model(self, request: ModelRequest) -> ModelResponse:
        assert self.provider is not None
        if self._partial:
            # A wrap hook retries after the user already saw text: say so, never replay silently.
            await self.emit(notices.RETRY_DISCARDS_PARTIAL)
            self._partial = []
        self._message_id = message_id = new_message_id()  # a retry is a new message
        response: ModelResponse | None = None
        # Read the stream to its end even after the response: leaving early closes the
        # HTTP connection instead of returning it to the keep-alive pool.
        events = aiter(self.provider.stream(request))
        while True:
            try:
                event = await anext(events)
            except StopAsyncIteration:
                break
            except (ProviderError, ConfigError):
                raise
            except Exception as exc:  # not the sink's, not a hook's: the provider's own bug
                name = self.provider.name
                log.exception("provider %s failed unexpectedly", name)
                why = f"provider {name} failed unexpectedly (a bug in the provider): {exc!r}"
                raise ProviderError(why) from exc
            if isinstance(event, TextDelta):
                self._partial.append(event.text)
                await self.emit(TextDelta(event.text, message_id))
            elif isinstance(event, ThoughtDelta):
                await self.emit(ThoughtDelta(event.text, message_id))
            elif isinstance(event, Retrying):
                await self.emit(notices.retrying(event))
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
            await self.session.add(Message("assistant", f"{text}\n\n[{note}]", id=self._message_id))

    async def _model_failed(self, ctx: HookContext, exc: CrowError) -> TurnResult:
        """End the turn after a failed model call, telling the user what it was."""
        if isinstance(exc, StreamCutError) and exc.partial:
            await self._keep_partial("answer cut off: the connection to the model broke")
        self._partial = []
        await self._observe("on_error", ctx, error=exc)
        notice = notices.model_failed(exc)
        if isinstance(exc, ConfigError):  # the user's to fix: no traceback
            log.warning("cannot call the model: %s", exc)
        elif isinstance(exc, HookBlocked):  # a decision: the model reads it at its next call
            await self.session.add(Message("assistant", f"[{notice.text}]"))
        await self.emit(notice)
        if isinstance(exc, AuthError | MissingKeyError):  # the front end can have the user log in
            raise AuthRequired(exc)
        return TurnResult("end_turn", str(exc), notices.cause_of(exc))

    # ------------------------------------------------------------ tool calls
    async def _run_tools(self, ctx: HookContext, calls: Sequence[ToolCall]) -> None:
        for call in calls:
            self._open[call.id] = call
            await self.emit(ToolCallStart(call, self._tool_specs.get(call.name)))
        chain = build_chain(self.hooks.at("wrap_tool_call"), ctx, self._execute)
        budget = images.ReplyBudget()

        async def one(call: ToolCall) -> None:
            spec = self._tool_specs.get(call.name)
            try:
                result = await chain(call)
            except HookError as exc:  # a hook failed or blocked: this call's error, not the turn's
                result = ToolResult(call.id, call.name, error=str(exc))
            if not isinstance(result, ToolResult):
                result = ToolResult(call.id, call.name, error="a hook returned no tool result")
            result = presented(result.replace(tool_call_id=call.id, name=call.name), call, spec)
            result = budget.take(result)
            await self.session.add(result.to_message())
            await self.emit(ToolCallEnd(call, result))
            self._open.pop(call.id, None)

        # Effects in the order the model gave: a call waits for the earlier calls it
        # conflicts with (same path, or a command); the others run side by side.
        def read_only(name: str) -> bool:
            spec = self._tool_specs.get(name)
            return bool(spec and spec.read_only)

        # Another server's `path` argument need not be all its tool touches.
        paths_of = FILE_TOOLS.__contains__
        await run_batch(calls, waits_for(calls, read_only, editor_cwd(self.session), paths_of), one)

    async def _execute(self, call: ToolCall) -> ToolResult:
        # Past every wrap hook (a permission question among them): it really starts now.
        await self.emit(ToolCallRunning(self._open.get(call.id, call)))
        if call.parse_error:
            why = f"{call.parse_error}. Send the arguments again as one valid JSON object."
            return ToolResult(call.id, call.name, error=why)
        hub = self.session.tools
        if hub is None or not hub.has(call.name):
            known = ", ".join(sorted(self._tool_specs)) or "none"
            return ToolResult(
                call.id, call.name, error=f"unknown tool {call.name!r}; available tools: {known}"
            )
        try:
            return await hub.call(call)
        except Exception as exc:  # the hub maps tool errors to results: this is a bug in it
            log.exception("tool %s failed unexpectedly in the tool hub", call.name)
            return ToolResult(call.id, call.name, error=f"crow failed to run this tool: {exc!r}")

    # ------------------------------------------------------------ helpers
    async def _observe(self, phase: str, ctx: HookContext, **offered: Any) -> None:
        for impl in self.hooks.at(phase):
            await self._guarded(impl, ctx=ctx, **offered)

    async def _guarded(self, impl: Any, **offered: Any) -> Any:
        """Run an observer: a failure is logged with name and phase, and the turn goes on."""
        try:
            return await impl(**offered)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception:
            log.exception("hook %s failed at %s; skipped", impl.name, impl.phase)
            return None

    async def _close_dangling(self, note: str) -> None:
        """Answer the tool calls of the history that have no result (they will not run)."""
        n = len(self.session.messages)
        fixed = close_dangling_tool_calls(list(self.session.messages), note)
        if len(fixed) > n and fixed[:n] == list(self.session.messages):
            await self.session.add(*fixed[n:])

    async def _settle(self, partial_note: str, call_note: str) -> None:
        """After a cancel or a failure: keep what was shown, answer open tool calls, and
        give every call the client saw start a final status."""
        await self._keep_partial(partial_note)
        await self._close_dangling(call_note)
        for call in list(self._open.values()):
            await self.emit(ToolCallEnd(call, ToolResult(call.id, call.name, error=call_note)))
        self._open.clear()
