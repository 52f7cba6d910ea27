"""crow/llm/sockets.py and Direct against servers that behave badly at the edges of a
connection: found by a review of the direct model path, each failing before its fix.
Plain asyncio servers and threads (asyncio.run per test): the timing is the point."""

from __future__ import annotations

import asyncio
import base64
import gc
import os
import socket
import threading
import time

import httpx2

from crow.llm.transport import Direct
from tests.test_llm_transport import RecordingBackend, tls_pair


def test_a_dropped_tls_connection_to_a_silent_server_is_closed_at_once() -> None:
    """transport.close() on a TLS transport waits up to 30 s for the peer's close_notify:
    a dropped connection (here after a read timeout) is aborted, as httpcore2's anyio
    backend closed it, at once."""
    server_ctx, client_ctx = tls_pair()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    held = []
    threading.Thread(
        target=lambda: held.append(server_ctx.wrap_socket(listener.accept()[0], server_side=True)), daemon=True
    ).start()  # handshake, then silence

    async def main() -> None:
        http, backend = Direct(httpx2.Timeout(0.3), client_ctx), RecordingBackend()
        http._pool._backend = backend
        try:
            async with http.stream(f"https://127.0.0.1:{port}/v1/chat/completions", {}, b"{}") as reply:
                await reply.aread()
        except Exception as exc:
            assert "timed out" in str(exc)
        await http.aclose()
        await asyncio.sleep(0.2)
        (stream,) = backend.streams
        assert stream._transport.get_extra_info("socket").fileno() == -1, "socket still open after aclose"

    asyncio.run(main())


def test_a_call_cancelled_while_connecting_leaves_no_socket_open() -> None:
    """asyncio's happy-eyeballs race (staggered_race) drops a connected socket when it is
    cancelled (CPython 3.11): it stayed open until a cyclic GC, which crow runs rarely. A
    single address is connected without the race."""

    async def main() -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        gc.disable()
        try:
            before = len(os.listdir("/proc/self/fd"))
            for k in range(3, 12):  # cancel after k passes of the loop
                http = Direct(httpx2.Timeout(5), False)

                async def call(http: Direct = http) -> None:
                    async with http.stream(f"http://127.0.0.1:{port}/v1/chat/completions", {}, b"{}") as r:
                        await r.aread()

                task = asyncio.ensure_future(call())
                for _ in range(k):
                    await asyncio.sleep(0)
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                await http.aclose()
            await asyncio.sleep(0.1)
            left = len(os.listdir("/proc/self/fd")) - before
        finally:
            gc.enable()
            gc.collect()
            server.close()
        assert left == 0, f"{left} sockets (crow's and the server's ends) left open until a GC"

    asyncio.run(main())


def test_userinfo_in_the_base_url_is_sent_as_basic_auth_as_before() -> None:
    """httpx's client turned http://user:pass@host/ into 'Authorization: Basic ...'; the
    direct path dropped it (a local model server behind basic auth answered 401)."""
    heads: list[bytes] = []

    async def main() -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            heads.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        http = Direct(httpx2.Timeout(5), False)
        async with http.stream(f"http://admin:hunter2@127.0.0.1:{port}/v1/chat/completions", {}, b"{}") as r:
            await r.aread()
        await http.aclose()
        server.close()

    asyncio.run(main())
    assert b"authorization: basic " + base64.b64encode(b"admin:hunter2").lower() in heads[0].lower()


def test_a_kept_connection_the_server_closed_while_the_loop_was_busy_is_not_reused() -> None:
    """The server (another thread here, another process in life) closes an idle keep-alive
    connection while crow's event loop is busy: is_readable answers from the protocol's
    buffer, which has not seen the FIN; the request goes out on the dead connection and
    fails ('Server disconnected without sending a response'). A poll() of the socket sees it."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        while True:
            conn, _ = listener.accept()
            conn.recv(65536)  # one small request
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            time.sleep(0.1)  # its idle keep-alive timeout
            conn.close()

    threading.Thread(target=serve, daemon=True).start()

    async def main() -> None:
        http = Direct(httpx2.Timeout(5), False)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        for _ in range(2):
            async with http.stream(url, {}, b"{}") as reply:
                assert await reply.aread() == b"ok"
            await asyncio.sleep(0.01)
            time.sleep(0.3)  # the loop busy with other work while the FIN arrives
        await http.aclose()

    asyncio.run(main())
