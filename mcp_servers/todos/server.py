"""The todo-list MCP server: one tool, ``write_todos``, that replaces the whole list.

State lives on the server instance: ``build_server()`` returns a :class:`TodoServer`
(an ``MCPServer``) whose ``todos`` attribute is the current list of :class:`Todo`.
Each call's result carries the list as ``structured_content``::

    {"todos": [{"id": str, "title": str, "status": "pending"|"in_progress"|"done"}, ...]}

Models trained on other agents send other item shapes; they are accepted and mapped
(the schema the model reads names only crow's fields): Claude Code's ``content`` and
``activeForm`` (dropped), codex's ``step``, Gemini CLI's ``description``, statuses
``completed``/``in-progress``/..., and no ``id`` (an item's position becomes its id). An
item ``cancelled`` (Gemini CLI's fourth status) is left out: given up is not done.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.request_state import RequestStateSecurity
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from mcp_servers import crow_meta

Status = Literal["pending", "in_progress", "done"]

# Other agents' spellings -> crow's.
_TITLE_ALIASES = ("content", "step", "task", "description", "text")
_DROPPED = frozenset({"activeForm", "active_form", "priority"})
_STATUS_ALIASES = {
    "completed": "done",
    "complete": "done",
    "finished": "done",
    "in-progress": "in_progress",
    "inprogress": "in_progress",
    "active": "in_progress",
    "doing": "in_progress",
    "todo": "pending",
    "not_started": "pending",
    "open": "pending",
}


class Todo(BaseModel):
    """One task. Statuses: pending, in_progress, done."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field("", description="Stable identifier, e.g. '1' (default: the item's position)")
    title: str = Field(min_length=1, description="What to do, in a few words")
    status: Status = Field(description="pending, in_progress or done")

    @model_validator(mode="before")
    @classmethod
    def _other_agents_shapes(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        item = {k: v for k, v in data.items() if k not in _DROPPED}
        if "title" not in item:
            alias = next((k for k in _TITLE_ALIASES if k in item), None)
            if alias is not None:
                item["title"] = item.pop(alias)
        status = item.get("status")
        if isinstance(status, str):
            status = status.strip().lower().replace(" ", "_")
            item["status"] = _STATUS_ALIASES.get(status, status)
        if isinstance(item.get("id"), int) and not isinstance(item["id"], bool):
            item["id"] = str(item["id"])
        return item


_GIVEN_UP = frozenset({"cancelled", "canceled"})


def _without_given_up(items: Any) -> Any:
    if not isinstance(items, list):
        return items
    return [
        item
        for item in items
        if not (isinstance(item, dict) and str(item.get("status", "")).strip().lower() in _GIVEN_UP)
    ]


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

    @server.tool(
        annotations=ToolAnnotations(read_only_hint=False, idempotent_hint=True),
        meta=crow_meta("think", "Update plan"),
    )
    async def write_todos(todos: Annotated[list[Todo], BeforeValidator(_without_given_up)]) -> CallToolResult:
        """Replace the whole todo list with `todos`. Use it to plan multi-step work and to
        report progress: send every item each time (items left out are dropped), each
        with an `id`, a short `title` and a `status` of "pending", "in_progress" or
        "done". Keep at most one item in_progress."""
        todos = [t if t.id else t.model_copy(update={"id": str(i)}) for i, t in enumerate(todos, 1)]
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
