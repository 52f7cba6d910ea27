"""The WebSocket server's coalescing transport (crow.acp.coalesce) on a real TCP connection:
what one loop iteration writes reaches the peer once, in order; close sends what was
queued, abort drops it; past the limit the bytes go to the transport at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from crow.acp.coalesce import CoalescingTransport

pytestmark = pytest.mark.anyio
LIMIT = 1024


class _Peer(asyncio.Protocol):
    """The other end: everything it received, and whether the connection has ended."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.arrived = asyncio.Event()
        self.ended = asyncio.Event()

    def data_received(self, data: bytes) -> None:
        self.data += data
        self.arrived.set()

    async def has(self, expected: bytes) -> None:
        async with asyncio.timeout(10):
            while len(self.data) < len(expected):
                self.arrived.clear()
                await self.arrived.wait()
        assert self.data == expected

    def eof_received(self) -> None:
        self.ended.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended.set()


@asynccontextmanager
async def connected() -> AsyncIterator[tuple[CoalescingTransport, asyncio.Transport, _Peer]]:
    loop = asyncio.get_running_loop()
    peer = _Peer()
    server = await loop.create_server(lambda: peer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
    try:
        yield CoalescingTransport(transport, LIMIT), transport, peer
    finally:
        transport.abort()
        server.close()


async def test_the_writes_of_one_iteration_go_out_together_and_in_order() -> None:
    async with connected() as (coalesced, transport, peer):
        written: list[bytes] = []
        real_write = transport.write
        transport.write = lambda data: (written.append(bytes(data)), real_write(data))  # type: ignore[method-assign]
        for chunk in (b"one ", bytearray(b"two "), memoryview(b"three")):
            coalesced.write(chunk)
        assert written == [] and coalesced.get_write_buffer_size() == len(b"one two three")
        await peer.has(b"one two three")
        assert written == [b"one two three"]
        coalesced.writelines([b" four", b" five"])
        await peer.has(b"one two three four five")
        assert written[1:] == [b" four five"]


async def test_close_sends_what_was_queued_and_abort_drops_it() -> None:
    async with connected() as (coalesced, _transport, peer):
        coalesced.write(b"last words")
        coalesced.close()
        await asyncio.wait_for(peer.ended.wait(), 10)
        assert peer.data == b"last words"
    async with connected() as (coalesced, _transport, peer):
        coalesced.write(b"never sent")
        coalesced.abort()
        await asyncio.wait_for(peer.ended.wait(), 10)
        await asyncio.sleep(0)  # the flush that was due runs and finds nothing
        assert peer.data == b""


async def test_past_the_limit_the_bytes_reach_the_transport_at_once() -> None:
    async with connected() as (coalesced, transport, peer):
        coalesced.write(b"x" * (LIMIT - 1))
        assert coalesced.get_write_buffer_size() - transport.get_write_buffer_size() == LIMIT - 1
        coalesced.write(b"y")  # the limit reached: flow control sees the bytes now
        assert coalesced.get_write_buffer_size() == transport.get_write_buffer_size()
        await peer.has(b"x" * (LIMIT - 1) + b"y")
