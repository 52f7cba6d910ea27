"""crow/llm/transport.py: a model request's head and body leave in one socket write (one
wake-up of a local model server, one system call on crow's event loop), a large body as it
came; against the scripted model server over real sockets."""

from __future__ import annotations

from typing import Any

import httpcore2
import httpx2
import pytest

from crow.llm import transport as transport_mod
from crow.llm.transport import model_transport
from tests.llm_server import Reply, ScriptedLLM

pytestmark = pytest.mark.anyio


class CountingStream(httpcore2.AsyncNetworkStream):
    def __init__(self, stream: httpcore2.AsyncNetworkStream, writes: list[int]) -> None:
        self._stream, self._writes = stream, writes

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._writes.append(len(buffer))
        await self._stream.write(buffer, timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._stream.read(max_bytes, timeout)

    async def aclose(self) -> None:
        await self._stream.aclose()

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class CountingBackend(httpcore2.AsyncNetworkBackend):
    """The real network backend, each write of its connections recorded (its size)."""

    def __init__(self) -> None:
        self.writes: list[int] = []
        self._backend = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self, host: str, port: int, *args: Any, **kwargs: Any
    ) -> httpcore2.AsyncNetworkStream:
        return CountingStream(await self._backend.connect_tcp(host, port, *args, **kwargs), self.writes)

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


def client() -> tuple[httpx2.AsyncClient, CountingBackend]:
    transport = model_transport(False)
    counting = CountingBackend()
    held = transport._pool._network_backend
    assert isinstance(held, transport_mod._Backend), "the transport's connections are not held-write ones"
    held._backend = counting
    return httpx2.AsyncClient(transport=transport), counting


async def post(http: httpx2.AsyncClient, llm: ScriptedLLM, text: str) -> list[str]:
    body = {"model": "scripted", "stream": True, "messages": [{"role": "user", "content": text}]}
    async with http.stream("POST", f"{llm.base_url}/chat/completions", json=body) as response:
        assert response.status_code == 200
        return [line async for line in response.aiter_lines()]


async def test_each_request_goes_out_in_one_write_on_a_kept_connection(llm: ScriptedLLM) -> None:
    llm.push(Reply(text="first"), Reply(text="second"))
    http, counting = client()
    async with http:
        for text in ("one", "two"):
            lines = await post(http, llm, text)
            assert any("data: [DONE]" in line for line in lines)
    assert [r.last_user_text for r in llm.requests] == ["one", "two"]
    assert len(counting.writes) == 2, f"writes per request: {counting.writes}"


async def test_a_body_over_the_hold_limit_is_sent_whole_without_a_joined_copy(llm: ScriptedLLM) -> None:
    llm.push(Reply(text="read it"))
    big = "x" * (transport_mod.HOLD_LIMIT * 3)
    http, counting = client()
    async with http:
        await post(http, llm, big)
    assert llm.requests[0].last_user_text == big
    head, body = counting.writes  # the head held, then the body as httpx gave it
    assert head < 1024 < transport_mod.HOLD_LIMIT * 3 < body


async def test_a_kept_connection_the_server_closed_is_not_reused() -> None:
    """The pool asks an idle connection whether it is readable (EOF: the server closed it)
    before reusing it; the transport answers that from the raw socket. Answered wrongly,
    the second request goes out on the dead connection and fails."""
    import anyio

    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"
    connections = 0

    async def serve(stream: anyio.abc.SocketStream) -> None:
        nonlocal connections
        connections += 1
        async with stream:
            await stream.receive()  # one whole small request
            await stream.send(answer)  # keep-alive as far as the client knows; then closed

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        async with httpx2.AsyncClient(transport=model_transport(False)) as http:
            for _ in range(2):
                response = await http.post(f"http://127.0.0.1:{port}/", content=b"hi")
                assert response.text == "ok"
                await anyio.sleep(0.05)  # let the server's close arrive
        tg.cancel_scope.cancel()
    assert connections == 2


async def serve_together(count: int, rounds: int) -> tuple[int, int]:
    """`rounds` times, `count` requests at once from one client; the server answers each only
    once all `count` are in (as a model server would, each busy with its own answer).
    Returns (requests answered, connections opened)."""
    import anyio

    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"
    connections = 0
    waiting: list[anyio.Event] = []
    answered = 0

    async def serve(stream: anyio.abc.SocketStream) -> None:
        nonlocal connections, waiting, answered
        connections += 1
        async with stream:
            while True:
                try:
                    await stream.receive()  # one whole small request
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return
                here = anyio.Event()
                waiting.append(here)
                if len(waiting) == count:
                    for event in waiting:
                        event.set()
                    waiting = []
                await here.wait()
                await stream.send(answer)
                answered += 1

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        async with httpx2.AsyncClient(transport=model_transport(False)) as http:

            async def one() -> None:
                assert (await http.post(f"http://127.0.0.1:{port}/", content=b"hi")).text == "ok"

            with anyio.fail_after(20):
                for _ in range(rounds):
                    async with anyio.create_task_group() as batch:
                        for _ in range(count):
                            batch.start_soon(one)
        tg.cancel_scope.cancel()
    return answered, connections


async def test_hundreds_of_model_calls_are_in_flight_at_once() -> None:
    """One model call per busy session, each holding its connection for as long as the model
    streams: httpx's default pool (100 connections) made the 101st session's call wait for
    another session's whole answer, here forever."""
    answered, connections = await serve_together(150, 1)
    assert (answered, connections) == (150, 150)


async def test_the_connections_of_many_busy_sessions_are_kept_for_their_next_calls() -> None:
    """httpx's default pool keeps 20 idle connections: with 50 busy sessions a fifth of the
    model calls opened a new connection (a TCP handshake, and an accept for the server)."""
    answered, connections = await serve_together(50, 3)
    assert (answered, connections) == (150, 50)
