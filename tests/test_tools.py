"""ToolHub: in-process MCP servers reached directly and through an MCP session give the
model the same tools and the same results; failures become results, never exceptions;
name clashes are renamed and reported, never fatal."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations

from crow.inprocess import DirectClient
from crow.messages import ToolCall
from crow.tool_kinds import presented
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


def with_middleware(server: MCPServer) -> MCPServer:
    """A middleware of its own runs only inside an MCP session: the hub connects through one."""

    async def through(ctx: Any, call_next: Any) -> Any:
        return await call_next(ctx)

    server.middleware.append(through)
    return server


async def results(server: MCPServer) -> tuple[list[Any], list[Any], bool]:
    hub = ToolHub()
    await hub.connect([ServerSpec("sample", "inprocess", server=server)])
    try:
        direct = isinstance(hub._conns["sample"].client, DirectClient)
        return hub.specs(), [await hub.call(c) for c in CALLS], direct
    finally:
        await hub.aclose()


async def test_direct_calls_match_calls_through_an_mcp_session() -> None:
    direct_specs, direct, called_directly = await results(sample_server())
    session_specs, through, in_session = await results(with_middleware(sample_server()))
    # The hub decides: any plain in-process server (a plugin's too) is called directly.
    assert (called_directly, in_session) == (True, False)
    assert direct_specs == session_specs
    assert {s.name: s.read_only for s in direct_specs} == {
        "add": True,
        "refuse": False,
        "crash": False,
        "annotated": False,
    }
    assert [(r.output, r.error, r.meta) for r in direct] == [(r.output, r.error, r.meta) for r in through]
    ok, bad_args, refused, crashed, annotated, missing = direct
    assert ok.output == "5" and not ok.is_error
    assert bad_args.error == (
        "add was not run: its arguments are wrong.\n"
        "- `a`: input should be a valid integer, unable to parse string as an integer (got 'two')\n"
        'Send: {"a": integer, "b": integer}'
    )
    assert refused.error == "refused: no"
    assert crashed.error == "crash failed unexpectedly; the details are in the tool server's log"
    assert annotated.output == "done" and annotated.meta == {
        "structured": {"n": 1},
        "crow/diff": {"path": "a.txt"},
    }
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
        ServerSpec("one", "inprocess", server=sample_server()),
        ServerSpec("two", "inprocess", server=sample_server()),
        ServerSpec("broken", "stdio", command="/nonexistent/server"),
    ]
    await hub.connect(specs, connect_timeout=10)
    try:
        names = [s.name for s in hub.specs()]
        assert names.count("add") == 1 and "two_add" in names
        assert hub.server_of("two_add") == "two"
        assert (await hub.call(ToolCall("x", "two_add", {"a": 1, "b": 1}))).output == "2"
        assert hub.failures == [
            "MCP server 'broken' failed to start: [Errno 2] No such file or directory: '/nonexistent/server'",
            "MCP server 'two': tool names already taken are offered to the model under other names: "
            "add as two_add, refuse as two_refuse, crash as two_crash, annotated as two_annotated",
        ]
    finally:
        await hub.aclose()


def test_servers_called_directly_refuse_request_state() -> None:
    from mcp.server.request_state import InvalidRequestState

    from crow.inprocess import direct_call_state

    codec = direct_call_state().codec
    assert direct_call_state() is direct_call_state()  # one policy for every such server
    with pytest.raises(RuntimeError, match="in-process"):
        codec.seal(b"{}")
    with pytest.raises(InvalidRequestState):
        codec.unseal("forged")


async def test_a_taken_server_name_is_renamed_and_reported_not_fatal() -> None:
    """An editor's server named like crow's own (`filesystem`) used to raise in session
    preparation, failing every prompt."""
    hub = ToolHub()
    await hub.connect([ServerSpec("filesystem", "inprocess", server=sample_server())])
    await hub.connect([ServerSpec("filesystem", "inprocess", server=sample_server())])
    try:
        assert hub.failures[0] == (
            "MCP server 'filesystem': another server already has that name; it is connected as 'filesystem_2'"
        )
        assert hub.server_of("add") == "filesystem" and hub.server_of("filesystem_2_add") == "filesystem_2"
        assert (await hub.call(ToolCall("x", "filesystem_2_add", {"a": 1, "b": 2}))).output == "3"
    finally:
        await hub.aclose()


async def test_a_second_clash_after_renaming_never_replaces_a_route() -> None:
    first = sample_server()

    @first.tool()
    async def two_add(a: int, b: int) -> str:
        """Named like the qualified name of the next server's `add`."""
        return "first server"

    hub = ToolHub()
    await hub.connect(
        [ServerSpec("one", "inprocess", server=first), ServerSpec("two", "inprocess", server=sample_server())]
    )
    try:
        names = [s.name for s in hub.specs()]
        assert len(names) == len(set(names)), names
        assert (await hub.call(ToolCall("x", "two_add", {"a": 1, "b": 2}))).output == "first server"
        assert hub.server_of("two_add_2") == "two"
        assert (await hub.call(ToolCall("y", "two_add_2", {"a": 1, "b": 2}))).output == "3"
    finally:
        await hub.aclose()


async def test_kinds_and_titles_come_from_meta_and_annotations(tmp_path: Path) -> None:
    from crow.acp import view
    from mcp_servers.filesystem import build_server

    claims = MCPServer("claims")

    @claims.tool(meta={"crow": {"kind": "think", "title": "Plan {what}"}})
    async def plan(what: str) -> str:
        """Says it only updates a plan."""
        return what

    (tmp_path / "a.txt").write_text("a\n")
    hub = ToolHub()
    await hub.connect(
        [
            ServerSpec("filesystem", "inprocess", server=build_server(tmp_path)),
            ServerSpec("sample", "inprocess", server=sample_server(), trusted=False),  # as an editor's
            ServerSpec("claims", "inprocess", server=claims, trusted=False),
        ]
    )
    try:
        kinds = {s.name: s.kind for s in hub.specs()}
        assert [kinds[n] for n in ("read_file", "edit_file", "grep", "execute", "add", "crash", "plan")] == [
            "read", "edit", "search", "execute", "read", "other", "think",
        ]  # fmt: skip
        # Policy believes a kind only from a trusted server: a claim must not skip a question.
        assert (hub.kind("read_file"), hub.kind("plan"), hub.kind("add")) == ("read", "other", "other")
        glob = hub.spec("glob")
        assert view.tool_title(ToolCall("g", "glob", {"pattern": "*.py"}), glob) == "Find *.py"
        assert view.tool_title(ToolCall("g", "glob", {"pattern": "*.py", "path": "src"}), glob) == "Find *.py in src"
        assert view.tool_title(ToolCall("l", "ls", {}), hub.spec("ls")) == "List ."
        # A result remembers how its call was shown, for session/load's replay.
        call = ToolCall("r", "read_file", {"path": "a.txt"})
        result = presented(await hub.call(call), call, hub.spec("read_file"))
        assert (result.meta or {})["crow/tool"] == {"kind": "read", "title": "Read a.txt"}
        replayed = view.finished_update(call, result, tmp_path)
        assert (replayed.title, replayed.kind) == ("Read a.txt", "read")
    finally:
        await hub.aclose()


async def test_a_tool_name_no_model_api_accepts_is_offered_under_a_valid_one() -> None:
    """MCP allows `.` and up to 128 characters in a tool name; OpenAI and Anthropic refuse a
    request whose tool names are not `[a-zA-Z0-9_-]{1,64}`, so one such tool from an
    editor's server used to fail every prompt of the session."""
    server = MCPServer("editor")
    long_name = "get_" + "x" * 80

    async def dotted(a: int) -> str:
        return f"dotted {a}"

    async def long(a: int) -> str:
        return f"long {a}"

    server.add_tool(dotted, name="files.read")
    server.add_tool(long, name=long_name)
    hub = ToolHub()
    await hub.connect([ServerSpec("editor", "inprocess", server=server)])
    try:
        names = [s.name for s in hub.specs()]
        assert names == ["files_read", long_name[:64]]
        assert (await hub.call(ToolCall("x", "files_read", {"a": 1}))).output == "dotted 1"
        assert (await hub.call(ToolCall("y", long_name[:64], {"a": 2}))).output == "long 2"
        assert hub.failures == [
            "MCP server 'editor': tool names model APIs refuse (they allow letters, digits, _ and -, "
            f"up to 64) are offered to the model under other names: files.read as files_read, "
            f"{long_name} as {long_name[:64]}"
        ]
    finally:
        await hub.aclose()


# A stdio MCP server that starts (answers initialize) but never answers tools/list.
_MUTE_SERVER = """
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("method") == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "mute", "version": "1"}}
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
"""


async def test_a_server_that_never_lists_its_tools_is_reported_not_waited_for(tmp_path: Path) -> None:
    """The connect timeout covered starting only: a server that never answered tools/list
    held the session's preparation, and so every prompt of the session, forever."""
    import sys

    import anyio

    script = tmp_path / "mute.py"
    script.write_text(_MUTE_SERVER)
    hub = ToolHub()
    try:
        with anyio.fail_after(15):
            await hub.connect(
                [
                    ServerSpec("one", "inprocess", server=sample_server()),
                    ServerSpec("mute", "stdio", command=sys.executable, args=[str(script)]),
                ],
                connect_timeout=2,
            )
        assert hub.failures == ["MCP server 'mute' did not list its tools within 2 s"]
        assert hub.has("add") and (await hub.call(ToolCall("x", "add", {"a": 1, "b": 2}))).output == "3"
    finally:
        await hub.aclose()


async def test_aclose_waits_for_a_server_that_hangs_on_shutdown(tmp_path: Path) -> None:
    # A server still running after the grace period got a bare task.cancel(), which broke
    # into the MCP client's shielded shutdown: aclose returned at once and the process lived
    # on (an orphan once crow's event loop ended), the task stuck draining its stdout.
    import os
    import signal
    import sys
    import time

    pid_file = tmp_path / "pid"
    script = Path(__file__).parent / "support" / "stubborn_mcp.py"
    hub = ToolHub()
    await hub.connect([ServerSpec("stubborn", "stdio", command=sys.executable, args=[str(script), str(pid_file)])])
    assert hub.failures == [] and (await hub.call(ToolCall("p", "ping", {}))).output == "pong"
    pid = int(pid_file.read_text())
    started = time.monotonic()
    try:
        await hub.aclose(grace=0.5)  # shorter than its shutdown: stdin closed, SIGTERM, SIGKILL
        took = time.monotonic() - started
        with pytest.raises(ProcessLookupError):  # killed and reaped, not a zombie
            os.kill(pid, 0)
        assert took < 10, took
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # the test leaves no orphan even when it fails


async def test_on_close_is_awaited_once_when_the_hub_closes_and_its_failure_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    closed: list[str] = []

    async def close_one() -> None:
        closed.append("one")

    async def close_broken() -> None:
        closed.append("broken")
        raise RuntimeError("engine went away")

    hub = ToolHub()
    await hub.connect(
        [
            ServerSpec("one", "inprocess", server=sample_server(), on_close=close_one),
            ServerSpec("two", "inprocess", server=sample_server(), on_close=close_broken),
        ]
    )
    assert closed == []
    await hub.aclose()
    await hub.aclose()  # closed once
    assert sorted(closed) == ["broken", "one"]
    assert "engine went away" in caplog.text
