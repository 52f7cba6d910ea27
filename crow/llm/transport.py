"""The HTTP transport of crow's model providers: httpx2's, with each connection sending a
request's head and body in one write.

httpcore2 writes the head, then the body, each a socket send: on a local model server
(loopback) every send runs the receiver's TCP stack in the sender's system call and wakes
it, twice per request, on the one event loop that all of a reply's subagents share. Here
the writes of a request are held until its response is read (httpcore2 writes a whole
request before reading), and go out as one. A body over HOLD_LIMIT is not copied into
one buffer: what is held goes first, then the body as it came.

Before and after each request the pool asks every idle connection whether the server closed
it ("is_readable"); the anyio stream answers through its typed attributes (a dict of lambdas
built per question, a getpeername() system call), a fifth of the pool's CPU at 50 busy
sessions. The raw socket is looked up once per connection and polled directly.
"""

from __future__ import annotations

import select
import socket
import ssl
import typing

import httpcore2
import httpx2

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


def model_transport(verify: ssl.SSLContext | bool) -> httpx2.AsyncHTTPTransport:
    """httpx2's own transport (TLS, pool, error mapping as always; limits: MODEL_LIMITS),
    its connections made by `_Backend`. Where an httpx2 version keeps its pool elsewhere, it is used as is."""
    transport = httpx2.AsyncHTTPTransport(verify=verify, limits=MODEL_LIMITS)
    pool = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if isinstance(pool, httpcore2.AsyncConnectionPool) and backend is not None:
        pool._network_backend = _Backend(backend)
    return transport
