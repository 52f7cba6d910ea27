"""crow's pool of httpcore2 connections for its model calls (`Pool`)."""

from __future__ import annotations

import contextlib
import ssl
import typing
from collections import deque

import anyio
import httpcore2

_Origin = tuple[bytes, bytes, int]  # scheme, host, port (httpcore2's Origin is unhashable)
_Connection = httpcore2.AsyncHTTPConnection


class Pool:
    """The model calls' connections: per origin, a stack of idle ones. A request takes the
    most recently used one the server has not closed (one check, `has_expired`), or opens
    one; the connection goes back when its response is closed, and the oldest idle one is
    closed once it has expired. httpcore2's pool asks every connection it holds (closed?
    expired? idle? available?) twice per request: with 50 busy sessions and their ~100
    connections, ~15% of crow's CPU. No limit: each model call in flight holds a connection
    for its whole answer (MODEL_LIMITS in crow.llm.transport)."""

    def __init__(
        self,
        ssl_context: ssl.SSLContext | None,
        keepalive_expiry: float | None,
        backend: httpcore2.AsyncNetworkBackend,
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
            raise httpcore2.UnsupportedProtocol(
                f"Request URL has an unsupported protocol '{scheme.decode()}://'."
            )
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

    async def __aenter__(self) -> Pool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _Release:
    """A response's body; closing it hands its connection back to the pool."""

    def __init__(
        self,
        stream: typing.AsyncIterable[bytes],
        pool: Pool,
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
