"""SubagentsHook: the `task(description, prompt, agent?)` tool, a child agent run to the end.

A `task` call runs a child session (`Agent.create_child`: the parent's folder, settings
and tool servers) through the same loop and hooks (`Agent.run_turn`), with its own context:
the agent definition's system prompt and the task's prompt, nothing of the parent's. Its
events reach the parent's front end wrapped (`SubagentStarted`, `SubagentEvent`,
`SubagentFinished`); its questions go to the parent's front end naming it
(`child_client`). The child's final answer is the call's result, with a footer.

Groundwork version (the lead's): one child per call, the default agent only.
TODO(helper: core): definitions, concurrency and limits, depth, allow-lists, mode, model,
cost into the parent, cancel, failures, the footer's figures.
"""

from __future__ import annotations

import logging
from typing import Any

from crow import (
    Hook,
    HookContext,
    Message,
    ServerSpec,
    Session,
    SubagentEvent,
    SubagentFinished,
    SubagentStarted,
    ToolCall,
    ToolResult,
    child_client,
)

log = logging.getLogger("crow.hooks.subagents")

TOOL = "task"
DEFAULT_AGENT = "general-purpose"


class SubagentsHook(Hook):
    name = "subagents"
    order = -74  # inside permissions, plan and ask; outside the hooks that run file tools

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self._server: Any = None

    def tool_servers(self, session: Session) -> list[ServerSpec]:
        if self._server is None:
            self._server = self._build_server()
        return [ServerSpec("subagents", "inprocess", server=self._server)]

    @staticmethod
    def _build_server() -> Any:
        from crow import function_server

        async def task(description: str, prompt: str, agent: str = DEFAULT_AGENT) -> str:
            """Hand a self-contained piece of work to a subagent: a fresh agent with its own
            context that sees only `prompt` (say everything it needs: files, what to find or
            change, what to report back), works with the same tools, and returns its final
            answer as this tool's result. `description` is a short title (3-7 words) shown to
            the user. Several task calls in one reply run at the same time: use them for
            independent searches or changes."""
            return "The task was not run: nothing in crow was there to run it."

        shown = {TOOL: ("think", "{description}")}
        return function_server([(task, True)], "crow-subagents", shown)

    async def wrap_tool_call(self, ctx: HookContext, call: ToolCall, call_next: Any) -> ToolResult:
        hub = ctx.session.tools
        if call.name != TOOL or hub is None or not hub.trusted(call.name):
            return await call_next(call)
        checked: ToolResult = await call_next(call)  # the server checks the arguments
        if checked.is_error:
            return checked
        parent = ctx.session
        description = str(call.args.get("description", "")).strip() or "Task"
        name = str(call.args.get("agent") or DEFAULT_AGENT)
        child = await self.agent.create_child(parent, title=description)
        child.client = child_client(parent.client, session_id=child.id, name=name, parent_call_id=call.id)
        await ctx.send(
            SubagentStarted(
                call.id, child.id, name, description, str(child.cwd), tuple(child.additional_directories)
            )
        )

        async def forward(event: Any) -> None:
            await ctx.send(SubagentEvent(call.id, child.id, event))

        result = await self.agent.run_turn(child, Message("user", str(call.args.get("prompt", ""))), forward)
        await ctx.send(
            SubagentFinished(call.id, child.id, result.stop_reason, cost=child.cost, error=result.error)
        )
        answer = next(
            (m.content for m in reversed(child.messages) if m.role == "assistant" and m.content), ""
        )
        return ToolResult(call.id, call.name, output=answer or "(The subagent gave no answer.)")


def factory(agent: Any) -> SubagentsHook:
    return SubagentsHook(agent)
