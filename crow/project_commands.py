"""A trusted project's command hooks (`hooks.commands` in its crow.yaml), for that
project's sessions only.

The registry is shared by every session, so the project's commands cannot be registered
as hooks of their own: this one hook, found with the user's command hooks (`crow.plugins`),
runs the session's project commands at the phases they name, as a command hook would.
"""

from __future__ import annotations

from typing import Any

from crow.command_hooks import command_hook
from crow.config import CommandHookEntry
from crow.context import HookContext
from crow.hooks import Action, ActionPicker, CallTool, Hook, HookRegistry, build_chain
from crow.llm.base import ModelResponse
from crow.messages import ToolCall, ToolResult

PROJECT_COMMANDS = "project_commands"


class ProjectCommandsHook(Hook):
    """Runs the session's project commands (those of its config's `hooks.commands` that
    are not the user's) inside every hook of the user's (order 1000): the user's hooks see a
    tool call first. An untrusted project's commands never reach a session's config."""

    name = PROJECT_COMMANDS
    order = 1000

    def __init__(self, user_commands: list[CommandHookEntry]) -> None:
        self.user_commands = list(user_commands)

    def stack(self, ctx: HookContext) -> HookRegistry:
        """The session's project command hooks, in a registry of their own (in the order
        listed), built once per list of entries."""
        config = ctx.session.config
        entries = tuple(e for e in (config.hooks.commands if config else ()) if e not in self.user_commands)
        cached = ctx.session.state.get(PROJECT_COMMANDS)
        if cached is None or cached[0] != entries:
            registry = HookRegistry()
            for i, entry in enumerate(entries):
                registry.register(command_hook(entry), name=f"{PROJECT_COMMANDS}[{i}]", order=i)
            cached = ctx.session.state[PROJECT_COMMANDS] = (entries, registry)
        stack: HookRegistry = cached[1]
        return stack

    async def _first_action(self, ctx: HookContext, phase: str, **offered: Any) -> Action | None:
        picker = ActionPicker()
        for impl in self.stack(ctx).at(phase):
            picker.offer(f"{impl.name} at {phase}", await impl(ctx=ctx, **offered))
        return picker.chosen

    async def _observe(self, ctx: HookContext, phase: str, **offered: Any) -> None:
        for impl in self.stack(ctx).at(phase):
            await impl(ctx=ctx, **offered)

    async def before_agent(self, ctx: HookContext) -> None:
        await self._observe(ctx, "before_agent")

    async def after_model_call(self, ctx: HookContext, response: ModelResponse) -> Action | None:
        return await self._first_action(ctx, "after_model_call", response=response)

    async def wrap_tool_call(self, ctx: HookContext, call: ToolCall, call_next: CallTool) -> ToolResult:
        layers = self.stack(ctx).at("wrap_tool_call")
        result: ToolResult = await build_chain(layers, ctx, call_next)(call)  # the first listed: outermost
        return result

    async def agent_stop(self, ctx: HookContext) -> Action | None:
        return await self._first_action(ctx, "agent_stop")

    async def after_agent(self, ctx: HookContext) -> None:
        await self._observe(ctx, "after_agent")

    async def on_error(self, ctx: HookContext, error: Exception) -> None:
        await self._observe(ctx, "on_error", error=error)
