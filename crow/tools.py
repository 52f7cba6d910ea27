"""ToolHub: every tool crow offers the model comes from an MCP server.

Every in-process `MCPServer` (crow's own filesystem, todos, skills and Python tools, and a
plugin's) is called through the server's own `list_tools`/`call_tool` (`crow.inprocess`):
the same tools and results as over a transport, without a JSON-RPC round trip validated on
both sides (~0.25 ms a call). Only a server with a lifespan or middleware of its own, which
run inside an MCP session, connects through `mcp.Client(server)`; the servers an editor
passes in `session/new` (stdio, http, sse) connect as ordinary MCP clients.

The hub routes a tool name to its server and keeps names unique: a server whose name is
taken is connected under `NAME_2` (`_3`, ...), a tool whose name is taken is offered as
`SERVER_TOOL` (then `SERVER_TOOL_2`, ...); crow's own servers come first, so they keep
their names, and each rename is told to the user at the first prompt (`failures`). Each
tool's `ToolSpec` carries its kind and title (`crow.tool_kinds`: `_meta.crow`, else the
annotations). It turns MCP results and failures into `ToolResult`s, wording errors for the
model once (`crow.tool_errors`).

`mcp` costs about a second to import, so nothing here imports it at module load: the ACP
adapter warms it in a thread after `initialize`, and sessions connect lazily.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from crow import images
from crow.inprocess import DirectClient, needs_session
from crow.llm.base import ToolSpec
from crow.messages import Image, ToolCall, ToolResult
from crow.tool_errors import check_arguments, for_model
from crow.tool_kinds import declared_presentation

if TYPE_CHECKING:
    import anyio

log = logging.getLogger("crow.tools")
_STOP_AFTER_CANCEL = 8.0  # the MCP stdio client's own shutdown takes at most ~6 s

_NAME_OK = re.compile(r"[^a-zA-Z0-9_-]")
# What OpenAI and Anthropic accept as a tool name; MCP allows more (`.`, 128 characters),
# and one name outside it fails every request of the session.
_MODEL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def import_mcp() -> None:
    """Import the heavy MCP modules (run it in a thread to warm them up)."""
    import mcp
    import mcp.server.mcpserver  # noqa: F401

    from crow.startup import mcp_imported

    mcp_imported()


@dataclass
class ServerSpec:
    """How to reach one MCP server."""

    name: str
    transport: str  # "inprocess" | "stdio" | "http" | "sse"
    server: Any = None  # an MCPServer, for in-process
    command: str = ""
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    url: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 600.0  # per call, for servers outside this process
    # Whether its read-only hints are believed. None: crow's own (in-process) servers are,
    # servers over a transport (an editor's, a plugin's) are not: their tools ask.
    trusted: bool | None = None
    # Awaited once when the hub closes, after the server has stopped: an in-process server's
    # own resources (a session's container) go with the session. Its errors are logged.
    on_close: Callable[[], Awaitable[None]] | None = None


@dataclass(eq=False)
class _Connection:
    spec: ServerSpec
    client: Any = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    # Cancels it so that the MCP client's shielded shutdown (which stops the server process)
    # still runs; a bare task.cancel() breaks into it: the process lives on, the task hangs.
    scope: anyio.CancelScope | None = None
    error: str | None = None
    asked_as: str = ""  # the name it was given, when that was taken (`ToolHub._unique_server`)
    prompts: list[Any] = field(default_factory=list)  # its MCP prompts (crow.mcp_prompts)
    prompts_changed: asyncio.Event = field(default_factory=asyncio.Event)  # list_changed came

    def cancel(self) -> None:
        if self.scope is not None:
            self.scope.cancel()
        elif self.task is not None:  # not started: nothing to shut down yet
            self.task.cancel()


@dataclass(frozen=True)
class ServerState:
    """What `ToolHub.servers` says of one server."""

    name: str  # as connected
    asked_as: str  # the name it was given when that was taken, else ""
    transport: str
    state: str  # "connected" | "failed" | "stopped" (it exited since) | "starting"
    error: str | None  # why it failed
    tools: tuple[tuple[str, str], ...]  # (the name the model calls it, the server's own name)


class ToolHub:
    """The tools of one session."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        # The base environment of stdio servers (crow.environment's policy; None: the
        # default policy); each also gets the `env` its entry names.
        self.env = env
        self._conns: dict[str, _Connection] = {}
        self._routes: dict[str, tuple[_Connection, str]] = {}
        self._specs: list[ToolSpec] = []
        self.failures: list[str] = []  # what to tell the user about servers that failed
        # Called after a server's prompts changed (`notifications/prompts/list_changed`).
        self.on_prompts_changed: Callable[[], Awaitable[None]] | None = None

    async def connect(self, specs: Sequence[ServerSpec], *, connect_timeout: float = 30.0) -> None:
        """Connect servers concurrently; a server that fails, or whose name is taken, is
        reported (`failures`), never fatal."""
        conns = [self._start(self._unique_server(spec), spec.name) for spec in specs]
        await asyncio.gather(*(self._await_ready(c, connect_timeout) for c in conns))
        # Listed side by side, each within the timeout too (a server that starts and never
        # lists would hold the session's preparation forever); indexed in order, so crow's
        # own servers keep their names.
        listed = await asyncio.gather(*(self._list(c, connect_timeout) for c in conns))
        for conn, tools in zip(conns, listed, strict=True):
            if tools is not None:
                self._index(conn, tools)
        await asyncio.gather(*(self._list_prompts(c, connect_timeout) for c in conns))

    def _unique_server(self, spec: ServerSpec) -> ServerSpec:
        if spec.name not in self._conns:
            return spec
        name = _first_free(spec.name, self._conns)
        self.failures.append(
            f"MCP server {spec.name!r}: another server already has that name; it is connected as {name!r}"
        )
        return dataclasses.replace(spec, name=name)

    def _start(self, spec: ServerSpec, asked_as: str) -> _Connection:
        conn = _Connection(spec, asked_as=asked_as if asked_as != spec.name else "")
        self._conns[spec.name] = conn
        # Each connection lives in its own task: MCP clients must be exited by the task
        # that entered them.
        conn.task = asyncio.create_task(self._serve(conn), name=f"mcp:{spec.name}")
        return conn

    async def _serve(self, conn: _Connection) -> None:
        import anyio

        try:
            with anyio.CancelScope() as conn.scope:
                async with _open_client(conn.spec, self.env, partial(_on_message, conn)) as client:
                    conn.client = client
                    conn.ready.set()
                    await self._serve_until_closed(conn)
        except BaseException as exc:
            if not conn.ready.is_set():
                conn.error = _describe(exc)
                conn.ready.set()
            elif not isinstance(exc, asyncio.CancelledError):
                log.warning("MCP server %s stopped: %s", conn.spec.name, _describe(exc))
        finally:
            conn.client = None

    async def _await_ready(self, conn: _Connection, timeout: float) -> None:
        try:
            await asyncio.wait_for(conn.ready.wait(), timeout)
        except TimeoutError:
            conn.error = f"did not answer within {timeout:.0f} s"
            conn.cancel()
        if conn.error is not None:
            msg = f"MCP server {conn.spec.name!r} failed to start: {conn.error}"
            log.warning(msg)
            self.failures.append(msg)

    async def _list(self, conn: _Connection, timeout: float) -> list[Any] | None:
        """The server's tools, or None (reported) when it failed to start or to list them."""
        if conn.error is not None:
            return None
        try:
            return list((await asyncio.wait_for(conn.client.list_tools(), timeout)).tools)
        except TimeoutError:
            conn.error = f"did not list its tools within {timeout:.0f} s"
            conn.closing.set()  # it offers nothing: stop it
        except Exception as exc:
            conn.error = f"did not list its tools: {_describe(exc)}"
        self.failures.append(f"MCP server {conn.spec.name!r} {conn.error}")
        return None

    async def _list_prompts(self, conn: _Connection, timeout: float) -> bool:
        """Read the server's prompts into `conn.prompts`; False (reported) on failure."""
        if conn.error is not None or conn.client is None:
            return False
        from crow.mcp_prompts import list_prompts

        try:
            conn.prompts = await asyncio.wait_for(list_prompts(conn.client), timeout)
        except Exception as exc:  # TimeoutError too: its tools still serve
            failure = f"MCP server {conn.spec.name!r} did not list its prompts: {_describe(exc)}"
            if failure not in self.failures:  # a server failing each relisting: told once
                self.failures.append(failure)
            return False
        return True

    async def _serve_until_closed(self, conn: _Connection) -> None:
        """Hold the connection open; a server that offers prompts has them listed again
        each time they changed (one task more, for those servers only)."""
        from crow.mcp_prompts import offers_prompts, relisting

        if not offers_prompts(conn.client):
            await conn.closing.wait()
            return

        async def relist() -> None:
            if await self._list_prompts(conn, 30.0) and self.on_prompts_changed is not None:
                await self.on_prompts_changed()

        await relisting(conn.prompts_changed, conn.closing, relist)

    def prompts(self) -> list[tuple[str, Any]]:
        """(server, MCP prompt) of every connected server, servers in connection order."""
        return [(c.spec.name, p) for c in self._conns.values() if c.client is not None for p in c.prompts]

    async def get_prompt(self, server: str, name: str, arguments: dict[str, str]) -> Any:
        """`prompts/get` on `server`; CommandError when it cannot answer."""
        from crow.mcp_prompts import get_prompt

        conn = self._conns.get(server)
        client = conn.client if conn is not None else None
        timeout = conn.spec.timeout if conn is not None else 0.0
        return await get_prompt(client, server, name, arguments, timeout, _describe)

    def _index(self, conn: _Connection, tools: list[Any]) -> None:
        renamed: list[str] = []
        refused: list[str] = []
        for tool in tools:
            name = tool.name
            if not _MODEL_NAME.fullmatch(name):
                name = _first_free(_NAME_OK.sub("_", name)[:64] or "tool", self._routes, limit=64)
                refused.append(f"{tool.name} as {name}")
            elif name in self._routes:  # keep names unique: qualify the newcomer, never replace
                name = _first_free(_NAME_OK.sub("_", f"{conn.spec.name}_{tool.name}")[:60], self._routes)
                renamed.append(f"{tool.name} as {name}")
            self._routes[name] = (conn, tool.name)
            hints = tool.annotations
            read_only = self.trusted(name) and bool(hints and hints.read_only_hint)
            kind, title = declared_presentation(tool)
            schema = tool.input_schema or {"type": "object", "properties": {}}
            self._specs.append(ToolSpec(name, tool.description or "", schema, read_only, kind, title))
        if refused:
            self.failures.append(
                f"MCP server {conn.spec.name!r}: tool names model APIs refuse (they allow letters, "
                "digits, _ and -, up to 64) are offered to the model under other names: " + ", ".join(refused)
            )
        if renamed:
            self.failures.append(
                f"MCP server {conn.spec.name!r}: tool names already taken are offered to the model "
                f"under other names: {', '.join(renamed)}"
            )

    def specs(self) -> list[ToolSpec]:
        return list(self._specs)

    def servers(self) -> list[ServerState]:
        """Each server as it stands now (in the order connected), with the tools it offers."""
        found: list[ServerState] = []
        for name, conn in self._conns.items():
            if conn.error is not None:
                state = "failed"
            elif conn.client is not None:
                state = "connected"
            else:
                state = "stopped" if conn.ready.is_set() else "starting"
            tools = tuple((t, remote) for t, (c, remote) in self._routes.items() if c is conn)
            found.append(ServerState(name, conn.asked_as, conn.spec.transport, state, conn.error, tools))
        return found

    def has(self, name: str) -> bool:
        return name in self._routes

    def spec(self, name: str) -> ToolSpec | None:
        return next((s for s in self._specs if s.name == name), None)

    def kind(self, name: str) -> str:
        """The tool's kind as policy may rely on it: declared by a trusted server, else
        "other" (a server's claim to be an edit or the plan must not relax a question)."""
        spec = self.spec(name)
        return spec.kind if spec is not None and self.trusted(name) else "other"

    def trusted(self, name: str) -> bool:
        """Whether the tool's server is believed (crow's own, or marked trusted)."""
        route = self._routes.get(name)
        if route is None:
            return False
        spec = route[0].spec
        return spec.trusted if spec.trusted is not None else spec.transport == "inprocess"

    def server_of(self, name: str) -> str | None:
        route = self._routes.get(name)
        return route[0].spec.name if route else None

    async def call(self, call: ToolCall) -> ToolResult:
        route = self._routes.get(call.name)
        if route is None:
            return ToolResult(call.id, call.name, error=f"unknown tool {call.name!r}")
        conn, remote_name = route
        if conn.client is None:
            return ToolResult(call.id, call.name, error=f"the MCP server {conn.spec.name!r} is not running")
        spec = self.spec(call.name)
        schema = spec.parameters if spec is not None else {}
        if (wrong := check_arguments(call.name, call.args, schema)) is not None:
            return ToolResult(call.id, call.name, error=wrong)
        timeout = None if conn.spec.transport == "inprocess" else conn.spec.timeout
        try:
            result = await conn.client.call_tool(remote_name, dict(call.args), read_timeout_seconds=timeout)
        except Exception as exc:  # MCP and transport errors stop here
            return ToolResult(call.id, call.name, error=f"tool {call.name} failed: {_describe(exc)}")
        return to_tool_result(call, result, schema)

    async def aclose(self, grace: float = 5.0) -> None:
        """Stop every server; one still running after `grace` s is cancelled and awaited
        until its process is stopped (stdin closed, SIGTERM, SIGKILL), so none outlives crow."""
        for conn in self._conns.values():
            conn.closing.set()
        tasks = [c.task for c in self._conns.values() if c.task is not None]
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=grace)
            for conn in (c for c in self._conns.values() if c.task in pending):
                conn.cancel()
            if pending:
                _done, stuck = await asyncio.wait(pending, timeout=_STOP_AFTER_CANCEL)
                for task in stuck:
                    log.warning("MCP connection %s did not stop; abandoning it", task.get_name())
        for conn in self._conns.values():
            if conn.spec.on_close is not None:
                try:
                    await conn.spec.on_close()
                except Exception:
                    log.exception("closing the MCP server %s failed", conn.spec.name)
        self._conns.clear()
        self._routes.clear()
        self._specs.clear()


def to_tool_result(call: ToolCall, result: Any, schema: Mapping[str, Any] | None = None) -> ToolResult:
    """Text content is what the model reads, images it sees (each checked: one a provider
    refuses would fail every later request, so it becomes a note); structured content and
    _meta go to the editor. An error's text is worded for the model (`crow.tool_errors.for_model`)."""
    parts: list[str] = []
    shown: list[Image] = []
    over = 0  # images past what one result keeps (each is re-sent with every later request)
    for block in result.content or ():
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "image" and len(shown) == images.MAX_PER_PROMPT:
            over += 1
        elif kind == "image":
            try:
                shown.append(images.checked(block.mime_type, block.data))
            except ValueError as exc:
                parts.append(images.DROPPED.format(problem=exc))
        elif kind == "resource":
            resource = block.resource
            parts.append(getattr(resource, "text", None) or f"[resource {resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource {block.uri}]")
        else:
            parts.append(f"[{kind} content]")
    if over:
        parts.append(images.OVER_PER_RESULT.format(count=over, limit=images.MAX_PER_PROMPT))
    text = "\n".join(parts)
    meta: dict[str, Any] = {}
    if result.structured_content:
        meta["structured"] = result.structured_content
    if result.meta:
        meta.update({k: v for k, v in result.meta.items() if not k.startswith("io.modelcontextprotocol")})
    if result.is_error:
        error = for_model(call.name, text, schema)
        return ToolResult(call.id, call.name, error=error, meta=meta or None, images=tuple(shown))
    return ToolResult(call.id, call.name, output=text, meta=meta or None, images=tuple(shown))


@contextlib.asynccontextmanager
async def _open_client(spec: ServerSpec, env: Mapping[str, str] | None = None, on_message: Any = None):  # type: ignore[no-untyped-def]
    if spec.transport == "inprocess" and not needs_session(spec.server):
        yield DirectClient(spec.server)
        return
    from mcp import Client, StdioServerParameters

    if spec.transport == "inprocess":
        target: Any = spec.server
        mode = "auto"
    elif spec.transport == "stdio":
        from crow.environment import child_environment

        base = child_environment() if env is None else env
        target = StdioServerParameters(command=spec.command, args=list(spec.args), env={**base, **spec.env})
        mode = "legacy"  # the probe of "auto" can wait 10 s on servers that ignore it
    elif spec.transport == "sse":
        from mcp.client.sse import sse_client

        target = sse_client(spec.url, headers=dict(spec.headers))
        mode = "legacy"
    elif spec.transport == "http":
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        http = httpx2.AsyncClient(headers=dict(spec.headers), timeout=httpx2.Timeout(30, read=300))
        target = streamable_http_client(spec.url, http_client=http)
        mode = "legacy"
    else:
        raise ValueError(f"unknown MCP transport {spec.transport!r}")
    async with Client(target, mode=mode, message_handler=on_message) as client:
        yield client


async def _on_message(conn: _Connection, message: Any) -> None:
    """A server's notification: a prompts list change is listed again by the connection's
    task (never here: an MCP request from inside the receive loop would wait on itself)."""
    if type(message).__name__ == "PromptListChangedNotification":
        conn.prompts_changed.set()


def _first_free(name: str, taken: Mapping[str, Any], limit: int | None = None) -> str:
    """`name`, else `name_2`, `name_3`, ...: the first not in `taken` (each cut to end
    within `limit` characters, when given)."""
    n = 1
    candidate = name
    while candidate in taken:
        n += 1
        suffix = f"_{n}"
        candidate = (name[: limit - len(suffix)] if limit else name) + suffix
    return candidate


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return str(exc) or type(exc).__name__
