"""A transport whose writes made in one event-loop iteration reach the socket as one.

With 50 sessions in flight over one WebSocket, every session/update and every answer was
its own `send()` system call (~4 a turn), each waking the client: the largest single cost
in crow's main thread after the HTTP client. Queued here, the writes of one loop iteration
go out together at its end (`call_soon`), in the order they were made.

Flow control is kept: once `limit` bytes are queued they go to the transport at once, so
its own high-water mark still pauses the writer; `get_write_buffer_size` counts both.
"""

from __future__ import annotations

import asyncio
from typing import Any


class CoalescingTransport:
    """Wraps `transport`; everything but writing and closing is the wrapped one's."""

    def __init__(self, transport: asyncio.Transport, limit: int) -> None:
        self._transport = transport
        self._limit = limit
        self._queued: list[bytes] = []
        self._size = 0
        self._flush_soon: asyncio.Handle | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._queued.append(bytes(data))
        self._size += len(data)
        if self._size >= self._limit:
            self.flush()
        elif self._flush_soon is None:
            self._flush_soon = asyncio.get_running_loop().call_soon(self.flush)

    def writelines(self, chunks: Any) -> None:
        for data in chunks:
            self.write(data)

    def flush(self) -> None:
        if self._flush_soon is not None:
            self._flush_soon.cancel()
            self._flush_soon = None
        if self._queued:
            data = b"".join(self._queued)
            self._queued.clear()
            self._size = 0
            if not self._transport.is_closing():  # as a closed transport's write: dropped
                self._transport.write(data)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._size

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()  # close() sends what was written before it, as the transport's does
        self._transport.close()

    def abort(self) -> None:
        self._drop()
        self._transport.abort()

    def _drop(self) -> None:
        if self._flush_soon is not None:
            self._flush_soon.cancel()
            self._flush_soon = None
        self._queued.clear()
        self._size = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
