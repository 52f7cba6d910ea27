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
registered at a phase. Hooks are called by parameter NAME: a function takes any of the
names its phase offers, in any order (`(response)`, `(ctx, response)`, `(*, response)`);
a parameter the phase does not offer (and that has no default) fails at registration.
Every phase keeps its hooks in one order, the stack's: crow's builtins first, then
everyone else's, each band by `order` then name (`crow.plugins` says where hooks come
from); for the onions the first is the outermost layer. Registration validates before it
changes anything, and fails with the hook's name.

Seed 003's per-call phases are adapted onto the onions (`SEED_PHASES`). `BeforeLLMCall`
(ctx, request) and `BeforeToolExec` (ctx, call) block: one that raises stops that call
(`HookBlocked`); `AfterToolExec` (ctx, call, result) observes. Every other phase outside
the onions observes too: a failure is logged and skipped. A wrap hook's own exception
becomes that step's error, named after the hook (`HookFailed`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, overload

# The actions are part of the hook API: importable from here as from crow.actions.
from crow.actions import Action, ActionPicker, Compact, Continue, Replace, Stop  # noqa: F401
from crow.errors import HookBlocked, HookError, HookFailed
from crow.llm.base import ModelRequest, ModelResponse
from crow.messages import ToolCall, ToolResult

# The phases are part of the hook API: importable from here as from crow.phases.
from crow.phases import (  # noqa: F401
    ALIASES,
    PHASE_ARGS,
    PHASES,
    SEED_PHASES,
    TOOL_SIDES,
    canonical_phase,
)

if TYPE_CHECKING:
    from crow.commands import PromptCommand
    from crow.context import HookContext
    from crow.session import Session
    from crow.tools import ServerSpec

log = logging.getLogger("crow.hooks")

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

    def commands(self, session: Session) -> Sequence[PromptCommand]:
        """Slash commands this hook offers the session (`crow.PromptCommand`), each a prompt
        when typed; none by default. Called in a worker thread (it may read files) when the
        session's tools are ready and before each prompt: a change is advertised."""
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
    """One registered callable at one phase, with how to call it."""

    name: str
    phase: str
    fn: Callable[..., Awaitable[Any]]
    order: int
    band: int
    call: _Call

    @property
    def key(self) -> tuple[int, int, str]:
        return (self.band, self.order, self.name)

    def __call__(self, **offered: Any) -> Awaitable[Any]:
        """The hook's coroutine (a plain call: one coroutine per hook call, not two)."""
        return self.call(self.fn, offered)


class _Call:
    """Calls a function with the values of the phase its parameters name: positional-only
    parameters by position, the others by keyword, `**kwargs` with the rest."""

    __slots__ = ("keywords", "positional", "rest")

    def __init__(self, positional: list[str], keywords: list[str], rest: bool) -> None:
        self.positional, self.keywords, self.rest = positional, keywords, rest

    def __call__(self, fn: Callable[..., Awaitable[Any]], offered: dict[str, Any]) -> Awaitable[Any]:
        named = self.keywords if not self.rest else [k for k in offered if k not in self.positional]
        return fn(*(offered[k] for k in self.positional), **{k: offered[k] for k in named})


def _where(fn: Callable[..., Any]) -> str:
    try:
        return f"{inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]}"
    except (OSError, TypeError):
        return repr(fn)


def _is_async(fn: Callable[..., Any]) -> bool:
    """An async function, or an object whose `__call__` is one (seed 004's hook shape)."""
    if inspect.iscoroutinefunction(fn):
        return True
    return not inspect.isclass(fn) and inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004


def _plan(name: str, phase: str, fn: Callable[..., Any], offers: tuple[str, ...]) -> _Call:
    """How to call `fn` at `phase`, which offers `offers` by name; a HookError naming the
    hook when it cannot be called so."""
    if not _is_async(fn):
        raise HookError(f"hook {name!r} at {phase}: {fn!r} must be an async function ({_where(fn)})")
    sig = inspect.signature(fn)
    shown = f"{getattr(fn, '__qualname__', fn)!s}{sig.replace(return_annotation=sig.empty)}"

    def bad(why: str) -> HookError:
        return HookError(f"hook {name!r} at {phase}: {shown} {why} ({_where(fn)})")

    positional: list[str] = []
    keywords: list[str] = []
    rest = gap = False
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            rest = True
        elif p.kind is p.VAR_POSITIONAL:
            continue
        elif p.name not in offers:
            if p.default is p.empty:
                offered = ", ".join(offers)
                raise bad(f"has a parameter {p.name!r} this phase does not offer; it offers ({offered})")
            gap = True
        elif p.kind is p.POSITIONAL_ONLY:
            if gap:
                raise bad(f"cannot receive {p.name!r}: it is positional-only after a parameter it skips")
            positional.append(p.name)
        else:
            keywords.append(p.name)
    if "call_next" in offers and "call_next" not in positional + keywords and not rest:
        raise bad("must accept call_next")
    return _Call(positional, keywords, rest)


def _check(name: str, phase: str, fn: Callable[..., Any]) -> _Call:
    return _plan(name, phase, fn, PHASE_ARGS[phase])


def _seed_adapter(name: str, seed_phase: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    """A seed-003 per-call hook as a layer of its onion. BeforeLLMCall may return a changed
    ModelRequest, BeforeToolExec a changed ToolCall or a ToolResult (the tool is then not
    run); either raising blocks that call. AfterToolExec may return a ToolResult that
    replaces the result; raising is logged and the result kept (the tool did run)."""
    onion, offers = SEED_PHASES[seed_phase]
    plan = _plan(name, seed_phase, fn, offers)
    key = PHASE_ARGS[onion][1]  # "request" or "call"

    async def before(ctx: HookContext, call_next: Callable[[Any], Awaitable[Any]], **what: Any) -> Any:
        arg = what[key]
        try:
            out = await plan(fn, {"ctx": ctx, key: arg})
        except Exception as exc:
            log.info("hook %s (%s) blocked the call: %s", name, seed_phase, exc)
            raise HookBlocked(name, seed_phase, exc) from exc
        if isinstance(out, ToolResult) and onion == "wrap_tool_call":
            return out
        return await call_next(out if isinstance(out, type(arg)) else arg)

    async def after(ctx: HookContext, call: ToolCall, call_next: CallTool) -> ToolResult:
        result = await call_next(call)
        try:
            out = await plan(fn, {"ctx": ctx, "call": call, "result": result})
        except Exception:
            log.exception("hook %s failed at %s; skipped", name, seed_phase)
            return result
        return out if isinstance(out, ToolResult) else result

    layer = after if offers[-1] == "result" else before
    layer.__qualname__ = getattr(fn, "__qualname__", seed_phase)
    return layer


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
            for alias in (*ALIASES, *SEED_PHASES):  # names for functions; a class's would never run
                if callable(getattr(type(target), alias, None)):
                    raise HookError(
                        f"hook {hook_name!r} defines {alias}, which a Hook class never runs: "
                        f"name the method {canonical_phase(alias)}"
                    )
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
        if target in SEED_PHASES:
            impl = (canonical_phase(target), _seed_adapter(hook_name, target, fn))
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
        if type(order) is not int:  # it is sorted on: a str or None would fail half-way in
            raise HookError(f"hook {name!r}: order must be an int, got {order!r}")
        checked = [(phase, fn, _check(name, phase, fn)) for phase, fn in impls]  # validate all first
        for phase, fn, call in checked:
            self._impls[phase].append(_Impl(name, phase, fn, order, band, call))
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
_RETURNS: dict[str, type] = {"wrap_model_call": ModelResponse, "wrap_tool_call": ToolResult}


def build_chain(
    impls: Sequence[_Impl],
    ctx: HookContext,
    inner: Callable[[Any], Awaitable[_R]],
    passes: tuple[type[Exception], ...] = (),
) -> Callable[[Any], Awaitable[_R]]:
    """Fold wrap hooks around `inner`: impls[0] ends up outermost.

    An exception a hook raises itself becomes `HookFailed` naming it (logged with its
    traceback). What `inner` raised (the provider, the front end's sink), a `passes` type
    and a `HookError` from an inner layer pass through unchanged, so every failure keeps
    its first owner's name."""
    raised: list[Exception] = []  # by identity: exceptions take no weak references

    async def innermost(arg: Any) -> _R:
        try:
            return await inner(arg)
        except Exception as exc:
            raised.append(exc)
            raise

    handler: Callable[[Any], Awaitable[_R]] = innermost
    for impl in reversed(impls):
        handler = _layer(impl, ctx, handler, (HookError, *passes), raised)
    return handler if impls else inner


def _layer(
    impl: _Impl,
    ctx: HookContext,
    call_next: Callable[[Any], Awaitable[_R]],
    passes: tuple[type[Exception], ...],
    inner_raised: list[Exception],
) -> Callable[[Any], Awaitable[_R]]:
    key = PHASE_ARGS[impl.phase][1]  # "request" or "call"
    returns = _RETURNS[impl.phase]

    async def layer(arg: Any) -> _R:
        try:
            out = await impl(ctx=ctx, call_next=call_next, **{key: arg})
            if not isinstance(out, returns):  # caught here, not as an AttributeError far away
                raise TypeError(f"returned {out!r:.200}, not a {returns.__name__}")
            return out  # type: ignore[no-any-return]
        except passes:
            raise
        except Exception as exc:
            if any(exc is e for e in inner_raised):
                raise
            log.exception("hook %s failed at %s", impl.name, impl.phase)
            raise HookFailed(impl.name, impl.phase, exc) from exc

    return layer
