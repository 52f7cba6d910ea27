"""PlanHook: plan mode's way out, the `exit_plan_mode(plan)` tool.

In mode `plan` the permissions hook lets read-only tools run and refuses the rest without
a prompt. The model ends planning by calling `exit_plan_mode` with its plan (markdown); the
user sees the plan as a question through the session's client:

    Yes, and auto-accept edits   -> mode accept_edits
    Yes, and ask before edits    -> mode ask
    No, keep planning            -> mode stays plan; the model reads the answer

On approval the mode is saved, a `ModeChanged` event tells the front end, and the turn goes
on: the tool result tells the model the new mode. The approved plan stays in the transcript
(the call's arguments, and `meta["crow/plan"]` of its result) and in
`session.state["plan"]` as `{"plan": str, "mode": str}`.

The tool is offered in every mode and refuses outside plan mode: offering it only in plan
mode would change the tool list, which heads every request, and lose the provider's whole
prompt cache (tools included) at each switch. The model learns it is in plan mode from a
note at the end of the system prompt while the mode is on. That costs one uncached request
when the mode changes, and none while it holds; a note after the last message instead
would move Anthropic's conversation cache breakpoint onto text the next request lacks,
losing the conversation cache on every request in plan mode.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio

from crow import (
    EditorClient,
    Hook,
    HookContext,
    Message,
    ModeChanged,
    ModelRequest,
    ModelResponse,
    ServerSpec,
    Session,
    ToolCall,
    ToolResult,
)

log = logging.getLogger("crow.hooks.plan")

TOOL = "exit_plan_mode"
SUBAGENT_TOOL = "task"  # crow's subagents (builtin_hooks/subagents.py)
MAX_PLAN = 100_000  # characters; a plan is something a person reads
# (option_id, label, ACP permission kind); an approving option's id is the mode it picks.
OPTIONS = (
    ("accept_edits", "Yes, and auto-accept edits", "allow_always"),
    ("ask", "Yes, and ask before edits", "allow_once"),
    ("keep_planning", "No, keep planning", "reject_once"),
)
_LABELS = {option_id: label for option_id, label, _ in OPTIONS}
_MODE_MEANS = {
    "accept_edits": "file edits run without asking; commands still ask the user",
    "ask": "edits and commands ask the user first",
}
PLAN_NOTE = (
    "## Plan mode\n"
    "The session is in plan mode: the user wants a plan before any change. Read, search and "
    "ask questions; do not edit files or run commands (they are refused). When the plan is "
    f"ready, call {TOOL} with it (markdown) to ask the user to approve it."
)
_BATCH = "plan.batch"  # ctx.turn_state: ids of the calls sent in the same reply as exit_plan_mode
_LOCK = "plan.lock"  # ctx.turn_state: one plan question at a time
_STATE = "plan"  # session.state: the approved plan


def approved_plan(messages: list[Message]) -> dict[str, str] | None:
    """The latest approved plan in `messages` (a transcript or context): {"plan", "mode"}."""
    for message in reversed(messages):
        # by name: another server's tool could put "crow/plan" in its own result's _meta
        found = (
            (message.meta or {}).get("crow/plan") if (message.role, message.name) == ("tool", TOOL) else None
        )
        if isinstance(found, dict) and isinstance(found.get("plan"), str):
            return {"plan": found["plan"], "mode": str(found.get("mode", ""))}
    return None


class PlanHook(Hook):
    name = "plan"
    order = -80  # exit_plan_mode; refuses calls sent beside it

    def __init__(self, timeout: float = 600.0) -> None:
        self.timeout = timeout

    def tool_servers(self, session: Session) -> list[ServerSpec]:
        from mcp.server.mcpserver.exceptions import ToolError

        from crow import function_server

        async def exit_plan_mode(plan: str) -> str:
            """Plan mode only: present your plan (markdown: the steps, the files to change,
            how to check the result) to the user for approval. If they approve, the session
            leaves plan mode and you go on implementing it; if not, keep planning."""
            if not plan.strip():
                raise ToolError("the plan is empty: write the plan itself in `plan`")
            if len(plan) > MAX_PLAN:
                raise ToolError(f"the plan is {len(plan):,} characters; keep it under {MAX_PLAN:,}")
            return "Plan submitted for approval."

        # Read-only: the tool itself changes nothing; the mode changes only when the user
        # approves, and that is this hook's doing (below).
        shown = {"exit_plan_mode": ("switch_mode", "Plan ready for review")}
        server = function_server([(exit_plan_mode, True)], "crow-plan", shown)
        return [ServerSpec("plan", "inprocess", server=server)]

    async def before_agent(self, ctx: HookContext) -> None:
        state = ctx.session.state
        if _STATE not in state:  # a resumed session: the plan is in its history
            state[_STATE] = approved_plan(list(ctx.session.messages))

    async def modify_request(self, ctx: HookContext, request: ModelRequest) -> ModelRequest | None:
        if ctx.session.mode != "plan":
            return None
        return request.with_system(PLAN_NOTE)

    async def after_model_call(self, ctx: HookContext, response: ModelResponse) -> None:
        calls = response.message.tool_calls
        if ctx.session.mode == "plan" and any(c.name == TOOL for c in calls):
            ctx.turn_state[_BATCH] = frozenset(c.id for c in calls if c.name != TOOL)
        else:
            ctx.turn_state.pop(_BATCH, None)

    async def wrap_tool_call(self, ctx: HookContext, call: ToolCall, call_next: Any) -> ToolResult:
        session = ctx.session
        if call.name != TOOL:
            # The model wrote these beside its plan, before anyone approved it: they are
            # judged as plan mode judges them, whenever the approval lands.
            if call.id in ctx.turn_state.get(_BATCH, ()) and not _read_only(session, call.name):
                return ToolResult(
                    call.id,
                    call.name,
                    error=f"Not run: sent in the same reply as {TOOL}, before the plan was "
                    "approved. Call it again now if the plan was approved.",
                )
            return await call_next(call)
        lock: anyio.Lock = ctx.turn_state.setdefault(_LOCK, anyio.Lock())
        async with lock:  # two plans in one reply: one question at a time
            return await self._exit_plan_mode(ctx, call, call_next)

    async def _exit_plan_mode(self, ctx: HookContext, call: ToolCall, call_next: Any) -> ToolResult:
        session = ctx.session
        if session.mode != "plan":
            return ToolResult(
                call.id,
                call.name,
                error=f"{TOOL} is only for plan mode, and the session is in {session.mode} mode: "
                "no approval is needed, go ahead (the mode's permissions apply).",
            )
        result: ToolResult = await call_next(call)  # the server checks the plan
        if result.is_error:
            return result
        plan = str(call.args.get("plan", ""))
        client: EditorClient | None = session.client
        if client is None:
            return ToolResult(
                call.id,
                call.name,
                error="Nobody is attached to approve the plan (no editor, no terminal), so the "
                "session stays in plan mode. Give the plan in your answer instead.",
            )
        choice = await client.ask(
            call,
            OPTIONS,
            title="Ready to code? Review the plan",
            text=plan,
            kind="switch_mode",
            timeout=self.timeout,
        )
        if choice in _MODE_MEANS:
            approved = {"plan": plan, "mode": choice}
            with anyio.CancelScope(shield=True):  # an approval is applied whole, even on cancel
                session.state[_STATE] = approved
                await session.save(mode=choice)
                await ctx.send(ModeChanged(choice))
            log.info("session %s: plan approved, mode %s", session.id, choice)
            return ToolResult(
                call.id,
                call.name,
                output=f'The user approved the plan ("{_LABELS[choice]}"). The session is now '
                f"in {choice} mode: {_MODE_MEANS[choice]}. Go ahead and carry out the plan.",
                meta={"crow/plan": approved},
            )
        if choice is None:
            why = "The user did not answer the request to approve the plan"
        else:
            why = f'The user answered "{_LABELS.get(choice, choice)}": the plan is not approved'
        return ToolResult(
            call.id,
            call.name,
            error=f"{why}, and the session stays in {session.mode} mode. Ask what they would "
            f"like changed, or refine the plan and call {TOOL} again.",
        )


def _read_only(session: Session, name: str) -> bool:
    spec = session.tools.spec(name) if session.tools is not None else None
    if name == SUBAGENT_TOOL and session.tools is not None and session.tools.trusted(name):
        # Read-only itself (so tasks run side by side), but its child runs in the mode the
        # session has when it starts: after the approval, one that edits.
        return False
    return bool(spec and spec.read_only)


def factory(agent: Any) -> PlanHook:
    settings = agent.config.hooks.settings.get("plan", {})
    return PlanHook(timeout=float(settings.get("timeout", agent.config.permission_timeout)))
