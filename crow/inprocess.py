"""In-process MCP servers, called through their own methods rather than an MCP session:
`DirectClient` (what `ToolHub` uses for them), `direct_call_state` (their requestState
codec), `needs_session` (the servers that must run in a session after all), and
`function_server` (plain Python functions served as one)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

log = logging.getLogger("crow.tools")


class _NoRequestState:
    """The requestState codec of servers crow calls directly. requestState travels to an
    MCP client and back; a server called through its own methods has no client, so it
    never seals state, and a token could only be forged: both fail closed."""

    def seal(self, payload: bytes) -> str:
        raise RuntimeError("requestState needs an MCP client session; this server is called in-process")

    def unseal(self, token: str) -> bytes:
        from mcp.server.request_state import InvalidRequestState

        raise InvalidRequestState("this in-process server never issued request state")


_direct_state: Any = None


def direct_call_state() -> Any:
    """`request_state_security=` for an MCPServer only ever served in-process by a ToolHub
    (which calls it directly). Optional: MCPServer's default generates an AES key per
    server, which loads OpenSSL's ciphers: ~1.3 MB at the first session, for state a
    directly called server never uses."""
    global _direct_state
    if _direct_state is None:
        from mcp.server.request_state import RequestStateSecurity

        _direct_state = RequestStateSecurity(codec=_NoRequestState())
    return _direct_state


class DirectClient:
    """The part of `mcp.Client` the hub uses, answered by an in-process `MCPServer` itself.
    A failing tool becomes the same error result MCPServer's call_tool handler sends."""

    def __init__(self, server: Any) -> None:
        self.server = server

    async def list_tools(self) -> Any:
        from mcp.types import ListToolsResult

        return ListToolsResult(tools=await self.server.list_tools())

    async def call_tool(self, name: str, arguments: dict[str, Any], **_: Any) -> Any:
        from mcp import MCPError
        from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
        from mcp.types import CallToolResult, TextContent

        try:
            result = await self.server.call_tool(name, arguments)
        except MCPError:
            raise
        except Exception as exc:
            if isinstance(exc, ToolError) and not isinstance(exc, UnexpectedToolError):
                log.info("tool %s failed: %s", name, exc)
            else:
                log.exception("tool %s raised an unexpected exception", name)
            return CallToolResult(content=[TextContent(type="text", text=str(exc))], is_error=True)
        if not isinstance(result, CallToolResult):  # an InputRequiredResult: needs a client session
            text = f"tool {name} asked for input, which an in-process call cannot give"
            return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)
        return result


def needs_session(server: Any) -> bool:
    """Whether an in-process server has parts only an MCP session runs: a lifespan, or
    middleware beyond the SDK's own (tracing, the requestState boundary)."""
    settings = getattr(server, "settings", None)
    if settings is None or getattr(settings, "lifespan", None) is not None:
        return True
    return any(not type(m).__module__.startswith("mcp.") for m in getattr(server, "middleware", ()))


def function_server(
    functions: Sequence[tuple[Callable[..., Any], bool]],
    name: str = "crow-tools",
    shown: Mapping[str, tuple[str, str]] | None = None,
) -> Any:
    """An in-process MCP server serving plain Python functions (the seed's FuncTool);
    each entry is (function, read_only). `shown` gives a function (by name) the kind and
    title template an editor shows its calls with (`_meta.crow`)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    server = MCPServer(name, request_state_security=direct_call_state())
    for fn, read_only in functions:
        annotations = ToolAnnotations(read_only_hint=True) if read_only else None
        kind_title = (shown or {}).get(fn.__name__)
        meta = {"crow": {"kind": kind_title[0], "title": kind_title[1]}} if kind_title else None
        server.add_tool(fn, annotations=annotations, meta=meta, structured_output=False)
    return server
