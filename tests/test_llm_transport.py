"""crow/llm/transport.py: a model request's head and body leave in one socket write (one
wake-up of a local model server, one system call on crow's event loop), a large body as it
came; against the scripted model server over real sockets."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
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
    held = transport._pool._backend
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


class Server:
    """A keep-alive HTTP/1.1 server on a real socket: each request (small, one read) gets
    `answer`; counts connections and the connections it saw closed."""

    def __init__(self, answer: bytes = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") -> None:
        self.answer, self.connections, self.closed = answer, 0, 0

    async def serve(self, stream: Any) -> None:
        self.connections += 1
        async with stream:
            while True:
                try:
                    await stream.receive()
                    await stream.send(self.answer)
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    self.closed += 1
                    return

    async def saw_closed(self, count: int) -> None:
        with anyio.fail_after(5):
            while self.closed < count:  # noqa: ASYNC110
                await anyio.sleep(0.01)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, self.serve)
            yield f"http://127.0.0.1:{port}/"
            tg.cancel_scope.cancel()


async def test_a_request_checks_one_idle_connection_not_every_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """httpcore2's pool polled every idle connection (has the server closed it?) twice per
    request: ~60 polls per model call at 50 busy sessions, ~15% of crow's CPU."""
    polls = 0
    readable = transport_mod._readable

    def counted(sock: Any) -> bool:
        nonlocal polls
        polls += 1
        return readable(sock)

    monkeypatch.setattr(transport_mod, "_readable", counted)
    server = Server()
    async with server.running() as url, httpx2.AsyncClient(transport=model_transport(False)) as http:
        async with anyio.create_task_group() as tg:  # 40 connections, then all idle
            for _ in range(40):
                tg.start_soon(http.get, url)
        polls = 0
        for _ in range(10):
            assert (await http.get(url)).text == "ok"
    assert server.connections == 40
    assert polls <= 2 * 10, f"{polls} polls for 10 requests"


async def test_a_response_left_unread_closes_its_connection_and_the_next_call_opens_one() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"  # never ends
    server = Server(chunked)
    async with server.running() as url, httpx2.AsyncClient(transport=model_transport(False)) as http:
        async with http.stream("GET", url) as response:
            async for chunk in response.aiter_bytes():
                assert chunk == b"hello"
                break  # left before the end: the connection cannot be reused
        server.answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        assert (await http.get(url)).text == "ok"
        await server.saw_closed(1)
        assert len(http._transport._pool._open) == 1  # type: ignore[attr-defined]
    assert server.connections == 2


async def test_a_call_cancelled_mid_answer_leaves_the_pool_usable() -> None:
    server = Server(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
    async with server.running() as url, httpx2.AsyncClient(transport=model_transport(False)) as http:
        pool = http._transport._pool  # type: ignore[attr-defined]

        async def read_forever() -> None:
            async with http.stream("GET", url) as response:
                async for _ in response.aiter_bytes():
                    pass

        with anyio.move_on_after(0.3):
            await read_forever()
        assert not pool._open and not any(pool._idle.values())  # closed, not kept
        server.answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        assert (await http.get(url)).text == "ok"
        assert len(pool._open) == 1


async def test_an_expired_idle_connection_is_closed_not_reused() -> None:
    server = Server()
    async with server.running() as url, httpx2.AsyncClient(transport=model_transport(False)) as http:
        pool = http._transport._pool  # type: ignore[attr-defined]
        pool._keepalive_expiry = 0.05
        assert (await http.get(url)).text == "ok"
        await anyio.sleep(0.1)
        assert (await http.get(url)).text == "ok"
        await server.saw_closed(1)
    assert server.connections == 2


async def test_closing_the_client_closes_its_connections_and_refuses_more() -> None:
    server = Server()
    async with server.running() as url:
        http = httpx2.AsyncClient(transport=model_transport(False))
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(http.get, url)
        await http.aclose()
        await server.saw_closed(3)
        with pytest.raises(RuntimeError):
            await http.get(url)


async def test_a_refused_connection_is_a_connect_error_and_leaves_nothing_open() -> None:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    await listener.aclose()  # nothing listens there now
    async with httpx2.AsyncClient(transport=model_transport(False)) as http:
        with pytest.raises(httpx2.ConnectError):
            await http.get(f"http://127.0.0.1:{port}/")
        assert not http._transport._pool._open  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("localhost:8080/v1", "missing an 'http://' or 'https://' protocol"),
        ("ftp://127.0.0.1/v1", "unsupported protocol 'ftp://'"),
    ],
)
async def test_a_url_without_http_is_a_clear_error(url: str, said: str) -> None:
    """A model base_url written without its scheme (`OLLAMA_BASE_URL=localhost:11434/v1`):
    crow's pool read the URL's origin first, which raised KeyError (a crash)."""
    async with httpx2.AsyncClient(transport=model_transport(False)) as http:
        with pytest.raises(httpx2.UnsupportedProtocol, match=said):
            await http.get(url)


async def test_after_a_burst_the_expired_idle_connections_all_close() -> None:
    """The oldest idle connections are closed as long as they have expired, not one per
    call: spare connections of a burst would sit in CLOSE_WAIT, holding descriptors."""
    server = Server()
    async with server.running() as url, httpx2.AsyncClient(transport=model_transport(False)) as http:
        pool = http._transport._pool  # type: ignore[attr-defined]
        pool._keepalive_expiry = 0.2
        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(http.get, url)
        for _ in range(8):  # one call every 0.05 s: the newest connection stays fresh
            assert (await http.get(url)).text == "ok"
            await anyio.sleep(0.05)
        await server.saw_closed(19)
        assert len(pool._open) == 1
