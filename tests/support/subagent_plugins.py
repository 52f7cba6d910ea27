"""The task tool with its result linked to its child session (`ToolResult.meta["crow/subagent"]
= {"session_id": ...}`), as the complete task tool does; for the replay tests until that
lands (nothing changes when the result has the link already). Loaded via config, in place
of the builtin: `hooks: {disable: [subagents], extra: ["subagent_plugins:linked"]}`."""

from __future__ import annotations

from typing import Any

from builtin_hooks.subagents import SubagentsHook
from crow import HookContext, SubagentStarted, ToolCall, ToolResult

_SEEN = "subagent-link"


class LinkedSubagents(SubagentsHook):
    name = "subagents-linked"

    async def wrap_tool_call(self, ctx: HookContext, call: ToolCall, call_next: Any) -> ToolResult:
        seen: dict[str, str] | None = ctx.turn_state.get(_SEEN)
        if seen is None:  # watch the turn's events once: SubagentStarted names the child
            seen = ctx.turn_state[_SEEN] = {}
            emit = ctx.emit

            async def watching(event: Any) -> None:
                if isinstance(event, SubagentStarted):
                    seen[event.parent_call_id] = event.session_id
                await emit(event)

            ctx.emit = watching
        result = await super().wrap_tool_call(ctx, call, call_next)
        child = seen.get(call.id)
        meta = dict(result.meta or {})
        if child is None or "crow/subagent" in meta:
            return result
        meta["crow/subagent"] = {"session_id": child}
        return result.replace(meta=meta)


def linked(agent: Any) -> LinkedSubagents:
    return LinkedSubagents(agent)
