"""ProjectCommandsHook: a trusted project's command hooks, for that project's sessions only.

The user's own `hooks.commands` are registered once for every session (builtin_hooks
`install`). A trusted project's crow.yaml may add commands; they are in its sessions'
config (`ctx.session.config.hooks.commands`, after the user's) and this hook runs the ones
that are not the user's, at the phases they name, exactly as a command hook would, after
the user's hooks (innermost in the onions: the user's see a tool call first). An
untrusted project's file never reaches a session's config, so its commands never run.
"""

from __future__ import annotations

import logging
from typing import Any

from crow import Hook, HookContext, ToolCall, ToolResult
from crow.command_hooks import command_hook
from crow.config import CommandHookEntry

log = logging.getLogger("crow.project_commands")


class ProjectCommandsHook(Hook):
    name = "project_commands"
    order = 1  # after (inside) every hook of the user's, their command hooks included

    def __init__(self, user_commands: list[CommandHookEntry]) -> None:
        self.user_commands = list(user_commands)

    def hooks(self, ctx: HookContext) -> list[Hook]:
        """The session's project command hooks, built once per list of entries."""
        config = ctx.session.config
        entries = tuple(e for e in (config.hooks.commands if config else ()) if e not in self.user_commands)
        cached = ctx.session.state.get("project_commands")
        if cached is None or cached[0] != entries:
            cached = (entries, [command_hook(e) for e in entries])
            ctx.session.state["project_commands"] = cached
        return cached[1]

    def _at(self, ctx: HookContext, phase: str) -> list[Any]:
        return [getattr(h, phase) for h in self.hooks(ctx) if phase in h.phases()]

    async def _first_action(self, ctx: HookContext, phase: str, *args: Any) -> Any:
        chosen = None
        for fn in self._at(ctx, phase):
            action = await fn(ctx, *args)
            if action is not None and chosen is None:
                chosen = action
            elif action is not None:
                log.warning("project command hook at %s: a second action %r ignored", phase, action)
        return chosen

    async def before_agent(self, ctx: HookContext) -> None:
        for fn in self._at(ctx, "before_agent"):
            await fn(ctx)

    async def after_model_call(self, ctx: HookContext, response: Any) -> Any:
        return await self._first_action(ctx, "after_model_call", response)

    async def wrap_tool_call(self, ctx: HookContext, call: ToolCall, call_next: Any) -> ToolResult:
        handler = call_next
        for fn in reversed(self._at(ctx, "wrap_tool_call")):  # the first listed is outermost
            handler = _layer(fn, ctx, handler)
        result: ToolResult = await handler(call)
        return result

    async def agent_stop(self, ctx: HookContext) -> Any:
        return await self._first_action(ctx, "agent_stop")

    async def after_agent(self, ctx: HookContext) -> None:
        for fn in self._at(ctx, "after_agent"):
            await fn(ctx)

    async def on_error(self, ctx: HookContext, error: Exception) -> None:
        for fn in self._at(ctx, "on_error"):
            await fn(ctx, error)


def _layer(fn: Any, ctx: HookContext, call_next: Any) -> Any:
    async def layer(call: ToolCall) -> ToolResult:
        result: ToolResult = await fn(ctx, call, call_next)
        return result

    return layer


def factory(agent: Any) -> ProjectCommandsHook:
    return ProjectCommandsHook(agent.config.hooks.commands)
