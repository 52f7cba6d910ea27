"""Hooks: the middleware crow is extended with.

Eight phases (seed names accepted as aliases):

    before_agent      once per prompt, before the loop       (ctx)                     -> None
    modify_request    before each model call                 (ctx, request)            -> ModelRequest | None
    wrap_model_call   around each model call, onion          (ctx, request, call_next) -> ModelResponse
    after_model_call  after each model response              (ctx, response)           -> Action | None
    wrap_tool_call    around each tool execution, onion      (ctx, call, call_next)    -> ToolResult
    agent_stop        the model answered without tool calls  (ctx)                     -> Action | None
    after_agent       after the prompt's turn is over        (ctx)                     -> None
    on_error          a model call failed                    (ctx, error)              -> None

A hook is a `Hook` subclass overriding only the phases it needs, or a plain async function
registered at a phase; a function may accept fewer arguments than the phase offers (just
`ctx`, say). Every phase keeps its hooks in one order, the stack's: crow's builtins first,
then everyone else's, each band by `order` then name (`crow.plugins` says where hooks come
from); for the onions the first is the outermost layer. Registration validates before it
changes anything, and fails with the hook's name.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, overload

from crow.errors import HookError
from crow.llm.base import ModelRequest, ModelResponse
from crow.messages import Message, ToolCall, ToolResult

if TYPE_CHECKING:
    from crow.context import HookContext
    from crow.session import Session
    from crow.tools import ServerSpec

log = logging.getLogger("crow.hooks")

PHASES: tuple[str, ...] = (
    "before_agent",
    "modify_request",
    "wrap_model_call",
    "after_model_call",
    "wrap_tool_call",
    "agent_stop",
    "after_agent",
    "on_error",
)
# Phase arguments after ctx, used to call functions that accept fewer.
_PHASE_ARGS = {
    "before_agent": 0,
    "modify_request": 1,
    "wrap_model_call": 2,
    "after_model_call": 1,
    "wrap_tool_call": 2,
    "agent_stop": 0,
    "after_agent": 0,
    "on_error": 1,
}
ALIASES: dict[str, str] = {
    "pre_request": "before_agent",
    "BeforeAgent": "before_agent",
    "ModifyRequest": "modify_request",
    "BeforeLLMCall": "modify_request",
    "before_llm_call": "modify_request",
    "WrapModelCall": "wrap_model_call",
    "mid_react": "after_model_call",
    "AfterLLMCall": "after_model_call",
    "after_llm_call": "after_model_call",
    "WrapToolCall": "wrap_tool_call",
    "post_react_loop": "agent_stop",
    "post_request": "after_agent",
    "OnError": "on_error",
}
# Seed phases that observe one side of a tool call; adapted onto wrap_tool_call.
TOOL_SIDES: dict[str, str] = {
    "BeforeToolExec": "before",
    "before_tool_exec": "before",
    "AfterToolExec": "after",
    "after_tool_exec": "after",
}


def canonical_phase(name: str) -> str:
    phase = ALIASES.get(name, name)
    if phase not in PHASES and name not in TOOL_SIDES:
        known = ", ".join([*PHASES, *ALIASES, *TOOL_SIDES])
        raise HookError(f"unknown hook phase {name!r}; known phases: {known}")
    return phase


# ---------------------------------------------------------------- actions
@dataclass(frozen=True, slots=True)
class Continue:
    """Run the loop again with these user messages appended (a "Ralph loop")."""

    messages: Sequence[Message | str]


@dataclass(frozen=True, slots=True)
class Compact:
    instructions: str | None = None


@dataclass(frozen=True, slots=True)
class Replace:
    """Replace the conversation (validated before it is applied)."""

    messages: Sequence[Message]


@dataclass(frozen=True, slots=True)
class Stop:
    reason: str = "end_turn"


Action = Continue | Compact | Replace | Stop

CallModel = Callable[[ModelRequest], Awaitable[ModelResponse]]
CallTool = Callable[[ToolCall], Awaitable[ToolResult]]


# ---------------------------------------------------------------- the base class
class Hook:
    """Override only the phases you need; the others are never called."""

    name: str = ""
    order: int = 0  # within its band: lower runs first / wraps outermost; ties go by name

    async def before_agent(self, ctx: HookContext) -> None: ...

    async def modify_request(self, ctx: HookContext, request: ModelRequest) -> ModelRequest | None: ...

    async def wrap_model_call(
        self, ctx: HookContext, request: ModelRequest, call_next: CallModel
    ) -> ModelResponse: ...

    async def after_model_call(self, ctx: HookContext, response: ModelResponse) -> Action | None: ...

    async def wrap_tool_call(self, ctx: HookContext, call: ToolCall, call_next: CallTool) -> ToolResult: ...

    async def agent_stop(self, ctx: HookContext) -> Action | None: ...

    async def after_agent(self, ctx: HookContext) -> None: ...

    async def on_error(self, ctx: HookContext, error: Exception) -> None: ...

    def tool_servers(self, session: Session) -> Sequence[ServerSpec]:
        """MCP servers this hook offers the session's model, connected with the session's
        tools (after the front end's); none by default."""
        return ()

    def phases(self) -> list[str]:
        """The phases this hook's class overrides."""
        return [p for p in PHASES if getattr(type(self), p) is not getattr(Hook, p)]

    @property
    def hook_name(self) -> str:
        return self.name or type(self).__name__


# The stack's bands, outermost first: crow's own hooks, then everyone else's.
BUILTIN_BAND = 0
USER_BAND = 1


@dataclass(slots=True)
class _Impl:
    """One registered callable at one phase."""

    name: str
    phase: str
    fn: Callable[..., Awaitable[Any]]
    order: int
    band: int
    nargs: int  # how many phase arguments after ctx it accepts

    @property
    def key(self) -> tuple[int, int, str]:
        return (self.band, self.order, self.name)

    async def __call__(self, ctx: HookContext, *args: Any) -> Any:
        return await self.fn(ctx, *args[: self.nargs])


def _positional_count(fn: Callable[..., Any]) -> int:
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 99
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _where(fn: Callable[..., Any]) -> str:
    try:
        return f"{inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]}"
    except (OSError, TypeError):
        return repr(fn)


def _check(name: str, phase: str, fn: Callable[..., Any]) -> int:
    if not inspect.iscoroutinefunction(fn):
        raise HookError(f"hook {name!r} at {phase}: {fn!r} must be an async function ({_where(fn)})")
    n = _positional_count(fn) - 1  # minus ctx
    if n < 0:
        raise HookError(f"hook {name!r} at {phase}: {fn.__qualname__} must accept ctx ({_where(fn)})")
    if phase.startswith("wrap_") and n < 2:
        raise HookError(
            f"hook {name!r} at {phase}: {fn.__qualname__}{inspect.signature(fn)} "
            f"must accept call_next ({_where(fn)})"
        )
    return min(n, _PHASE_ARGS[phase])


def _tool_side_adapter(side: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    """BeforeToolExec(ctx, call) may return a ToolCall (changed) or ToolResult (blocked);
    AfterToolExec(ctx, call, result) may return a ToolResult that replaces the result."""
    nargs = _positional_count(fn)

    async def wrap(ctx: HookContext, call: ToolCall, call_next: CallTool) -> ToolResult:
        if side == "before":
            out = await fn(*(ctx, call)[:nargs])
            if isinstance(out, ToolResult):
                return out
            return await call_next(out if isinstance(out, ToolCall) else call)
        result = await call_next(call)
        out = await fn(*(ctx, call, result)[:nargs])
        return out if isinstance(out, ToolResult) else result

    wrap.__qualname__ = getattr(fn, "__qualname__", "tool_side")
    return wrap


class HookRegistry:
    """The hook stack. Each phase's hooks are kept in one order, whatever the order they
    were registered in: band (crow's builtins, then everyone else's), then `order`, then
    name. Frozen at the first turn; registering after that raises."""

    def __init__(self) -> None:
        self._impls: dict[str, list[_Impl]] = {p: [] for p in PHASES}
        self._names: set[str] = set()
        self._hooks: list[tuple[tuple[int, int, str], Hook]] = []
        self._frozen = False

    @overload
    def register(
        self, hook: Hook, /, *, name: str | None = None, order: int | None = None, builtin: bool = False
    ) -> Hook: ...

    @overload
    def register(
        self,
        phase: str,
        fn: Callable[..., Awaitable[Any]],
        /,
        *,
        name: str | None = None,
        order: int | None = None,
        builtin: bool = False,
    ) -> Callable[..., Awaitable[Any]]: ...

    def register(
        self,
        target: Hook | str,
        fn: Callable[..., Awaitable[Any]] | None = None,
        /,
        *,
        name: str | None = None,
        order: int | None = None,
        builtin: bool = False,
    ) -> Any:
        """`register(hook)`: a Hook object, at every phase its class overrides.
        `register(phase, fn)`: an async function at one phase (or alias).
        `order` defaults to the hook's own `order` (0 for functions); `builtin` is set by
        crow's discovery for crow's own hooks, which wrap everyone else's."""
        band = BUILTIN_BAND if builtin else USER_BAND
        if isinstance(target, Hook):
            if fn is not None:
                raise HookError(f"register({target!r}, ...): a Hook is registered alone, without a function")
            hook_name = name or target.hook_name
            phases = target.phases()
            if not phases:
                raise HookError(f"hook {hook_name!r} ({type(target).__qualname__}) overrides no phase")
            rank = target.order if order is None else order
            self._commit(hook_name, [(p, getattr(target, p)) for p in phases], rank, band)
            self._hooks.append(((band, rank, hook_name), target))
            self._hooks.sort(key=lambda entry: entry[0])
            return target
        if not isinstance(target, str) or fn is None:
            raise HookError(f"register expects a Hook, or a phase name and an async function; got {target!r}")
        hook_name = name or getattr(fn, "__qualname__", repr(fn))
        if target in TOOL_SIDES:
            if not inspect.iscoroutinefunction(fn):
                raise HookError(f"hook {hook_name!r} at {target}: must be an async function ({_where(fn)})")
            impl = ("wrap_tool_call", _tool_side_adapter(TOOL_SIDES[target], fn))
        else:
            impl = (canonical_phase(target), fn)
        self._commit(hook_name, [impl], order or 0, band)
        return fn

    def _commit(
        self, name: str, impls: list[tuple[str, Callable[..., Any]]], order: int, band: int
    ) -> None:
        if self._frozen:
            raise HookError(f"cannot register hook {name!r}: hooks are frozen once a turn ran")
        if name in self._names:
            raise HookError(f"a hook named {name!r} is already registered")
        checked = [(phase, fn, _check(name, phase, fn)) for phase, fn in impls]  # validate all first
        for phase, fn, nargs in checked:
            self._impls[phase].append(_Impl(name, phase, fn, order, band, nargs))
            self._impls[phase].sort(key=lambda i: i.key)
        self._names.add(name)

    def freeze(self) -> None:
        self._frozen = True

    def at(self, phase: str) -> list[_Impl]:
        return self._impls[canonical_phase(phase)]

    @property
    def hooks(self) -> list[Hook]:
        """The Hook objects, in the stack's order."""
        return [hook for _, hook in self._hooks]

    def names(self, phase: str | None = None) -> list[str]:
        if phase is None:
            return sorted(self._names)
        return [i.name for i in self.at(phase)]

    def __contains__(self, name: object) -> bool:
        return name in self._names


_R = TypeVar("_R")


def build_chain(
    impls: Sequence[_Impl], ctx: HookContext, inner: Callable[[Any], Awaitable[_R]]
) -> Callable[[Any], Awaitable[_R]]:
    """Fold wrap hooks around `inner`: impls[0] ends up outermost."""
    handler = inner
    for impl in reversed(impls):
        handler = _layer(impl, ctx, handler)
    return handler


def _layer(
    impl: _Impl, ctx: HookContext, call_next: Callable[[Any], Awaitable[_R]]
) -> Callable[[Any], Awaitable[_R]]:
    async def layer(arg: Any) -> _R:
        return await impl(ctx, arg, call_next)

    return layer


@dataclass(slots=True)
class ActionPicker:
    """First action wins; later ones are logged as conflicts."""

    chosen: Action | None = None
    chosen_by: str = ""
    ignored: list[tuple[str, Action]] = field(default_factory=list)

    def offer(self, by: str, action: object) -> None:
        if action is None:
            return
        if not isinstance(action, Continue | Compact | Replace | Stop):
            log.warning("hook %s returned %r, which is not an action; ignored", by, action)
            return
        if self.chosen is None:
            self.chosen, self.chosen_by = action, by
        else:
            self.ignored.append((by, action))
            log.warning(
                "hook %s asked for %s but %s already chose %s; ignored",
                by,
                type(action).__name__,
                self.chosen_by,
                type(self.chosen).__name__,
            )
