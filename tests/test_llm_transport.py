"""crow/llm/transport.py and crow/llm/sockets.py: a model request goes straight to crow's
pool of httpcore2 connections on asyncio's transports; its head and body leave in one
socket write (one wake-up of a local model server, one system call on crow's event loop),
a large body as it came. Against real servers on real sockets."""

from __future__ import annotations

import contextlib
import gzip
import ssl
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpcore2
import httpx2
import pytest
import trustme
from anyio.streams.tls import TLSListener

from crow.llm import sockets
from crow.llm.transport import Direct
from tests.llm_server import Reply, ScriptedLLM

pytestmark = pytest.mark.anyio


def direct(timeout: float = 10, verify: ssl.SSLContext | bool = False) -> Direct:
    return Direct(httpx2.Timeout(timeout), verify)


def tls_pair() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(a server context for 127.0.0.1, a client context that trusts it): a throwaway CA."""
    ca = trustme.CA()
    server, client = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH), ssl.create_default_context()
    ca.issue_cert("127.0.0.1").configure_cert(server)
    ca.configure_trust(client)
    return server, client


class CountingBackend(sockets.Backend):
    """crow's backend, each socket write of its connections recorded (its size)."""

    def __init__(self) -> None:
        self.writes: list[int] = []

    async def connect_tcp(
        self, host: str, port: int, *args: Any, **kwargs: Any
    ) -> httpcore2.AsyncNetworkStream:
        stream = await super().connect_tcp(host, port, *args, **kwargs)
        assert isinstance(stream, sockets.Stream)
        write = stream._transport.write

        def counted(data: Any) -> None:
            self.writes.append(len(data))
            write(data)

        stream._transport.write = counted  # type: ignore[method-assign]
        return stream


def counting() -> tuple[Direct, CountingBackend]:
    http, backend = direct(), CountingBackend()
    http._pool._backend = backend
    return http, backend


async def call(http: Direct, url: str, content: bytes = b"hi", **headers: str) -> bytes:
    async with http.stream(url, headers, content) as reply:
        assert reply.status_code == 200
        return await reply.aread()


async def post(http: Direct, llm: ScriptedLLM, text: str) -> str:
    body = httpx2.Request("POST", "http://x", json={"model": "scripted", "stream": True,
                          "messages": [{"role": "user", "content": text}]}).content  # fmt: skip
    return (await call(http, f"{llm.base_url}/chat/completions", body)).decode()


async def test_each_request_goes_out_in_one_write_on_a_kept_connection(llm: ScriptedLLM) -> None:
    llm.push(Reply(text="first"), Reply(text="second"))
    http, backend = counting()
    async with http._pool:
        for text in ("one", "two"):
            assert "data: [DONE]" in await post(http, llm, text)
    assert [r.last_user_text for r in llm.requests] == ["one", "two"]
    assert len(backend.writes) == 2, f"writes per request: {backend.writes}"


async def test_a_body_over_the_hold_limit_is_sent_whole_without_a_joined_copy(llm: ScriptedLLM) -> None:
    llm.push(Reply(text="read it"))
    big = "x" * (sockets.HOLD_LIMIT * 3)
    http, backend = counting()
    async with http._pool:
        await post(http, llm, big)
    assert llm.requests[0].last_user_text == big
    head, body = backend.writes  # the head held, then the body as it came
    assert head < 1024 < sockets.HOLD_LIMIT * 3 < body


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
        http = direct()
        async with http._pool:
            for _ in range(2):
                assert await call(http, f"http://127.0.0.1:{port}/") == b"ok"
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
        http = direct()
        async with http._pool:

            async def one() -> None:
                assert await call(http, f"http://127.0.0.1:{port}/") == b"ok"

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
    async def running(self, tls: ssl.SSLContext | None = None) -> AsyncIterator[str]:
        """Serving on 127.0.0.1 (over TLS with `tls`, a server context): its URL."""
        listener: Any = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        if tls is not None:
            listener = TLSListener(listener, tls, standard_compatible=False)
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, self.serve)
            yield f"{'https' if tls else 'http'}://127.0.0.1:{port}/"
            tg.cancel_scope.cancel()


async def test_a_request_checks_one_idle_connection_not_every_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """httpcore2's pool polled every idle connection (has the server closed it?) twice per
    request: ~60 polls per model call at 50 busy sessions, ~15% of crow's CPU."""
    checks = 0
    has_expired = httpcore2.AsyncHTTPConnection.has_expired

    def counted(self: httpcore2.AsyncHTTPConnection) -> bool:
        nonlocal checks
        checks += 1
        return has_expired(self)

    monkeypatch.setattr(httpcore2.AsyncHTTPConnection, "has_expired", counted)
    server = Server()
    http = direct()
    async with server.running() as url, http._pool:
        async with anyio.create_task_group() as tg:  # 40 connections, then all idle
            for _ in range(40):
                tg.start_soon(call, http, url)
        checks = 0
        for _ in range(10):
            assert await call(http, url) == b"ok"
    assert server.connections == 40
    assert checks <= 2 * 10, f"{checks} checks for 10 requests"


async def test_a_response_left_unread_closes_its_connection_and_the_next_call_opens_one() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"  # never ends
    server = Server(chunked)
    http = direct()
    async with server.running() as url, http._pool:
        async with http.stream(url, {}, b"hi") as reply:
            async for chunk in reply.aiter_bytes():
                assert chunk == b"hello"
                break  # left before the end: the connection cannot be reused
        server.answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        assert await call(http, url) == b"ok"
        await server.saw_closed(1)
        assert len(http._pool._open) == 1
    assert server.connections == 2


async def test_a_call_cancelled_mid_answer_leaves_the_pool_usable() -> None:
    server = Server(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
    http = direct()
    async with server.running() as url, http._pool:
        pool = http._pool

        async def read_forever() -> None:
            async with http.stream(url, {}, b"hi") as reply:
                async for _ in reply.aiter_bytes():
                    pass

        with anyio.move_on_after(0.3):
            await read_forever()
        assert not pool._open and not any(pool._idle.values())  # closed, not kept
        server.answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        assert await call(http, url) == b"ok"
        assert len(pool._open) == 1


async def test_an_expired_idle_connection_is_closed_not_reused() -> None:
    server = Server()
    http = direct()
    async with server.running() as url, http._pool:
        http._pool._keepalive_expiry = 0.05
        assert await call(http, url) == b"ok"
        await anyio.sleep(0.1)
        assert await call(http, url) == b"ok"
        await server.saw_closed(1)
    assert server.connections == 2


async def test_closing_the_client_closes_its_connections_and_refuses_more() -> None:
    server = Server()
    async with server.running() as url:
        http = direct()
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(call, http, url)
        await http.aclose()
        await server.saw_closed(3)
        with pytest.raises(RuntimeError):
            await call(http, url)


async def test_a_refused_connection_is_a_connect_error_and_leaves_nothing_open() -> None:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    await listener.aclose()  # nothing listens there now
    http = direct()
    async with http._pool:
        with pytest.raises(httpcore2.ConnectError):
            await call(http, f"http://127.0.0.1:{port}/")
        assert not http._pool._open


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
    http = direct()
    async with http._pool:
        with pytest.raises(httpcore2.UnsupportedProtocol, match=said):
            await call(http, url)


async def test_after_a_burst_the_expired_idle_connections_all_close() -> None:
    """The oldest idle connections are closed as long as they have expired, not one per
    call: spare connections of a burst would sit in CLOSE_WAIT, holding descriptors."""
    server = Server()
    http = direct()
    async with server.running() as url, http._pool:
        pool = http._pool
        pool._keepalive_expiry = 0.2
        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(call, http, url)
        for _ in range(8):  # one call every 0.05 s: the newest connection stays fresh
            assert await call(http, url) == b"ok"
            await anyio.sleep(0.05)
        await server.saw_closed(19)
        assert len(pool._open) == 1


async def test_a_model_over_https_is_verified_and_answers(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TLS on crow's own sockets (asyncio's start_tls): a server whose certificate the
    machine does not trust is refused; trusted (SSL_CERT_FILE), the answer streams."""
    from crow.errors import ProviderError
    from crow.llm import ModelRequest, TextDelta
    from crow.llm.openai import OpenAIProvider
    from crow.messages import Message

    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    authority = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(authority))

    async def text(llm: ScriptedLLM) -> str:
        provider = OpenAIProvider("m", base_url=llm.base_url, api_key="k", max_retries=1)
        try:
            events = [e async for e in provider.stream(ModelRequest([Message("user", "hi")]))]
        finally:
            await provider.aclose()
        return "".join(e.text for e in events if isinstance(e, TextDelta))

    with ScriptedLLM(tls=server_context) as llm:
        assert llm.base_url.startswith("https://")
        other = tmp_path / "other.pem"  # a CA that did not sign the server's certificate
        trustme.CA().cert_pem.write_to_path(str(other))
        monkeypatch.setenv("SSL_CERT_FILE", str(other))
        monkeypatch.delenv("SSL_CERT_DIR", raising=False)
        with pytest.raises(ProviderError, match=r"cannot connect to .*CERTIFICATE_VERIFY_FAILED"):
            await text(llm)
        monkeypatch.setenv("SSL_CERT_FILE", str(authority))
        llm.push(Reply(text="private"), Reply(text="again"))
        assert await text(llm) == "private"
        assert await text(llm) == "again"


async def test_a_model_that_never_answers_is_a_read_timeout() -> None:
    """The read timeout is crow's own timer on its sockets: a server that takes the request
    and says nothing fails the call after it, with httpcore2's ReadTimeout."""

    async def serve(stream: Any) -> None:
        async with stream:
            await stream.receive()
            await anyio.sleep(30)

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    http = direct(timeout=0.2)
    async with listener, anyio.create_task_group() as tg, http._pool:
        tg.start_soon(listener.serve, serve)
        with anyio.fail_after(5), pytest.raises(httpcore2.ReadTimeout):
            await call(http, f"http://127.0.0.1:{port}/")
        assert not http._pool._open  # the connection is dropped, not kept
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_a_fast_server_fills_a_bounded_buffer_while_the_reader_is_slow(scheme: str) -> None:
    """A connection keeps reading into its buffer only up to READ_LIMIT, then stops until
    half of it is read (over TLS too): a
    model (or a hostile server) sending faster than crow consumes cannot grow its memory."""
    size = 8 * sockets.READ_LIMIT
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size
    server = Server(head + b"x" * size)
    server_tls, client_tls = tls_pair() if scheme == "https" else (None, False)
    http = direct(verify=client_tls)
    largest = received = 0
    async with server.running(server_tls) as url, http._pool:
        async with http.stream(url, {}, b"hi") as reply:
            async for chunk in reply.aiter_bytes():
                received += len(chunk)
                await anyio.sleep(0.02)  # the server has long sent everything it could
                (connection,) = http._pool._open
                stream = connection._connection._network_stream  # type: ignore[union-attr]
                largest = max(largest, stream._protocol.size)
    assert received == size
    assert 0 < largest <= sockets.READ_LIMIT + 256 * 1024  # asyncio reads up to 256 KiB at once


async def test_a_compressed_answer_the_server_sends_unasked_is_decoded() -> None:
    """crow asks for no compression (Accept-Encoding: identity); a server that compresses
    anyway is still read right."""
    body = gzip.compress(b"data: hello\n\n")
    heads: list[bytes] = []

    async def serve(stream: Any) -> None:
        async with stream:
            heads.append(await stream.receive())
            await stream.send(
                b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body)
            )

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    http = direct()
    async with listener, anyio.create_task_group() as tg, http._pool:
        tg.start_soon(listener.serve, serve)
        assert await call(http, f"http://127.0.0.1:{port}/") == b"data: hello\n\n"
        tg.cancel_scope.cancel()
    assert b"\r\naccept-encoding: identity\r\n" in heads[0].lower()


class RecordingBackend(sockets.Backend):
    """crow's backend, keeping each stream it opens."""

    def __init__(self) -> None:
        self.streams: list[sockets.Stream] = []

    async def connect_tcp(self, host: str, port: int, *args: Any, **kwargs: Any) -> httpcore2.AsyncNetworkStream:
        stream = await super().connect_tcp(host, port, *args, **kwargs)
        assert isinstance(stream, sockets.Stream)
        self.streams.append(stream)
        return stream


async def test_a_server_that_stops_reading_gets_a_write_timeout_and_its_socket_closed() -> None:
    """A request body the server never reads: the write times out, and the connection's
    socket is closed at once (a graceful close would wait, without end, to send the rest)."""
    import asyncio

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)  # never reads: its buffer fills, then the kernel's

    server = await asyncio.start_server(serve, "127.0.0.1", 0)  # anyio's would read it all
    port = server.sockets[0].getsockname()[1]
    http, backend = direct(timeout=0.3), RecordingBackend()
    http._pool._backend = backend
    async with server, http._pool:
        with anyio.fail_after(10), pytest.raises(httpcore2.WriteTimeout):
            await call(http, f"http://127.0.0.1:{port}/", b"x" * (32 * 1024 * 1024))
        await anyio.sleep(0.05)
        (stream,) = backend.streams
        assert stream._transport.get_extra_info("socket").fileno() == -1
        assert not http._pool._open
        server.close()
