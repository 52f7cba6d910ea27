"""The ACP SDK internals crow relies on, all in crow/acp/wire.py, checked against the one SDK
version they were read from. On an SDK upgrade these fail on purpose: re-read each internal
listed in crow/acp/wire.py's docstring in the new SDK, run tests/test_acp_wire.py and the
e2e tests, then update `CHECKED_SDK_VERSION`."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import importlib.metadata
import inspect
from pathlib import Path

import pytest

from crow.acp import wire

ROOT = Path(__file__).resolve().parents[1]
RECHECK = "crow/acp/wire.py uses ACP SDK internals: re-check each one its docstring lists"
PUBLIC = {"acp", "acp.schema", "acp.helpers"}  # what the rest of crow may import


def test_the_sdk_is_the_version_the_internals_were_checked_against() -> None:
    installed = importlib.metadata.version("agent-client-protocol")
    assert installed == wire.CHECKED_SDK_VERSION, (
        f"agent-client-protocol {installed} is installed; {RECHECK} against it, then set "
        f"CHECKED_SDK_VERSION = {installed!r}"
    )


def test_each_private_name_is_there_with_the_shape_crow_uses() -> None:
    from acp._transport import NdjsonTransport
    from acp.connection import Connection
    from acp.core import DEFAULT_STDIO_BUFFER_LIMIT_BYTES
    from acp.stdio import stdio_streams
    from acp.task import MessageSender, TaskSupervisor
    from acp.task.sender import _PendingSend

    def params(fn: object) -> list[str]:
        return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]

    assert params(NdjsonTransport.__init__)[:3] == ["self", "reader", "sender"], RECHECK
    assert params(NdjsonTransport.send) == ["self", "message"], RECHECK
    assert inspect.iscoroutinefunction(NdjsonTransport._read_line), RECHECK
    assert [f.name for f in dataclasses.fields(_PendingSend)] == ["payload", "future"], RECHECK
    assert params(MessageSender.__init__) == ["self", "writer", "supervisor"], RECHECK
    assert "source" in params(TaskSupervisor.__init__), RECHECK
    assert "limit" in params(stdio_streams) and isinstance(DEFAULT_STDIO_BUFFER_LIMIT_BYTES, int), RECHECK
    # the request id travels from receive() to the request's task in a context variable
    assert "self._process_message(message)" in inspect.getsource(Connection._receive_loop), RECHECK
    assert "self._transport.send(payload)" in inspect.getsource(Connection._run_request), RECHECK


@pytest.mark.anyio
async def test_the_sender_queue_is_where_the_wire_puts_its_writes() -> None:
    from acp.task import MessageSender, TaskSupervisor

    written: list[bytes] = []

    class Writer:
        def write(self, data: bytes) -> None:
            written.append(data)

        async def drain(self) -> None:
            pass

    supervisor = TaskSupervisor(source="test")
    sender = MessageSender(Writer(), supervisor)  # type: ignore[arg-type]
    line = wire.StdioWire(asyncio.StreamReader(), sender)
    assert isinstance(line._sender._queue, asyncio.Queue), RECHECK
    await line.notify("session/update", [b'{"a":1}', b'{"b":2}'])
    assert written == [
        b'{"jsonrpc":"2.0","method":"session/update","params":{"a":1}}\n'
        b'{"jsonrpc":"2.0","method":"session/update","params":{"b":2}}\n'
    ]
    await sender.close()
    await supervisor.shutdown()


def _acp_uses(path: Path) -> list[str]:
    """What a module imports from the SDK beyond its public modules, or private names."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "acp":
            if node.module not in PUBLIC or any(a.name.startswith("_") for a in node.names):
                found.append(f"from {node.module} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.startswith("acp.")]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "acp":
            if node.attr.startswith("_"):
                found.append(f"acp.{node.attr}")
    return found


@pytest.mark.parametrize("package", ["crow", "builtin_hooks", "mcp_servers"])
def test_no_other_module_reaches_into_the_sdk(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): uses
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != ROOT / "crow/acp/wire.py" and (uses := _acp_uses(path))
    }
    assert offenders == {}, "SDK internals belong in crow/acp/wire.py only"
