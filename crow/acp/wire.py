"""crow's wires (stdio here, WebSocket in `crow.acp.ws`), and the only module that touches
the ACP SDK's internals.

What `Wire` adds to the SDK's transports (`StdioWire`: newline-delimited JSON on
stdin/stdout; `crow.acp.ws.WsWire`: one message per WebSocket text frame):

- a line (a frame) that is valid JSON but not an object gets a JSON-RPC error instead of reaching the
  SDK, whose dispatcher assumes an object and whose receive loop would die on `[]`, `123`
  or `"text"` (and take `null` for the end of input);
- an answer to one of crow's requests that the SDK could not take (an id it cannot hash,
  an `error` that is not an object) is dropped or mended: its receive loop would die on it;
- at most `MAX_UNANSWERED` requests of a client await their answers: the next is answered
  busy at once, and as that write waits on the client too, crow stops reading from it;
- `notify(method, params)`: many notifications, already serialized, as one write (stdio)
  or one frame each (WebSocket), in order with everything else;
- `after_response(callback)`: run once the answer to the request being handled is written.
  Clients drop `session/update`s for a session they have not been told about yet, so what
  follows `session/new` must follow its response on the wire, not merely be sent later;
- once the wire is closed (the client hung up), `notify` raises `ConnectionError` at once:
  the SDK's sender never settles a write queued after its close (nor does `websockets`
  before its close timeout), and a cancelled turn settling its history (shielded, for up
  to `crow.loop.CANCEL_GRACE`) would wait on it.

SDK internals used (checked against `CHECKED_SDK_VERSION` by tests/test_acp_sdk.py, which
fails on any other version: re-check each of these, then update the constant):

1. `acp._transport.NdjsonTransport`: subclassed; its `__init__(reader, sender)`,
   `_read_line()`, `_sender` and `close()` (which `Connection.close` calls).
2. `acp.task.sender._PendingSend(payload, future)` put on `MessageSender._queue`: the
   sender's writer loop takes items in order and resolves the future once written.
3. `acp.connection.Connection`: its receive loop creates each request's task right after
   `receive()` returns (so the task inherits the context `receive` set: the request id),
   and that task answers through `transport.send()`.
4. `acp.core.DEFAULT_STDIO_BUFFER_LIMIT_BYTES`, `acp.stdio.stdio_streams`,
   `acp.task.MessageSender`/`TaskSupervisor` (not exported by `acp`).
5. `AgentSideConnection._conn._handler`: the `acp.router.MessageRouter` (its public
   `route_request`/`route_notification` add the schema-1.25 routes of `crow.acp.protocol`),
   called as `handler(method, params, is_notification)`; `connect` wraps it so that a
   request can be cancelled by its id (`$/cancel_request`).
6. `AgentSideConnection._conn`'s `send_request`, which takes `_next_request_id` as its
   request's id before its first await, and `send_notification`: `request` sends
   `$/cancel_request` for a request of crow's its caller stopped waiting for.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import acp
from acp import RequestError
from acp._transport import NdjsonTransport
from acp.core import DEFAULT_STDIO_BUFFER_LIMIT_BYTES
from acp.stdio import stdio_streams
from acp.task import MessageSender, TaskSupervisor
from acp.task.sender import _PendingSend
from pydantic import ValidationError

from crow.acp import protocol

log = logging.getLogger("crow.acp")

CHECKED_SDK_VERSION = "0.12.1"  # agent-client-protocol, as checked against the list above

REQUEST_CANCELLED = -32800  # JSON-RPC/ACP: the request was cancelled ($/cancel_request)

NOT_AN_OBJECT = {
    "jsonrpc": "2.0",
    "id": None,
    "error": {"code": -32600, "message": "Invalid Request: expected a JSON object"},
}
MAX_MESSAGE = DEFAULT_STDIO_BUFFER_LIMIT_BYTES  # one stdio line, one WebSocket frame
MAX_METHOD = 256  # no ACP method name comes close
MAX_UNANSWERED = 1000  # requests of one client read and not answered yet (prompts, questions, ...)
TOO_MANY = -32001  # crow's busy error (crow.acp.sessions.BUSY)
CANCEL_NOTICE_GRACE = 2.0  # seconds to write a `$/cancel_request` (a closed wire never settles)

AfterResponse = Callable[[], Awaitable[None]]
# The id of the request whose handler runs in this context (set by `receive`, inherited by
# the task the SDK creates for that request).
_request_id: ContextVar[str | int | None] = ContextVar("crow.acp.request_id", default=None)


def _valid_id(rid: Any) -> Any:
    return rid if isinstance(rid, str | int) and not isinstance(rid, bool) else None


class Wire:
    """What crow's wires share: the JSON-RPC checks on what comes in, `notify`,
    `after_response`, requests cancellable by id, and the close semantics. A wire writes one
    message with `_write` and many notifications with `_write_notifications`."""

    def __init__(self) -> None:
        self._after: dict[str | int, list[AfterResponse]] = {}
        self._closed = False
        self._inflight: dict[str | int, asyncio.Task[Any]] = {}
        self._cancelled: set[str | int] = set()
        self._unanswered: dict[str | int | None, int] = {}  # request id -> how many await an answer
        self._unanswered_total = 0

    @staticmethod
    def request_id() -> str | int | None:
        """The id of the request whose handler is running (None outside one)."""
        return _request_id.get()

    def cancel_request(self, rid: str | int) -> bool:
        """Cancel the handler of request `rid` (it answers -32800); False if none runs."""
        task = self._inflight.get(rid)
        if task is None or task.done():
            return False
        self._cancelled.add(rid)
        task.cancel()
        return True

    def cancellable(self, handler: Any) -> Any:
        """The SDK's dispatcher, wrapped: each request's task is known by its id."""

        async def dispatch(method: str, params: Any, is_notification: bool) -> Any:
            if is_notification:
                try:
                    return await handler(method, params, True)
                except (RequestError, ValidationError) as exc:
                    # No answer is due; the SDK would log a traceback for each, at ERROR.
                    log.warning("ignored the notification %.100s: %.200s", method, exc)
                    return None
            rid = _request_id.get()
            if rid is None:
                return await handler(method, params, is_notification)
            task = asyncio.current_task()
            assert task is not None
            self._inflight[rid] = task
            try:
                return await handler(method, params, is_notification)
            except ConnectionError:
                if not self.gone():  # another connection's (an MCP server's, say): a failure
                    raise
                # The client hung up while this request wrote to it (a long replay): nobody
                # to answer, and the SDK would log a traceback for it.
                log.debug("%.100s ended: the client has hung up", method)
                return None
            except asyncio.CancelledError:
                if rid not in self._cancelled:
                    raise
                task.uncancel()
                raise RequestError(REQUEST_CANCELLED, "Request cancelled") from None
            finally:
                self._cancelled.discard(rid)
                if self._inflight.get(rid) is task:
                    del self._inflight[rid]

        return dispatch

    def after_response(self, callback: AfterResponse) -> None:
        """Run `callback` once the (successful) answer to the request being handled has been
        written, in the task that wrote it. Called from a request handler."""
        rid = _request_id.get()
        if rid is None:
            raise RuntimeError("after_response() is for request handlers")
        self._after.setdefault(rid, []).append(callback)

    async def send(self, message: dict[str, Any]) -> None:
        answered = _valid_id(message.get("id")) if "method" not in message else None
        callbacks = self._after.pop(answered, None) if answered is not None else None
        try:
            await self._write(message)
        finally:  # counted until written: a task waiting to write its answer holds its memory
            if "method" not in message and (key := _valid_id(message.get("id"))) in self._unanswered:
                self._unanswered_total -= 1
                if (left := self._unanswered.pop(key) - 1) > 0:
                    self._unanswered[key] = left
        if callbacks and "result" in message:
            for callback in callbacks:
                try:
                    await callback()
                except Exception:  # the answer is out; a failed follow-up is only logged
                    log.exception("after-response callback failed")

    def gone(self) -> bool:
        """Whether the client has hung up."""
        return self._closed

    async def notify(self, method: str, params_json: list[bytes]) -> None:
        """Send many notifications (params already serialized) in order with everything else
        the wire sends, as one write where the wire can: a 5,000-message replay then costs
        one round trip to the writer, not 5,000."""
        if self._closed:
            raise ConnectionError("the client has hung up")
        head = b'{"jsonrpc":"2.0","method":' + json.dumps(method).encode() + b',"params":'
        await self._write_notifications([head + params + b"}" for params in params_json])

    async def _write(self, message: dict[str, Any]) -> None:
        raise NotImplementedError

    async def _write_notifications(self, messages: list[bytes]) -> None:
        raise NotImplementedError

    async def _checked(self, data: str | bytes) -> dict[str, Any] | None:
        """The message in `data` (one line, one frame), its request id made the context's;
        None when it was garbage, answered here with a JSON-RPC error."""
        try:
            message = json.loads(data)
        except (ValueError, RecursionError):  # garbage, or nested deeper than json can go
            log.warning("ignored a message that is not JSON (%d bytes)", len(data))
            await self.send({**NOT_AN_OBJECT, "error": {"code": -32700, "message": "Parse error"}})
            return None
        if not isinstance(message, dict):
            await self.send(NOT_AN_OBJECT)
            return None
        method = message.get("method")
        if method is None and "id" in message:
            return self._answer_checked(message)
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
            return None
        if method is not None and "id" in message:
            rid = _valid_id(message["id"])
            if self._unanswered_total >= MAX_UNANSWERED:
                # Refused at once: each request read is a task until its answer is written,
                # and a client that sends without reading the answers would grow crow's
                # memory without bound (its reads then wait on this answer's write).
                error = {"code": TOO_MANY, "message": f"busy: {MAX_UNANSWERED} requests await their answers"}
                await self._write({"jsonrpc": "2.0", "id": rid, "error": error})
                return None
            self._unanswered[rid] = self._unanswered.get(rid, 0) + 1
            self._unanswered_total += 1
        _request_id.set(_valid_id(message.get("id")) if method is not None else None)
        return message

    @staticmethod
    def _answer_checked(message: dict[str, Any]) -> dict[str, Any] | None:
        """An answer to one of crow's requests, in a shape the SDK can take: its receive loop
        dies (ending the connection, over stdio crow) on an id it cannot hash while a request
        of crow's waits, or on an `error` that is not an object."""
        _request_id.set(None)
        if _valid_id(message["id"]) is None:
            log.warning("ignored an answer whose id no request of crow's has: %.100r", message["id"])
            return None
        error = message.get("error")
        if error is not None and not isinstance(error, dict):
            return {**message, "error": {"code": -32603, "message": str(error)[:1000]}}
        return message


class StdioWire(Wire, NdjsonTransport):
    """Newline-delimited JSON on the process's stdin/stdout, written by the SDK's sender."""

    def __init__(self, reader: asyncio.StreamReader, sender: MessageSender) -> None:
        NdjsonTransport.__init__(self, reader, sender)
        Wire.__init__(self)

    async def _write(self, message: dict[str, Any]) -> None:
        await NdjsonTransport.send(self, message)

    async def _write_notifications(self, messages: list[bytes]) -> None:
        future = asyncio.get_running_loop().create_future()
        await self._sender._queue.put(_PendingSend(b"".join(m + b"\n" for m in messages), future))
        await future

    async def close(self) -> None:
        self._closed = True  # what was queued before is still written; nothing after
        await NdjsonTransport.close(self)

    async def receive(self) -> dict[str, Any] | None:
        while True:
            line = await self._read_line()
            if not line:
                return None  # end of input
            line = line.strip()
            if line and (message := await self._checked(line)) is not None:
                return message


async def request(conn: acp.AgentSideConnection, method: str, params: dict[str, Any]) -> Any:
    """A request of crow's to the client, its raw result; `acp.RequestError` for an error
    answer. If the caller is cancelled while it waits (a cancelled turn, a timeout), the
    client is told with `$/cancel_request`, so it can take the question down: the SDK's
    `send_request` only forgets it."""
    inner = conn._conn
    rid = inner._next_request_id  # the id send_request gives it (taken before it awaits)
    try:
        return await inner.send_request(method, params)
    except asyncio.CancelledError:
        import anyio

        if getattr(inner._transport, "_closed", False):  # nobody left to tell
            raise
        with anyio.move_on_after(CANCEL_NOTICE_GRACE, shield=True):
            try:
                await inner.send_notification("$/cancel_request", {"requestId": rid})
            except Exception:  # the client has gone: nothing is waiting for the answer
                log.debug("$/cancel_request for %s failed", rid, exc_info=True)
        raise


def connect(server: Any, wire: Wire) -> acp.AgentSideConnection:
    """An SDK connection serving `server` on `wire`, with the schema-1.25 routes the SDK lacks
    (`crow.acp.protocol.ROUTES`) and requests cancellable by id."""
    conn = acp.AgentSideConnection(server, wire, listening=False, use_unstable_protocol=True)
    router = conn._conn._handler
    for method, (model, attr, kind) in protocol.ROUTES.items():
        if kind == "request":
            router.route_request(method, model, server, attr)
        else:
            router.route_notification(method, model, server, attr)
    conn._conn._handler = wire.cancellable(router)
    return conn


async def stdio_transport() -> tuple[StdioWire, TaskSupervisor]:
    """The wire on this process's stdin/stdout, and the supervisor of its writer task."""
    reader, writer = await stdio_streams(limit=MAX_MESSAGE)
    return wire_on(reader, writer)


def wire_on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[StdioWire, TaskSupervisor]:
    supervisor = TaskSupervisor(source="crow.stdio")
    return StdioWire(reader, MessageSender(writer, supervisor)), supervisor
