"""TodoListHook: the write_todos tool, the session's todo list, and the editor's plan."""

from __future__ import annotations

from typing import Any

from crow import Hook, HookContext, PlanUpdated, ServerSpec, Session, ToolCall, ToolResult


class TodoListHook(Hook):
    name = "todolist"
    order = -60

    def tool_servers(self, session: Session) -> list[ServerSpec]:
        from crow import direct_call_state
        from mcp_servers.todos import Todo, build_server

        server = build_server(request_state_security=direct_call_state())
        if session.todos:  # a resumed session keeps its list
            server.todos = [Todo(**t) for t in session.todos]
        return [ServerSpec("todos", "inprocess", server=server)]

    async def wrap_tool_call(self, ctx: HookContext, call: ToolCall, call_next: Any) -> ToolResult:
        result: ToolResult = await call_next(call)
        if call.name == "write_todos" and not result.is_error:
            structured = (result.meta or {}).get("structured") or {}
            todos = [dict(t) for t in structured.get("todos", [])]
            await ctx.session.save(todos=todos)
            await ctx.send(PlanUpdated(todos))
        return result


def factory(agent: Any) -> TodoListHook:
    return TodoListHook()
