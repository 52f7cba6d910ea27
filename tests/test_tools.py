"""ToolHub: in-process MCP servers reached directly and through an MCP session give the
model the same tools and the same results; failures become results, never exceptions."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations

from crow.messages import ToolCall
from crow.tools import ServerSpec, ToolHub

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def sample_server(events: list[str] | None = None) -> MCPServer:
    @contextlib.asynccontextmanager
    async def lifespan(_server: MCPServer) -> AsyncIterator[None]:
        if events is not None:
            events.append("lifespan")
        yield

    server = MCPServer("sample", lifespan=lifespan if events is not None else None)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def add(a: int, b: int) -> str:
        """Add two numbers."""
        return str(a + b)

    @server.tool()
    async def refuse(reason: str) -> str:
        """Always fails the way a tool reports a problem to the model."""
        raise ToolError(f"refused: {reason}")

    @server.tool()
    async def crash() -> str:
        """Fails with a bug."""
        raise RuntimeError("boom")

    @server.tool()
    async def annotated() -> CallToolResult:
        """Returns text plus structured content and metadata for the editor."""
        return CallToolResult(
            content=[TextContent(type="text", text="done")],
            structured_content={"n": 1},
            _meta={"crow/diff": {"path": "a.txt"}},
        )

    return server


CALLS = [
    ToolCall("1", "add", {"a": 2, "b": 3}),
    ToolCall("2", "add", {"a": "two", "b": 3}),  # fails validation
    ToolCall("3", "refuse", {"reason": "no"}),
    ToolCall("4", "crash", {}),
    ToolCall("5", "annotated", {}),
    ToolCall("6", "missing", {}),
]


async def results(direct: bool) -> tuple[list[Any], list[Any]]:
    hub = ToolHub()
    await hub.connect([ServerSpec("sample", "inprocess", server=sample_server(), direct=direct)])
    try:
        return hub.specs(), [await hub.call(c) for c in CALLS]
    finally:
        await hub.aclose()


async def test_direct_calls_match_calls_through_an_mcp_session() -> None:
    direct_specs, direct = await results(direct=True)
    session_specs, through = await results(direct=False)
    assert direct_specs == session_specs
    assert {s.name: s.read_only for s in direct_specs} == {
        "add": True, "refuse": False, "crash": False, "annotated": False,
    }
    assert [(r.output, r.error, r.meta) for r in direct] == [(r.output, r.error, r.meta) for r in through]
    ok, bad_args, refused, crashed, annotated, missing = direct
    assert ok.output == "5" and not ok.is_error
    assert bad_args.is_error and "a" in bad_args.error
    assert refused.error == "Error executing tool refuse: refused: no"
    assert crashed.error == "Error executing tool crash"  # a bug's details stay in the log
    assert annotated.output == "done" and annotated.meta == {"structured": {"n": 1}, "crow/diff": {"path": "a.txt"}}
    assert missing.error == "unknown tool 'missing'"


async def test_a_server_with_a_lifespan_goes_through_an_mcp_session() -> None:
    events: list[str] = []
    hub = ToolHub()
    await hub.connect([ServerSpec("sample", "inprocess", server=sample_server(events))])
    try:
        assert events == ["lifespan"]
        assert (await hub.call(CALLS[0])).output == "5"
    finally:
        await hub.aclose()


async def test_a_name_clash_is_qualified_and_a_broken_server_is_reported() -> None:
    hub = ToolHub()
    specs = [
        ServerSpec("one", "inprocess", server=sample_server(), direct=True),
        ServerSpec("two", "inprocess", server=sample_server(), direct=True),
        ServerSpec("broken", "stdio", command="/nonexistent/server"),
    ]
    await hub.connect(specs, connect_timeout=10)
    try:
        names = [s.name for s in hub.specs()]
        assert names.count("add") == 1 and "two_add" in names
        assert hub.server_of("two_add") == "two"
        assert (await hub.call(ToolCall("x", "two_add", {"a": 1, "b": 1}))).output == "2"
        assert len(hub.failures) == 1 and "'broken' failed to start" in hub.failures[0]
    finally:
        await hub.aclose()


def test_servers_called_directly_refuse_request_state() -> None:
    from mcp.server.request_state import InvalidRequestState

    from crow.tools import direct_call_state

    codec = direct_call_state().codec
    assert direct_call_state() is direct_call_state()  # one policy for every such server
    with pytest.raises(RuntimeError, match="in-process"):
        codec.seal(b"{}")
    with pytest.raises(InvalidRequestState):
        codec.unseal("forged")
