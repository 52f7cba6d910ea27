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
from crow.hooks import USER_BAND, Action, ActionPicker, CallTool, Hook, _Impl, build_chain
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

    def hooks(self, ctx: HookContext) -> list[Hook]:
        """The session's project command hooks, built once per list of entries."""
        config = ctx.session.config
        entries = tuple(e for e in (config.hooks.commands if config else ()) if e not in self.user_commands)
        cached = ctx.session.state.get(PROJECT_COMMANDS)
        if cached is None or cached[0] != entries:
            cached = ctx.session.state[PROJECT_COMMANDS] = (entries, [command_hook(e) for e in entries])
        hooks: list[Hook] = cached[1]
        return hooks

    def _at(self, ctx: HookContext, phase: str) -> list[Any]:
        return [getattr(h, phase) for h in self.hooks(ctx) if phase in h.phases()]

    async def _first_action(self, ctx: HookContext, phase: str, *args: Any) -> Action | None:
        picker = ActionPicker()
        for fn in self._at(ctx, phase):
            picker.offer(f"{PROJECT_COMMANDS} at {phase}", await fn(ctx, *args))
        return picker.chosen

    async def _observe(self, ctx: HookContext, phase: str, *args: Any) -> None:
        for fn in self._at(ctx, phase):
            await fn(ctx, *args)

    async def before_agent(self, ctx: HookContext) -> None:
        await self._observe(ctx, "before_agent")

    async def after_model_call(self, ctx: HookContext, response: ModelResponse) -> Action | None:
        return await self._first_action(ctx, "after_model_call", response)

    async def wrap_tool_call(self, ctx: HookContext, call: ToolCall, call_next: CallTool) -> ToolResult:
        layers = [
            _Impl(f"{PROJECT_COMMANDS}[{i}]", "wrap_tool_call", fn, 0, USER_BAND, 2)
            for i, fn in enumerate(self._at(ctx, "wrap_tool_call"))
        ]
        result: ToolResult = await build_chain(layers, ctx, call_next)(call)  # the first listed: outermost
        return result

    async def agent_stop(self, ctx: HookContext) -> Action | None:
        return await self._first_action(ctx, "agent_stop")

    async def after_agent(self, ctx: HookContext) -> None:
        await self._observe(ctx, "after_agent")

    async def on_error(self, ctx: HookContext, error: Exception) -> None:
        await self._observe(ctx, "on_error", error)
