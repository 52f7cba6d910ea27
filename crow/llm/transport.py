"""The HTTP transport of crow's model providers: httpx2's, with each connection sending a
request's head and body in one write.

httpcore2 writes the head, then the body, each a socket send: on a local model server
(loopback) every send runs the receiver's TCP stack in the sender's system call and wakes
it, twice per request, on the one event loop that all of a reply's subagents share. Here
the writes of a request are held until its response is read (httpcore2 writes a whole
request before reading), and go out as one. A body over HOLD_LIMIT is not copied into
one buffer: what is held goes first, then the body as it came.

Its pool is crow's (`_Pool`): idle connections on a stack, one check per request, instead of
httpcore2's pass over every connection twice per request.

Before reusing an idle connection the pool asks whether the server closed it
("is_readable"); the anyio stream answers through its typed attributes (a dict of lambdas
built per question, a getpeername() system call). The raw socket is looked up once per
connection and polled directly.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import select
import socket
import ssl
import typing
import urllib.request
from collections import deque

import anyio
import httpcore2
import httpx2

log = logging.getLogger("crow.llm")
_Origin = tuple[bytes, bytes, int]  # scheme, host, port (httpcore2's Origin is unhashable)
_Connection = httpcore2.AsyncHTTPConnection
HOLD_LIMIT = 64 * 1024  # bytes a request may hold before it is sent as it comes
# One connection per model call in flight, each held for a whole streamed answer: httpx's
# default pool (100 connections, 20 kept idle) made the 101st busy session wait for another
# session's answer, and at 50 busy sessions opened a new connection for a fifth of the calls
# (100 handshakes per 500 turns). No cap: idle connections close after keepalive_expiry.
MODEL_LIMITS = httpx2.Limits(max_connections=None, max_keepalive_connections=None)


class _HeldWrites(httpcore2.AsyncNetworkStream):
    def __init__(self, stream: httpcore2.AsyncNetworkStream) -> None:
        self._stream = stream
        self._held: list[bytes] = []
        self._size = 0
        self._timeout: float | None = None
        self._socket: socket.socket | None = stream.get_extra_info("socket")

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        if self._size + len(buffer) > HOLD_LIMIT:
            await self._flush()
            await self._stream.write(buffer, timeout)
            return
        self._held.append(buffer)
        self._size += len(buffer)
        self._timeout = timeout

    async def _flush(self) -> None:
        if self._held:
            data, self._held, self._size = b"".join(self._held), [], 0
            await self._stream.write(data, self._timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self._held:
            try:
                await self._flush()
            except httpcore2.WriteError:
                pass  # as httpcore2 does for a request's writes: the server may have answered
        return await self._stream.read(max_bytes, timeout)

    async def aclose(self) -> None:
        self._held, self._size = [], 0
        await self._stream.aclose()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore2.AsyncNetworkStream:
        await self._flush()  # a proxy's CONNECT, answered before the handshake
        return _HeldWrites(await self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> typing.Any:
        if info == "is_readable" and self._socket is not None:
            return _readable(self._socket)
        return self._stream.get_extra_info(info)


def _readable(sock: socket.socket) -> bool:
    """httpcore2's own test (poll, not select: any descriptor number); a closed socket counts
    as readable, as there, so the pool drops it."""
    fd = sock.fileno()
    if fd < 0:
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


class _Backend(httpcore2.AsyncNetworkBackend):
    def __init__(self, backend: httpcore2.AsyncNetworkBackend) -> None:
        self._backend = backend

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        stream = await self._backend.connect_tcp(host, port, timeout, local_address, socket_options)
        return _HeldWrites(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        return _HeldWrites(await self._backend.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


class _Pool:
    """The model calls' connections: per origin, a stack of idle ones. A request takes the
    most recently used one the server has not closed (one check, `has_expired`: a poll), or
    opens one; the connection goes back when its response is closed, and the oldest idle
    one is closed once it has expired. httpcore2's pool asks every connection it holds
    (closed? expired? -- a poll each -- idle? available?) twice per request: with 50 busy
    sessions and their ~100 connections, ~15% of crow's CPU. No limit: see MODEL_LIMITS."""

    def __init__(
        self, ssl_context: ssl.SSLContext | None, keepalive_expiry: float | None, backend: _Backend
    ) -> None:
        self._ssl_context = ssl_context
        self._keepalive_expiry = keepalive_expiry
        self._backend = backend
        self._idle: dict[_Origin, deque[_Connection]] = {}
        self._open: set[_Connection] = set()  # each one made and not closed
        self._closed = False

    async def handle_async_request(self, request: httpcore2.Request) -> httpcore2.Response:
        scheme = request.url.scheme  # before .origin, which raises KeyError on an unknown one
        if scheme == b"":
            raise httpcore2.UnsupportedProtocol("Request URL is missing an 'http://' or 'https://' protocol.")
        if scheme not in (b"http", b"https"):
            raise httpcore2.UnsupportedProtocol(f"Request URL has an unsupported protocol '{scheme.decode()}://'.")
        origin = request.url.origin
        key = (origin.scheme, origin.host, origin.port)
        while True:
            connection = await self._take(key, origin)
            try:
                response = await connection.handle_async_request(request)
            except httpcore2.ConnectionNotAvailable:  # closed under us: another one
                await self._drop(connection)
                continue
            except BaseException:
                await self._drop(connection)
                raise
            body = _Release(response.stream, self, key, connection)
            return httpcore2.Response(
                response.status, headers=response.headers, content=body, extensions=response.extensions
            )

    async def _take(self, key: _Origin, origin: httpcore2.Origin) -> _Connection:
        if self._closed:
            raise RuntimeError("the model client is closed")
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if connection.is_idle() and not connection.has_expired():
                return connection
            await self._drop(connection)
        expiry, backend = self._keepalive_expiry, self._backend
        connection = _Connection(origin, self._ssl_context, expiry, network_backend=backend)
        self._open.add(connection)
        return connection

    async def release(self, key: _Origin, connection: _Connection) -> None:
        """A response was closed: its connection is idle again, or done with (a response not
        read to its end closes it)."""
        if self._closed or not connection.is_idle():
            await self._drop(connection)
            return
        idle = self._idle.setdefault(key, deque())
        idle.append(connection)
        while len(idle) > 1 and idle[0].has_expired():  # the oldest first: after a burst, all
            await self._drop(idle.popleft())

    async def _drop(self, connection: _Connection) -> None:
        self._open.discard(connection)
        if not connection.is_closed():
            with anyio.CancelScope(shield=True):
                await connection.aclose()

    async def aclose(self) -> None:
        self._closed = True
        connections, self._open, self._idle = list(self._open), set(), {}
        for connection in connections:
            await self._drop(connection)

    async def __aenter__(self) -> _Pool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _Release:
    """A response's body; closing it hands its connection back to the pool."""

    def __init__(
        self,
        stream: typing.AsyncIterable[bytes],
        pool: _Pool,
        key: _Origin,
        connection: _Connection,
    ) -> None:
        self._stream, self._pool, self._key, self._connection = stream, pool, key, connection
        self._closed = False

    async def __aiter__(self) -> typing.AsyncIterator[bytes]:
        chunks = self._stream.__aiter__()
        closing = contextlib.aclosing(chunks) if hasattr(chunks, "aclose") else contextlib.nullcontext(chunks)
        async with closing:
            async for chunk in chunks:
                yield chunk

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            with anyio.CancelScope(shield=True):
                close = getattr(self._stream, "aclose", None)
                if close is not None:
                    await close()
        finally:
            await self._pool.release(self._key, self._connection)


def model_transport(verify: ssl.SSLContext | bool) -> httpx2.AsyncHTTPTransport:
    """httpx2's own transport (TLS settings, error mapping as always) with crow's pool
    (`_Pool`), its connections made by `_Backend`. Where an httpx2 version keeps its pool
    elsewhere, the transport is used as it is."""
    transport = httpx2.AsyncHTTPTransport(verify=verify, limits=MODEL_LIMITS)
    pool = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if type(pool) is httpcore2.AsyncConnectionPool and backend is not None:  # not a proxy's
        ssl_context = getattr(pool, "_ssl_context", None)
        transport._pool = _Pool(ssl_context, MODEL_LIMITS.keepalive_expiry, _Backend(backend))  # type: ignore[assignment]
    return transport


def model_client(base_url: str, timeout: httpx2.Timeout, verify: ssl.SSLContext | bool) -> httpx2.AsyncClient:
    """The HTTP client of a provider: crow's transport, or, when the environment names a
    proxy for `base_url`, httpx's own client, which goes through it. A proxy httpx cannot
    use (socks without socksio, a bad URL) is warned about and not used, as before crow
    honoured proxies."""
    if proxied(base_url):
        try:
            return httpx2.AsyncClient(timeout=timeout, verify=verify, limits=MODEL_LIMITS)
        except (ImportError, ValueError, httpx2.InvalidURL) as exc:
            log.warning("the environment's proxy cannot be used for %s (%s): going direct", base_url, exc)
    return httpx2.AsyncClient(timeout=timeout, verify=verify, transport=model_transport(verify))


def proxied(base_url: str) -> bool:
    """Whether the environment names a proxy (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY; NO_PROXY is
    httpx's to apply) for a model that is not on this machine: given a transport, httpx
    mounts none, so crow's (`model_transport`) is used only without one. A model server on
    this machine (localhost, a loopback address, 0.0.0.0) is never reached through one."""
    try:
        host = httpx2.URL(base_url).host
    except (httpx2.InvalidURL, ValueError):
        return False  # its request fails with a clear error (map_http_errors)
    if host.rstrip(".").lower() == "localhost":
        return False  # a model server on this machine: never through a proxy
    with contextlib.suppress(ValueError):  # not an address: a name
        address = ipaddress.ip_address(host)
        if address.is_loopback or address.is_unspecified:
            return False
    return bool({"http", "https", "all"} & urllib.request.getproxies().keys())
