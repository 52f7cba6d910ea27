"""httpcore2's network backend for crow's model calls, on asyncio's own transports.

httpcore2's anyio backend costs, per request: an extra pass of the event loop after each
send and after a read of data already there (anyio's checkpoints), two epoll_ctl calls
per read (reading resumed and paused again), a cancel scope and an exception map per read
and write, and extra-attribute lookups (a getpeername() call) to ask whether an idle
connection was closed. At 50 busy sessions that was about a tenth of crow's CPU. Here a
connection keeps reading into a bounded buffer, and a read waits only when the buffer is
empty, with one timer. "Closed by the server?" is the buffer's EOF, or else one poll()
of the socket (a close the loop has not read yet, while it was busy).

A connection is closed at once (abort): a graceful close waits, without end, to send
what a server stopped reading, and a TLS close waits up to 30 s for the peer's
close_notify (httpcore2's anyio backend did not send one either).

A request's writes (its head, then its body) are held until its response is read
(httpcore2 writes a whole request before reading) and go out as one: on a local model
server (loopback) every send runs the receiver's TCP stack in the sender's system call
and wakes it. A body over HOLD_LIMIT is not copied into one buffer: what is held goes
first, then the body as it came.
"""

from __future__ import annotations

import asyncio
import select
import socket
import ssl
import typing
from collections import deque
from collections.abc import Iterable

import httpcore2

HOLD_LIMIT = 64 * 1024  # bytes a request may hold before it is sent as it comes
READ_LIMIT = 256 * 1024  # bytes buffered before the connection stops reading
HAPPY_EYEBALLS_DELAY = 0.25  # what anyio's connect_tcp waits before trying the next address


class _Protocol(asyncio.Protocol):
    """What arrived on a connection, and who waits for it or for the send buffer to drain."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.chunks: deque[bytes] = deque()
        self.size = 0
        self.ended = False  # EOF or connection lost: nothing more will arrive
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None  # a read's
        self.drained: asyncio.Future[None] | None = None  # a write's, while writing is paused
        self.paused = False  # reading paused: the buffer is full

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        if self.size > READ_LIMIT and not self.paused and self.transport is not None:
            self.transport.pause_reading()
            self.paused = True
        _wake(self.waiter)

    def take(self, max_bytes: int) -> bytes:
        """Up to `max_bytes` of what arrived (some must have); reading resumes once the
        buffer is half empty."""
        chunk = self.chunks.popleft()
        if len(chunk) > max_bytes:
            chunk, rest = chunk[:max_bytes], chunk[max_bytes:]
            self.chunks.appendleft(rest)
        self.size -= len(chunk)
        if self.paused and self.size <= READ_LIMIT // 2 and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return chunk

    def eof_received(self) -> bool:
        self.ended = True
        _wake(self.waiter)
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.error = exc
        _wake(self.waiter)
        _wake(self.drained)

    def pause_writing(self) -> None:
        if self.drained is None or self.drained.done():
            self.drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        _wake(self.drained)
        self.drained = None


def _wake(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


def _readable(sock: socket.socket | None) -> bool:
    """Whether the socket has data or EOF the event loop has not read yet (a server that
    closed an idle connection while the loop was busy): one poll(), as httpcore2 asks it.
    A closed socket counts as readable, so the pool drops its connection."""
    fd = -1 if sock is None else sock.fileno()
    if fd < 0:
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _expire(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


async def _wait(future: asyncio.Future[None], timeout: float | None) -> None:
    """Wait for `future`, raising TimeoutError after `timeout` seconds (None: never)."""
    if timeout is None:
        await future
        return
    timer = asyncio.get_running_loop().call_later(timeout, _expire, future)
    try:
        await future
    finally:
        timer.cancel()


class Stream(httpcore2.AsyncNetworkStream):
    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        self._transport, self._protocol = transport, protocol
        self._held: list[bytes] = []
        self._size = 0
        self._tls = transport.get_extra_info("sslcontext") is not None
        self._socket: socket.socket | None = transport.get_extra_info("socket")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        protocol = self._protocol
        if self._held:  # the request, sent now; on a closed connection what came is read
            data = b"".join(self._held)
            self._held, self._size = [], 0
            if not self._transport.is_closing():
                self._transport.write(data)
        if not protocol.chunks and not protocol.ended:
            protocol.waiter = asyncio.get_running_loop().create_future()
            try:
                await _wait(protocol.waiter, timeout)
            except TimeoutError:
                raise httpcore2.ReadTimeout("timed out reading from the model server") from None
            finally:
                protocol.waiter = None
        if not protocol.chunks:
            if protocol.error is not None:
                raise httpcore2.ReadError(str(protocol.error) or type(protocol.error).__name__)
            return b""
        return protocol.take(max_bytes)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        if self._size + len(buffer) <= HOLD_LIMIT:
            self._held.append(buffer)
            self._size += len(buffer)
            return
        self._send_held()
        self._send(buffer)
        drained = self._protocol.drained
        if drained is not None:
            try:
                await _wait(drained, timeout)
            except TimeoutError:
                raise httpcore2.WriteTimeout("timed out writing to the model server") from None
        if self._protocol.ended:
            raise httpcore2.WriteError(str(self._protocol.error or "the connection was closed"))

    def _send_held(self) -> None:
        if self._held:
            data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
            self._held, self._size = [], 0
            self._send(data)

    def _send(self, data: bytes) -> None:
        if self._transport.is_closing():
            raise httpcore2.WriteError("the connection was closed")
        self._transport.write(data)

    async def aclose(self) -> None:
        self._held, self._size = [], 0
        # TLS: no close_notify handshake (asyncio's waits up to 30 s for the peer's, and its
        # write buffer size leaves out the socket's); as httpcore2's anyio backend, closed at once
        if self._tls or self._transport.get_write_buffer_size():
            self._transport.abort()  # close() would wait, unbounded, for a server that stopped reading
        else:
            self._transport.close()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore2.AsyncNetworkStream:
        self._send_held()  # a proxy's CONNECT, answered before the handshake
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport = await loop.start_tls(
                    self._transport, self._protocol, ssl_context, server_hostname=server_hostname
                )
        except TimeoutError:
            self._transport.close()
            raise httpcore2.ConnectTimeout("timed out in the TLS handshake") from None
        except (OSError, ssl.SSLError, ConnectionError) as exc:
            self._transport.close()
            raise httpcore2.ConnectError(str(exc)) from exc
        if transport is None:  # the connection closed during the handshake
            raise httpcore2.ConnectError("the connection was closed during the TLS handshake")
        tls = typing.cast(asyncio.Transport, transport)
        self._protocol.transport = tls  # start_tls does not call connection_made again
        return Stream(tls, self._protocol)

    def get_extra_info(self, info: str) -> typing.Any:
        if info == "is_readable":  # an idle connection with data or EOF: the server closed it
            return bool(self._protocol.chunks) or self._protocol.ended or _readable(self._socket)
        if info == "client_addr":
            return self._transport.get_extra_info("sockname")
        if info == "server_addr":
            return self._transport.get_extra_info("peername")
        if info in ("ssl_object", "socket"):
            return self._transport.get_extra_info(info)
        return None


class Backend(httpcore2.AsyncNetworkBackend):
    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                # staggered_race (happy eyeballs) loses a connected socket when cancelled: only
                # when there is more than one address to race
                several = len({info[4] for info in infos}) > 1
                transport, protocol = await loop.create_connection(
                    _Protocol,
                    host,
                    port,
                    local_addr=(local_address, 0) if local_address else None,
                    happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY if several else None,
                )
        except TimeoutError:
            raise httpcore2.ConnectTimeout(f"timed out connecting to {host}:{port}") from None
        except OSError as exc:
            raise httpcore2.ConnectError(str(exc)) from exc
        sock = transport.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return Stream(transport, protocol)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
