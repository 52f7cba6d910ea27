"""The todo-list MCP server: one tool, ``write_todos``, that replaces the whole list.

State lives on the server instance: ``build_server()`` returns a :class:`TodoServer`
(an ``MCPServer``) whose ``todos`` attribute is the current list of :class:`Todo`.
Each call's result carries the list as ``structured_content``::

    {"todos": [{"id": str, "title": str, "status": "pending"|"in_progress"|"done"}, ...]}
"""

from __future__ import annotations

from typing import Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.request_state import RequestStateSecurity
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field

Status = Literal["pending", "in_progress", "done"]


class Todo(BaseModel):
    """One task. Statuses: pending, in_progress, done."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, description="Stable identifier, e.g. '1'")
    title: str = Field(min_length=1, description="What to do, in a few words")
    status: Status = Field(description="pending, in_progress or done")


class TodoServer(MCPServer):
    """An MCPServer that remembers the last todo list written to it."""

    todos: list[Todo]


def _summary(todos: list[Todo]) -> str:
    if not todos:
        return "Todo list cleared."
    counts = {s: sum(t.status == s for t in todos) for s in ("done", "in_progress", "pending")}
    head = (
        f"Todo list updated: {len(todos)} items "
        f"({counts['done']} done, {counts['in_progress']} in progress, {counts['pending']} pending)."
    )
    marks = {"done": "[x]", "in_progress": "[~]", "pending": "[ ]"}
    return "\n".join([head, *(f"{marks[t.status]} {t.id}. {t.title}" for t in todos)])


def build_server(*, request_state_security: RequestStateSecurity | None = None) -> TodoServer:
    server = TodoServer(
        "crow-todos",
        instructions="Track the plan for the current task.",
        request_state_security=request_state_security,
    )
    server.todos = []

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, idempotent_hint=True))
    async def write_todos(todos: list[Todo]) -> CallToolResult:
        """Replace the whole todo list with `todos`. Use it to plan multi-step work and to
        report progress: send every item each time (items left out are dropped), each
        with an `id`, a short `title` and a `status` of "pending", "in_progress" or
        "done". Keep at most one item in_progress."""
        ids = [t.id for t in todos]
        if len(set(ids)) != len(ids):
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            raise ToolError(f"todo ids must be unique; repeated: {', '.join(dupes)}")
        server.todos = list(todos)
        return CallToolResult(
            content=[TextContent(type="text", text=_summary(server.todos))],
            structured_content={"todos": [t.model_dump() for t in server.todos]},
        )

    return server
