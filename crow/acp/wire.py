"""The stdio wire, hardened: a line that is valid JSON but not an object gets a JSON-RPC
error instead of reaching the SDK, whose dispatcher assumes an object and whose receive
loop would die on `[]`, `123` or `"text"` (and take `null` for the end of input)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from acp._transport import NdjsonTransport
from acp.core import DEFAULT_STDIO_BUFFER_LIMIT_BYTES
from acp.stdio import stdio_streams
from acp.task import MessageSender, TaskSupervisor
from acp.task.sender import _PendingSend

log = logging.getLogger("crow.acp")

NOT_AN_OBJECT = {
    "jsonrpc": "2.0",
    "id": None,
    "error": {"code": -32600, "message": "Invalid Request: expected a JSON object"},
}


MAX_METHOD = 256  # no ACP method name comes close


def _valid_id(rid: Any) -> Any:
    return rid if isinstance(rid, str | int) and not isinstance(rid, bool) else None


class ObjectsOnlyTransport(NdjsonTransport):
    async def send_notifications(self, method: str, params_json: list[bytes]) -> None:
        """Queue many notifications (params already serialized) as one write, in order with
        everything else the sender sends: a 5,000-message replay then costs one round trip
        to the writer, not 5,000."""
        head = b'{"jsonrpc":"2.0","method":' + json.dumps(method).encode() + b',"params":'
        data = b"".join(head + params + b"}\n" for params in params_json)
        future = asyncio.get_running_loop().create_future()
        await self._sender._queue.put(_PendingSend(data, future))
        await future

    async def receive(self) -> dict[str, Any] | None:
        while True:
            line = await self._read_line()
            if not line:
                return None  # end of input
            line = line.strip()
            if not line:
                continue
            try:
                message = json.loads(line)
            except (ValueError, RecursionError):  # garbage, or nested deeper than json can go
                log.warning("ignored a line that is not JSON (%d bytes)", len(line))
                await self.send({**NOT_AN_OBJECT, "error": {"code": -32700, "message": "Parse error"}})
                continue
            if not isinstance(message, dict):
                await self.send(NOT_AN_OBJECT)
                continue
            method = message.get("method")
            if method is not None and (not isinstance(method, str) or len(method) > MAX_METHOD):
                # Answered here: the SDK would echo a megabyte "method" back in its error.
                if "id" in message:
                    await self.send(
                        {
                            "jsonrpc": "2.0",
                            "id": _valid_id(message["id"]),
                            "error": {"code": -32601, "message": "Method not found"},
                        }
                    )
                continue
            return message


async def stdio_transport() -> tuple[ObjectsOnlyTransport, TaskSupervisor]:
    reader, writer = await stdio_streams(limit=DEFAULT_STDIO_BUFFER_LIMIT_BYTES)
    supervisor = TaskSupervisor(source="crow.stdio")
    return ObjectsOnlyTransport(reader, MessageSender(writer, supervisor)), supervisor
