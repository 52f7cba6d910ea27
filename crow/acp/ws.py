"""ACP over WebSocket: `crow serve --listen ws://HOST:PORT` (or `wss://` with a certificate).

One JSON-RPC message per text frame, what the ACP SDK's `acp.ws.create_websocket_stream`
client speaks. Every connection is one ACP client with its own `AcpServer`, all sharing the
process's one `Agent`; a session is served by the connection that opened it (busy for the
others) until that connection closes it or ends, which cancels its turns and closes its
sessions. The opening handshake must carry `Authorization: Bearer TOKEN`, checked before
any ACP message is read: a wrong or missing token gets HTTP 401.

Limits, as the `websockets` library applies them: a frame over `MAX_FRAME` (the stdio line
limit) closes its connection with 1009; at most `FRAMES_QUEUED` received frames wait to be
read; a write waits while more than `WRITE_LIMIT` bytes are buffered (a slow client slows
its turn). Keepalive pings find a peer that has gone without a word; `_Connection` drops one
that stopped reading, which the pings cannot (they wait behind the same full buffer). At
most `max_connections` clients are served at once: one more is told 503 at its handshake
(after its token is checked), so a client reconnecting in a loop cannot exhaust memory; and
at most as many sockets again may be in their handshake (`_Connection`). Compression
(permessage-deflate) is declined: see docs/service.md.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import signal
import ssl
import stat
import sys
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

from websockets.asyncio.server import Request, Response, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from crow.acp.coalesce import CoalescingTransport
from crow.acp.owners import Owners
from crow.acp.server import AcpServer, until_hang_up_or_signal
from crow.acp.wire import MAX_MESSAGE, NOT_AN_OBJECT, Wire, connect
from crow.agent import Agent
from crow.errors import ConfigError

log = logging.getLogger("crow.acp.ws")

TOKEN_VARIABLE = "CROW_SERVER_TOKEN"
MAX_FRAME = MAX_MESSAGE  # what one stdio line may hold
FRAMES_QUEUED = 4  # received frames held unread: at most 4 x MAX_FRAME per connection
WRITE_LIMIT = 2**16  # bytes buffered for a client before a write waits
PING_INTERVAL = 20.0  # seconds between keepalive pings, and to wait for each pong
MAX_CONNECTIONS = 100  # clients served at once (--max-connections); the next ones get 503
NOT_TEXT = "Invalid Request: expected a text frame (one JSON-RPC message each)"


@dataclass(frozen=True)
class Listen:
    """Where `--listen` serves: ws:// or wss:// (with the certificate and its key)."""

    scheme: str
    host: str
    port: int
    cert: str | None = None
    key: str | None = None

    def url(self, port: int) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{port}"

    def tls(self) -> ssl.SSLContext | None:
        if self.scheme != "wss":
            return None
        assert self.cert and self.key  # listen_address requires both
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"--tls-cert/--tls-key: cannot use {self.cert} with {self.key}: {exc}") from exc
        return context


def listen_address(url: str, tls_cert: str | None = None, tls_key: str | None = None) -> Listen:
    """`--listen URL` checked: ws://HOST:PORT, or wss://HOST:PORT with both TLS files."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"--listen {url}: {exc}") from exc
    if parts.scheme not in ("ws", "wss"):
        raise ConfigError(
            f"--listen {url}: only ws:// and wss:// are served (ACP over WebSocket); Streamable HTTP is not"
        )
    if not parts.hostname or port is None or parts.path not in ("", "/") or parts.query:
        raise ConfigError(f"--listen {url}: give it as {parts.scheme}://HOST:PORT (PORT 0: any free port)")
    if parts.scheme == "wss" and not (tls_cert and tls_key):
        raise ConfigError(f"--listen {url}: wss:// needs --tls-cert FILE and --tls-key FILE")
    if parts.scheme == "ws" and (tls_cert or tls_key):
        raise ConfigError("--tls-cert and --tls-key go with --listen wss://HOST:PORT")
    return Listen(parts.scheme, parts.hostname, port, tls_cert, tls_key)


def server_token(token_file: str | None) -> str:
    """The token clients must send: `--token-file PATH` (readable by its owner only, as ssh
    wants of a key), else `CROW_SERVER_TOKEN`. The variable is then removed from crow's
    environment, so that no process crow starts can inherit it."""
    from_env = os.environ.pop(TOKEN_VARIABLE, "").strip()
    if token_file is None:
        if not from_env:
            raise ConfigError(
                f"--listen needs a token for clients to send (Authorization: Bearer TOKEN):"
                f" set {TOKEN_VARIABLE} or give --token-file PATH"
            )
        return _sendable(from_env, TOKEN_VARIABLE)
    path = Path(token_file)
    try:
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                f"--token-file {path}: permissions {stat.S_IMODE(mode):04o} are too open; it must"
                f" be readable by its owner only (chmod 600 {path})"
            )
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--token-file {path}: {exc}") from exc
    if not token:
        raise ConfigError(f"--token-file {path} is empty")
    return _sendable(token, f"--token-file {path}")


def _sendable(token: str, source: str) -> str:
    """A token a client can send: HTTP headers are read as ISO-8859-1 bytes, so one with
    other characters would be refused to every client, with nothing said."""
    if not (token.isascii() and token.isprintable()):
        raise ConfigError(f"{source}: the token must be printable ASCII (it is sent in an HTTP header)")
    return token


def _authorize(token: str, served: set[ServerConnection], limit: int) -> Any:
    """`process_request`: the handshake goes on only with `Authorization: Bearer TOKEN`, and
    only while fewer than `limit` clients are `served` (told only to a client with the token)."""
    expected = token.encode()

    def check(connection: ServerConnection, request: Request) -> Response | None:
        given = request.headers.get_all("Authorization")
        scheme, _, value = given[0].partition(" ") if len(given) == 1 else ("", "", "")
        if not (scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), expected)):
            log.info("refused a connection from %s: no valid token", connection.remote_address)
            response = connection.respond(
                HTTPStatus.UNAUTHORIZED, "a valid token is required: Authorization: Bearer TOKEN\n"
            )
            response.headers["WWW-Authenticate"] = "Bearer"
            return response
        if len(served) >= limit:
            return _full(connection, limit)
        return None

    return check


def _full(connection: ServerConnection, limit: int) -> Response:
    log.warning("refused a connection from %s: %d clients served already", connection.remote_address, limit)
    why = f"crow serves {limit} clients already (--max-connections); try again later\n"
    response = connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, why)
    response.headers["Retry-After"] = "10"
    return response


class _Connection(ServerConnection):
    """Dropped when what crow has to send it stays over the write limit (the transport's high
    water mark) for two ping periods without a pause: a client that stopped reading would
    otherwise hold its turn (and its session) forever, since the keepalive ping waits
    behind the full buffer. A client reading steadily but slower than its turn writes, for
    that long, is dropped too: the transport cannot tell the two apart.

    One opened while `limit` are open already (served, or still in their handshake: those
    hold a socket for up to 10 s without a token) is closed at once, so that sockets opened
    by anyone who can reach the port cannot use up crow's file descriptors."""

    _stalled: asyncio.TimerHandle | None = None

    def __init__(self, *args: Any, opened: set[ServerConnection], limit: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._opened, self._limit = opened, limit

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Typed as the base class only: the writes of one loop iteration go out as one.
        coalesced = CoalescingTransport(cast(asyncio.Transport, transport), WRITE_LIMIT)
        super().connection_made(cast(asyncio.Transport, coalesced))
        if len(self._opened) >= self._limit:
            log.debug("closed a connection at once: %d are open", len(self._opened))
            transport.abort()
            return
        self._opened.add(self)

    def pause_writing(self) -> None:
        super().pause_writing()
        stall = (self.ping_interval or PING_INTERVAL) + (self.ping_timeout or PING_INTERVAL)
        self._stalled = self.loop.call_later(stall, self._drop, stall)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._opened.discard(self)
        if self._stalled is not None:
            self._stalled.cancel()
        super().connection_lost(exc)

    def _drop(self, stall: float) -> None:
        log.warning("%s read nothing for %.0f s: its connection is dropped", self.remote_address, stall)
        self.transport.abort()


class WsWire(Wire):
    """One JSON-RPC message per text frame on a `websockets` connection. Each write goes
    through the library's flow control: it waits while the connection's buffer is over its
    write limit, so a client that reads slowly slows the turn down instead of growing
    crow's memory."""

    def __init__(self, socket: ServerConnection) -> None:
        super().__init__()
        self._socket = socket

    async def _write(self, message: dict[str, Any]) -> None:
        try:
            await self._frame(json.dumps(message, separators=(",", ":")))
        except ConnectionError:
            if "method" in message:
                raise
            # An answer nobody can read any more: the SDK would log its failure as a crash.
            log.debug("dropped an answer to a client that has gone")

    async def _write_notifications(self, messages: list[bytes]) -> None:
        for message in messages:
            await self._frame(message)

    def gone(self) -> bool:
        return self._closed or self._socket.state is not State.OPEN

    async def _frame(self, data: str | bytes) -> None:
        # At once when closed: `websockets` waits for its close timeout first.
        if self._closed or self._socket.state is not State.OPEN:
            raise ConnectionError("the client has hung up")
        try:
            await self._socket.send(data, text=True)
        except ConnectionClosed as exc:
            self._closed = True
            raise ConnectionError("the client has hung up") from exc

    async def close(self) -> None:
        self._closed = True
        await self._socket.close()

    async def receive(self) -> dict[str, Any] | None:
        while True:
            try:
                frame = await self._socket.recv()
            except ConnectionClosed:  # the client left, or the library closed it (1009, ...)
                self._closed = True
                return None
            if isinstance(frame, bytes):
                await self.send({**NOT_AN_OBJECT, "error": {"code": -32600, "message": NOT_TEXT}})
            elif (message := await self._checked(frame)) is not None:
                return message


async def _serve_connection(agent: Agent, owners: Owners, socket: ServerConnection) -> None:
    server = AcpServer(agent, owners)
    server.wire = wire = WsWire(socket)
    conn = connect(server, wire)
    log.info("client connected from %s", socket.remote_address)
    try:
        await conn.listen()
    finally:
        await asyncio.shield(_ended(conn, server))
        log.info("client %s gone", socket.remote_address)


async def _ended(conn: Any, server: AcpServer) -> None:
    await conn.close()  # cancels its requests: a running turn settles its history
    await server.close_sessions()


async def serve_websocket(
    agent: Agent,
    listen: Listen,
    token: str,
    ping_interval: float = PING_INTERVAL,
    max_connections: int = MAX_CONNECTIONS,
) -> None:
    """Serve ACP on `listen` until SIGTERM or SIGINT; then every connection is closed as if
    its client had gone, and the agent after them."""
    tls = listen.tls()
    owners = Owners()
    served: set[ServerConnection] = set()
    opened: set[ServerConnection] = set()

    def connection(*args: Any, **kwargs: Any) -> _Connection:  # the served, and as many opening
        return _Connection(*args, opened=opened, limit=2 * max_connections, **kwargs)

    async def handler(socket: ServerConnection) -> None:
        if len(served) >= max_connections:  # handshakes checked at once all passed the check
            await socket.close(1013, "too many clients; try again later")
            return
        served.add(socket)
        try:
            await _serve_connection(agent, owners, socket)
        finally:
            served.discard(socket)

    async with agent:
        try:
            server = await serve(
                handler,
                listen.host,
                listen.port,
                ssl=tls,
                process_request=_authorize(token, served, max_connections),
                create_connection=connection,
                max_size=MAX_FRAME,
                compression=None,
                max_queue=FRAMES_QUEUED,
                write_limit=WRITE_LIMIT,
                ping_interval=ping_interval,
                ping_timeout=ping_interval,
            )
        except OSError as exc:  # the port is taken, the host is not this machine's, ...
            raise ConfigError(f"--listen {listen.url(listen.port)}: {exc.strerror or exc}") from exc
        try:
            port = next(iter(server.sockets)).getsockname()[1]
            print(f"crow: listening on {listen.url(port)}", file=sys.stderr, flush=True)
            await until_hang_up_or_signal(asyncio.Event().wait(), (signal.SIGTERM, signal.SIGINT))
        finally:
            server.close()  # each connection closed (1001) and ended as if its client had gone
            await server.wait_closed()
