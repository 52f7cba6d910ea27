"""A process exec'd in a container, as an anyio byte stream.

The engine upgrades the exec-start request to a raw connection (`Upgrade: tcp`, answered
101 by Docker and Podman) that carries the process's stdin one way and, the other way,
its stdout and stderr in frames: an 8-byte header [stream 1|2, 0, 0, 0, size u32 BE] then
`size` bytes. `ExecStream` takes the frames apart; it trusts nothing in them.
"""

from __future__ import annotations

import socket
import struct

import anyio
import anyio.abc
import httpcore
import httpx

STDERR_TAIL = 64 * 1024
MAX_FRAME = 1024 * 1024  # engines send a frame per pipe read (Podman 8 KB, Docker 32 KB)
_STDOUT, _STDERR = 1, 2


class StreamBroken(anyio.BrokenResourceError):
    """An exec stream broke: the connection failed or carried a garbled frame."""


class ExecStream(anyio.abc.ByteStream):
    """A process exec'd in a container as a byte stream: `send` feeds its stdin, `receive`
    returns its stdout (the engine's frames taken apart; `anyio.EndOfStream` once it has
    exited), and `stderr_tail` keeps the last 64 KB of its stderr. One receiver at a time.
    A garbled frame or a broken connection raises `StreamBroken` and ends the stream."""

    def __init__(self, raw: anyio.abc.ByteStream, exec_id: str = "") -> None:
        self.exec_id = exec_id
        self._raw = raw
        self._buffer = bytearray()  # read from the connection, not yet taken apart
        self._kind = 0  # the stream the current frame belongs to
        self._left = 0  # bytes of the current frame still to come
        self._stderr = bytearray()
        self._broken: str | None = None
        self._closed = False
        self._send_lock = anyio.Lock()

    @property
    def stderr_tail(self) -> bytes:
        return bytes(self._stderr)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._closed:
            raise anyio.ClosedResourceError
        if self._broken is not None:
            raise StreamBroken(self._broken)
        try:
            return await self._next_stdout(max_bytes)
        except StreamBroken as exc:
            self._broken = str(exc)
            with anyio.CancelScope(shield=True):
                await self._raw.aclose()
            raise

    async def send(self, item: bytes) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        async with self._send_lock:
            try:
                await self._raw.send(item)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                raise StreamBroken(f"writing to the process: {exc or type(exc).__name__}") from None

    async def send_eof(self) -> None:
        """Close the process's stdin (not possible over TLS, where it raises)."""
        async with self._send_lock:
            await self._raw.send_eof()

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._raw.aclose()

    async def _next_stdout(self, max_bytes: int) -> bytes:
        while True:
            if self._left == 0:
                while len(self._buffer) < 8:
                    if not await self._fill():
                        if self._buffer:
                            raise StreamBroken("the exec stream ended inside a frame header")
                        raise anyio.EndOfStream
                header = bytes(self._buffer[:8])
                kind, size = header[0], struct.unpack(">I", header[4:])[0]
                if kind > 3 or header[1:4] != b"\0\0\0" or size > MAX_FRAME:
                    raise StreamBroken(f"the exec stream is garbled (frame header {header.hex()})")
                del self._buffer[:8]
                self._kind, self._left = kind, size
                continue
            if not self._buffer and not await self._fill():
                raise StreamBroken(f"the exec stream ended {self._left} bytes before its frame's end")
            take = min(self._left, len(self._buffer), max_bytes)
            chunk = bytes(self._buffer[:take])
            del self._buffer[:take]
            self._left -= take
            if self._kind == _STDOUT:
                return chunk
            if self._kind != _STDERR:  # 0 (stdin) and 3 (the engine's own error) go with stderr
                chunk = b"[engine] " + chunk
            self._stderr += chunk
            del self._stderr[:-STDERR_TAIL]

    async def _fill(self) -> bool:
        try:
            self._buffer += await self._raw.receive()
        except anyio.EndOfStream:
            return False
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            raise StreamBroken(f"the exec stream broke: {exc or type(exc).__name__}") from None
        return True


class UpgradedConnection(anyio.abc.ByteStream):
    """The raw connection an exec start was upgraded to (httpcore's network stream)."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self._net = response.extensions["network_stream"]

    async def receive(self, max_bytes: int = 65536) -> bytes:
        try:
            data: bytes = await self._net.read(max_bytes)
        except (httpcore.NetworkError, httpcore.TimeoutException) as exc:
            raise anyio.BrokenResourceError(str(exc)) from exc
        if not data:
            raise anyio.EndOfStream
        return data

    async def send(self, item: bytes) -> None:
        try:
            await self._net.write(item)
        except (httpcore.NetworkError, httpcore.TimeoutException) as exc:
            raise anyio.BrokenResourceError(str(exc)) from exc

    async def send_eof(self) -> None:
        half_close = self._net.get_extra_info("half_close")  # ssh's stdin
        if half_close is not None:
            return await half_close()
        sock = self._net.get_extra_info("socket")
        if sock is None or self._net.get_extra_info("ssl_object") is not None:
            raise NotImplementedError("a process's stdin cannot be half-closed over TLS")
        sock.shutdown(socket.SHUT_WR)

    async def aclose(self) -> None:
        await self._response.aclose()  # after a 101 this closes the connection
