"""SubagentsHook: the `task(description, prompt, agent?)` tool, a child agent run to the end.

A `task` call runs a child session (`Agent.create_child`: the parent's folder, settings
and tool servers) through the same loop and hooks (`Agent.run_turn`), with its own context:
the agent definition's system prompt (plus what crow's hooks add to every session) and the
task's prompt, nothing of the parent's. Its events reach the parent's front end wrapped
(`SubagentStarted`, `SubagentEvent`, `SubagentFinished`); its questions go to the parent's
front end naming it (`child_client`). The child's final answer is the call's result, with
a footer (model calls, tokens, cost).

The tool's description lists the agent definitions of the session's folder
(`crow.find_agents`, read again at each request: stat-cached). An agent file may narrow a
child, never widen it:
- tools: the child's model is offered only its allow-list; a call to any other tool is
  refused before any hook (permissions included) sees it. No child gets `exit_plan_mode`
  (it cannot change the parent's mode), and `task` only below `max_depth`.
- mode: the stricter of the parent's and the definition's (plan counts as read_only).
- model: the definition's when it is the user's choice (a file in the user's agents
  folder, or a model the user's config names) and resolves, else the parent's, told once.

Settings (`hooks.settings.subagents`, the user's config): `max_depth` (1; at most 3),
`max_turns` (25 model calls per child), `max_concurrent` (4 running children per parent
session, at most 16; the rest wait for a slot, cancellably). A child's cost joins its
parent's stored total as it grows, and the parent's front end gets a `UsageUpdated`.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from crow import (
    AgentDefinition,
    Hook,
    HookContext,
    Message,
    ModelRequest,
    ModelResponse,
    Notice,
    ServerSpec,
    Session,
    SubagentEvent,
    SubagentFinished,
    SubagentStarted,
    ToolCall,
    ToolResult,
    UsageUpdated,
    child_client,
    find_agents,
    subagents,
)

log = logging.getLogger("crow.hooks.subagents")

TOOL = "task"
PLAN_TOOL = "exit_plan_mode"  # a child never leaves (or enters) the parent's mode
DEFAULT_AGENT = "general-purpose"
_CHILD = "subagents.child"  # session.state of a child: its ChildPolicy
_SLOTS = "subagents.slots"  # session.state of a parent: its running children's semaphore
_TOLD = "subagents.told"  # root session.state: the model notices already given
_SKIPPED = "subagents.skipped"  # root session.state: the agent files' problems already told
_logged: set[Any] = set()  # what was logged once per process


@dataclass
class ChildPolicy:
    """What a child session may do, and what its calls took (kept in its `state`)."""

    agent: str
    allowed: frozenset[str] | None  # tool names offered; None: all (but task/exit_plan_mode)
    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    counted_cost: float = 0.0  # how much of its cost the parent's total holds already


class SubagentsHook(Hook):
    name = "subagents"
    # Outside permissions (-90): a tool a child was not offered is refused before anyone
    # is asked about it. A task call itself still passes permissions (rules) and plan.
    order = -95

    def __init__(self, agent: Any, limits: subagents.Limits | None = None) -> None:
        self.agent = agent
        self.limits = limits or subagents.Limits()
        self._server: Any = None
        self._description = ""

    # ------------------------------------------------------------ the tool
    def tool_servers(self, session: Session) -> list[ServerSpec]:
        if self._server is None:
            self._server = self._build_server()
        return [ServerSpec("subagents", "inprocess", server=self._server)]

    def _build_server(self) -> Any:
        from mcp.server.mcpserver.exceptions import ToolError

        from crow import function_server

        async def task(description: str, prompt: str, agent: str = DEFAULT_AGENT) -> str:
            """Hand a self-contained piece of work to a subagent: a fresh agent with its own
            context that sees only `prompt` (say everything it needs: files, what to find or
            change, what to report back), works with the same tools, and returns its final
            answer as this tool's result. `description` is a short title (3-7 words) shown to
            the user. Several task calls in one reply run at the same time: use them for
            independent searches or changes."""
            wrong = subagents.bad_arguments(description, prompt)
            if wrong:
                raise ToolError(wrong)
            return "checked"

        self._description = inspect.cleandoc(task.__doc__ or "")
        shown = {TOOL: ("think", "{description}")}
        return function_server([(task, True)], "crow-subagents", shown)

    def agents(self, session: Session) -> dict[str, AgentDefinition]:
        """The agent definitions of the session's folder (the default among them)."""
        return self._scan(session)[0]

    def _scan(self, session: Session) -> tuple[dict[str, AgentDefinition], list[str]]:
        try:
            return find_agents(session.cwd, Path(self.agent.config.home))
        except Exception:  # a bug there: the call says so, the child's tool list holds
            log.exception("finding agent definitions under %s failed", session.cwd)
            return {}, []

    def tool_description(self, session: Session, found: dict[str, AgentDefinition] | None = None) -> str:
        listing = subagents.listing(list((found if found is not None else self.agents(session)).values()))
        return f"{self._description}\n\n`agent` names one of these (default {DEFAULT_AGENT}):\n{listing}"

    async def _tell_problems(self, ctx: HookContext, problems: list[str]) -> None:
        """Each agent file skipped, told once per session (as prompt files' problems are):
        its root's, as a child offered `task` (max_depth 2 on) reads the files again."""
        told: set[str] = ctx.session.root.state.setdefault(_SKIPPED, set())
        new = [p for p in problems if p not in told]
        if new:
            told.update(new)
            log.warning("agent definitions skipped: %s", "; ".join(new))
            await ctx.notify("\n".join(new), "warning", "Agent definitions skipped")

    # ------------------------------------------------------------ what a session is offered
    async def modify_request(self, ctx: HookContext, request: ModelRequest) -> ModelRequest | None:
        session = ctx.session
        policy: ChildPolicy | None = session.state.get(_CHILD)
        hub = session.tools
        tools = []
        for spec in request.tools:
            if not (hub is not None and hub.trusted(spec.name)) or spec.name not in (TOOL, PLAN_TOOL):
                if policy is None or policy.allowed is None or spec.name in policy.allowed:
                    tools.append(spec)
            elif spec.name == TOOL and self._offers_task(session):
                found, problems = self._scan(session)
                await self._tell_problems(ctx, problems)
                tools.append(dataclasses.replace(spec, description=self.tool_description(session, found)))
            elif spec.name == PLAN_TOOL and policy is None:
                tools.append(spec)
        return request.replace(tools=tools)

    def _offers_task(self, session: Session) -> bool:
        policy: ChildPolicy | None = session.state.get(_CHILD)
        if policy is not None and policy.allowed is not None and TOOL not in policy.allowed:
            return False
        return session.depth < self.limits.max_depth

    def _refusal(self, session: Session, call: ToolCall) -> str | None:
        """Why a call of `session` is not run: a tool it was not offered."""
        policy: ChildPolicy | None = session.state.get(_CHILD)
        hub = session.tools
        ours = hub is not None and hub.trusted(call.name)
        if ours and call.name == TOOL and not self._offers_task(session):
            return (
                f"{TOOL} is not available here: subagents at this depth cannot start "
                f"subagents (hooks.settings.subagents.max_depth is {self.limits.max_depth}). "
                "Do the work yourself."
            )
        if policy is None:
            return None
        if ours and call.name == PLAN_TOOL:
            return f"{PLAN_TOOL} is not available to a subagent: it cannot change the session's mode."
        if policy.allowed is not None and call.name not in policy.allowed:
            offered = ", ".join(sorted(policy.allowed)) or "none"
            return (
                f"{call.name} was not offered to this subagent (agent {policy.agent}); it was not "
                f"run. Its tools are: {offered}."
            )
        return None

    # ------------------------------------------------------------ calls
    async def wrap_tool_call(self, ctx: HookContext, call: ToolCall, call_next: Any) -> ToolResult:
        session = ctx.session
        refused = self._refusal(session, call)
        if refused is not None:
            return ToolResult(call.id, call.name, error=refused)
        hub = session.tools
        if call.name != TOOL or hub is None or not hub.trusted(call.name):
            return await call_next(call)
        checked: ToolResult = await call_next(call)  # the arguments, permission rules
        if checked.is_error:
            return checked
        agents = self.agents(session)
        name = str(call.args.get("agent") or DEFAULT_AGENT)
        definition = agents.get(name)
        if definition is None:
            known = ", ".join(sorted(agents)) or "none (finding them failed; see crow's log)"
            return ToolResult(call.id, call.name, error=f"unknown agent {name!r}; the agents are: {known}")
        slots: anyio.Semaphore = session.state.setdefault(_SLOTS, anyio.Semaphore(self.limits.max_concurrent))
        async with slots:  # cancellable while it waits: nothing has started yet
            return await self._run_child(ctx, call, definition)

    async def _run_child(self, ctx: HookContext, call: ToolCall, definition: AgentDefinition) -> ToolResult:
        parent = ctx.session
        description = subagents.cut(str(call.args["description"]), subagents.MAX_DESCRIPTION)
        model = await self._child_model(ctx, definition)
        base = parent.config or self.agent.config
        config = base.model_copy(
            update={
                "system_prompt": definition.prompt or base.system_prompt,
                "max_iterations": self.limits.max_turns,
            }
        )
        mode = subagents.child_mode(parent.mode, definition.mode)
        try:
            child = await self.agent.create_child(
                parent, config=config, mode=mode, model=model, title=description, agent=definition.name
            )
        except Exception as exc:  # the store: the call's failure, not the parent's turn
            log.warning("could not start subagent %s: %s", definition.name, exc, exc_info=True)
            return ToolResult(call.id, call.name, error=f"The subagent could not start: {_failure(exc)}")
        child.client = child_client(
            parent.client, session_id=child.id, name=definition.name, parent_call_id=call.id
        )
        policy = ChildPolicy(definition.name, self._allowed(child, definition))
        child.state[_CHILD] = policy
        dirs = tuple(child.additional_directories)
        # its id given now, kept when stored: an editor shows it live under the id a replay uses
        prompt = Message("user", str(call.args["prompt"]), id=str(uuid.uuid4()))
        where = str(child.cwd)
        await ctx.send(SubagentStarted(call.id, child.id, definition.name, description, where, dirs, prompt))

        async def forward(event: Any) -> None:
            await ctx.send(SubagentEvent(call.id, child.id, event))
            await self._fold_cost(ctx, child, policy)

        def finished(stop_reason: str, error: str | None = None) -> SubagentFinished:
            turns, tokens_in, tokens_out = policy.turns, policy.input_tokens, policy.output_tokens
            return SubagentFinished(
                call.id, child.id, stop_reason, turns, tokens_in, tokens_out, child.cost, error
            )

        try:
            result = await self.agent.run_turn(child, prompt, forward)
        except anyio.get_cancelled_exc_class():
            await self._finish(ctx, child, policy, finished("cancelled"))
            raise
        except Exception as exc:  # the child's failure is the call's, never the parent's turn
            why = _failure(exc)
            log.warning("subagent %s (session %s) failed: %s", definition.name, child.id, why, exc_info=True)
            await self._finish(ctx, child, policy, finished("failed", why))
            return _result(call, child, policy, error=f"The subagent failed: {why}")
        if result.error:
            await self._finish(ctx, child, policy, finished("failed", result.error))
            return _result(call, child, policy, error=f"The subagent's model call failed: {result.error}")
        await self._finish(ctx, child, policy, finished(result.stop_reason))
        answer = _answer(child) or "(The subagent gave no answer.)"
        if result.stop_reason == "max_turn_requests":
            limit = self.limits.max_turns
            answer += f"\n\n[The subagent stopped at its limit of {limit} model calls; this is what it had.]"
        elif result.stop_reason != "end_turn":
            answer += f"\n\n[The subagent stopped: {result.stop_reason}.]"
        return _result(call, child, policy, output=answer)

    async def _finish(
        self, ctx: HookContext, child: Session, policy: ChildPolicy, done: SubagentFinished
    ) -> None:
        """The child is over: its cost joins the parent's and the front end hears how it
        ended, shielded: a cancel landing now (in the child's last, shielded store write,
        say) must not leave the child shown as running after its task call ends."""
        with anyio.CancelScope(shield=True):
            await self._fold_cost(ctx, child, policy)
            await ctx.send(done)

    async def after_model_call(self, ctx: HookContext, response: ModelResponse) -> None:
        policy: ChildPolicy | None = ctx.session.state.get(_CHILD)
        if policy is None:
            return
        policy.turns += 1
        usage = response.usage
        if usage is not None:
            policy.input_tokens += usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
            policy.output_tokens += usage.output_tokens

    # ------------------------------------------------------------ the child's settings
    def _allowed(self, child: Session, definition: AgentDefinition) -> frozenset[str] | None:
        if definition.tools is None:
            return None
        hub = child.tools
        known = {s.name for s in hub.specs()} if hub is not None else set()
        unknown = [n for n in definition.tools if n not in known]
        if unknown:
            key = ("unknown", definition.path, tuple(unknown))
            if key not in _logged:
                _logged.add(key)
                log.warning(
                    "agent %s (%s): no such tools, ignored: %s",
                    definition.name,
                    definition.path,
                    ", ".join(unknown),
                )
        return frozenset(n for n in definition.tools if n in known)

    async def _child_model(self, ctx: HookContext, definition: AgentDefinition) -> str | None:
        """The definition's model when it is the user's choice and resolves, else None (the
        parent's), the user told once why."""
        ref = (definition.model or "").strip()
        parent = ctx.session
        current = self.agent.model_ref(parent)
        if not ref or ref == "inherit" or ref == current:
            return None
        why = subagents.foreign_model(ref, definition.scope, self.agent.config)
        if why is None:
            try:
                self.agent.provider_for(ref, parent.config)
            except Exception as exc:  # ConfigError: an unknown provider, a bad ref
                why = f"it cannot be used: {exc}"
        if why is None:
            return ref
        told: set[tuple[str, str]] = parent.root.state.setdefault(_TOLD, set())
        if (definition.name, ref) not in told:
            told.add((definition.name, ref))
            runs_on = current or "the session's model"
            text = f"Agent {definition.name} asks for model {ref}, but {why}. It runs on {runs_on}."
            await ctx.send(Notice(text, "warning", f"Agent {definition.name}: model not used"))
        return None

    async def _fold_cost(self, ctx: HookContext, child: Session, policy: ChildPolicy) -> None:
        """The parent's stored cost grows as the child's does (unknown if either is); its
        front end gets the parent's usage then."""
        parent = ctx.session
        if child.cost is not None and child.cost == policy.counted_cost:
            return
        if child.cost is None:
            if parent.cost is None:
                return
            cost = None
        else:
            grown, policy.counted_cost = child.cost - policy.counted_cost, child.cost
            cost = None if parent.cost is None else parent.cost + grown
        try:
            await parent.save(cost=cost)
        except Exception as exc:  # display-only: the next change stores the total
            log.warning("the cost of session %s was not stored: %s", parent.id, exc)
        await ctx.send(UsageUpdated(parent.context_tokens(), ctx.context_window, parent.cost))


def _answer(child: Session) -> str:
    return next((m.content for m in reversed(child.messages) if m.role == "assistant" and m.content), "")


def _failure(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) < 2000 else text[:2000] + "…"


def _result(
    call: ToolCall, child: Session, policy: ChildPolicy, *, output: str = "", error: str = ""
) -> ToolResult:
    footer = subagents.footer(
        policy.agent, policy.turns, policy.input_tokens, policy.output_tokens, child.cost
    )
    meta = {"crow/subagent": {"session_id": child.id, "agent": policy.agent}}
    if error:
        return ToolResult(call.id, call.name, error=f"{error}\n\n{footer}", meta=meta)
    return ToolResult(call.id, call.name, output=f"{output}\n\n{footer}", meta=meta)


def factory(agent: Any) -> SubagentsHook:
    settings = agent.config.hooks.settings.get("subagents", {})
    return SubagentsHook(agent, subagents.Limits.from_settings(settings))
