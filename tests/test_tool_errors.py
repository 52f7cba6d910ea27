"""What the model reads when it sends malformed arguments: the argument, what was wrong,
what to send, once (no "Error executing tool" prefix, no pydantic dump with URLs)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from typing_extensions import TypeAliasType

from crow.messages import ToolCall, ToolResult
from crow.tools import ServerSpec, ToolHub

pytestmark = pytest.mark.anyio

READ = 'Send: {"path": string, "offset"?: integer, "limit"?: integer}'
EDIT = 'Send: {"path": string, "old_text": string, "new_text": string, "replace_all"?: boolean}'


@pytest.fixture
async def hub(root: Path) -> AsyncIterator[ToolHub]:
    from mcp_servers.filesystem import build_server
    from mcp_servers.todos import build_server as todo_server

    (root / "a.txt").write_text("one\ntwo\n")
    tools = ToolHub()
    await tools.connect(
        [
            ServerSpec("filesystem", "inprocess", server=build_server(root)),
            ServerSpec("todos", "inprocess", server=todo_server()),
        ]
    )
    try:
        yield tools
    finally:
        await tools.aclose()


async def call(hub: ToolHub, name: str, **args: object) -> ToolResult:
    return await hub.call(ToolCall("c", name, args))


async def test_a_missing_argument_is_named_with_what_to_send(hub: ToolHub) -> None:
    result = await call(hub, "read_file")
    assert (
        result.error
        == f"read_file was not run: its arguments are wrong.\n- `path`: missing; it is required\n{READ}"
    )


async def test_a_misspelled_argument_is_named_not_dropped(hub: ToolHub) -> None:
    result = await call(hub, "read_file", file_path="a.txt")
    assert result.error == (
        "read_file was not run: its arguments are wrong.\n"
        "- `path`: missing; it is required\n"
        "- `file_path`: read_file has no such argument; leave it out\n"
        f"{READ}"
    )
    extra = await call(hub, "edit_file", path="a.txt", old_text="one", new_text="1", replaceAll=True)
    assert extra.error == (
        "edit_file was not run: its arguments are wrong.\n"
        "- `replaceAll`: edit_file has no such argument; leave it out\n"
        f"{EDIT}"
    )


async def test_a_wrong_type_names_the_argument_and_the_value(hub: ToolHub) -> None:
    result = await call(hub, "read_file", path="a.txt", offset="x")
    assert result.error == (
        "read_file was not run: its arguments are wrong.\n"
        "- `offset`: input should be a valid integer, unable to parse string as an integer (got 'x')\n"
        f"{READ}"
    )
    todos = await call(hub, "write_todos", todos="nope")
    assert todos.error == (
        "write_todos was not run: its arguments are wrong.\n"
        "- `todos`: input should be a valid list (got 'nope')\n"
        'Send: {"todos": {"id"?: string, "title": string, "status": \'pending\' | \'in_progress\' | \'done\'}[]}'
    )


async def test_a_tool_refusal_reads_once_without_the_sdk_prefix(hub: ToolHub) -> None:
    result = await call(hub, "edit_file", path="a.txt", old_text="three", new_text="3")
    assert result.error == "old_text was not found in the file (it must match exactly, whitespace included)"
    # The model reads it as one "Error: ..." line, not "Error: Error executing tool ...".
    assert result.text == f"Error: {result.error}"


Json = TypeAliasType("Json", "list[Json] | str")


async def _store(data: Json) -> str:  # type: ignore[valid-type]
    return "stored"


async def test_a_recursive_argument_type_still_gets_a_signature() -> None:
    """A tool taking a recursive type (a JSON value as a type alias: `list[Json] | str`)
    has a `$ref` cycle with no object in it; spelling out what to send recursed without
    end, so the model got a RecursionError instead of its missing argument."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("data")
    server.add_tool(_store)
    hub = ToolHub()
    await hub.connect([ServerSpec("data", "inprocess", server=server)])
    try:
        result = await hub.call(ToolCall("x", "_store", {}))
        assert result.error == (
            "_store was not run: its arguments are wrong.\n- `data`: missing; it is required\n"
            'Send: {"data": any[] | string}'
        )
    finally:
        await hub.aclose()
