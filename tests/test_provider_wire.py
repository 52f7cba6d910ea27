"""What a provider's request looks like on the wire, read from a raw socket: its headers as
sent (each once), and the proxy the environment names."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from crow.errors import ProviderError
from crow.llm import ModelRequest, TextDelta
from crow.llm.openai import OpenAIProvider
from crow.messages import Message

pytestmark = pytest.mark.anyio

SSE = (
    b'data: {"choices":[{"index":0,"delta":{"content":"answered"},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s" % (len(SSE), SSE)


@contextlib.asynccontextmanager
async def raw_server(heads: list[bytes]) -> AsyncIterator[int]:
    """Records each request's head (its body is small: read with it) and answers one SSE
    answer; yields the port."""

    async def serve(stream: Any) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                data += await stream.receive()
            heads.append(data.split(b"\r\n\r\n")[0])
            await stream.send(ANSWER)

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        yield listener.extra(anyio.abc.SocketAttribute.local_port)
        tg.cancel_scope.cancel()


async def text_of(provider: OpenAIProvider) -> str:
    try:
        events = [e async for e in provider.stream(ModelRequest([Message("user", "hi")]))]
    finally:
        await provider.aclose()
    return "".join(e.text for e in events if isinstance(e, TextDelta))


@pytest.mark.parametrize("name", ["content-type", "Content-Type", "CONTENT-TYPE"])
async def test_a_configured_content_type_is_sent_once_and_wins(name: str) -> None:
    heads: list[bytes] = []
    async with raw_server(heads) as port:
        provider = OpenAIProvider(
            "m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k", headers={name: "application/json; x=1"}
        )
        assert await text_of(provider) == "answered"
    lines = [line.lower() for line in heads[0].split(b"\r\n")]
    assert [line for line in lines if line.startswith(b"content-type:")] == [b"content-type: application/json; x=1"]


async def test_a_direct_request_carries_each_header_once_as_written() -> None:
    """crow builds the head itself (no httpx client): Host and Content-Length computed,
    httpx's defaults but no compression, the provider's headers as written; one of each."""
    heads: list[bytes] = []
    async with raw_server(heads) as port:
        headers = {"X-Team": "crow", "accept": "*/*"}
        provider = OpenAIProvider("m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k", headers=headers)
        assert await text_of(provider) == "answered"
    request_line, *fields = heads[0].split(b"\r\n")
    assert request_line == b"POST /v1/chat/completions HTTP/1.1"
    names = [field.split(b":")[0] for field in fields]
    assert sorted(n.lower() for n in names) == sorted(
        [b"host", b"content-length", b"accept-encoding", b"connection", b"user-agent", b"accept",
         b"authorization", b"content-type", b"x-team"]
    )  # fmt: skip
    assert f"Host: 127.0.0.1:{port}".encode() in fields
    assert b"Authorization: Bearer k" in fields and b"X-Team: crow" in fields
    assert b"accept: */*" in fields  # the provider's own spelling, which replaced the default
    assert b"Accept-Encoding: identity" in fields


async def test_the_model_is_reached_through_the_proxy_the_environment_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HTTP_PROXY / HTTPS_PROXY were ignored for model calls: given crow's transport, httpx
    mounts no proxy, and a machine that reaches the API only through one could not."""
    heads: list[bytes] = []
    async with raw_server(heads) as port:
        for name in ("HTTP_PROXY", "http_proxy"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{port}")
        for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(name, raising=False)
        provider = OpenAIProvider("m", base_url="http://model.invalid/v1", api_key="k", max_retries=1)
        assert await text_of(provider) == "answered"
    assert heads[0].startswith(b"POST http://model.invalid/v1/chat/completions HTTP/1.1\r\n")


async def test_a_model_on_this_machine_is_never_reached_through_a_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens: used, it fails
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    heads: list[bytes] = []
    async with raw_server(heads) as port:
        for host in ("127.0.0.1", "localhost"):
            provider = OpenAIProvider("m", base_url=f"http://{host}:{port}/v1", api_key="k", max_retries=1)
            assert await text_of(provider) == "answered"
    assert all(head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") for head in heads)


async def test_without_a_proxy_the_model_is_reached_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    heads: list[bytes] = []
    async with raw_server(heads) as port:
        provider = OpenAIProvider("m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k")
        assert is_direct(provider)
        assert await text_of(provider) == "answered"
    assert heads[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")


def is_direct(provider: OpenAIProvider) -> bool:
    return type(provider._http).__name__ == "Direct"  # crow's own path to its pool


@pytest.mark.parametrize("host", ["127.0.0.2", "0.0.0.0", "[::1]", "localhost.", "LocalHost"])
async def test_every_spelling_of_this_machine_is_direct(host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    provider = OpenAIProvider("m", base_url=f"http://{host}:8000/v1", api_key="k")
    try:
        assert is_direct(provider)
    finally:
        await provider.aclose()


@pytest.mark.parametrize("url", ["http://localhost:abc/v1", "http://[::1/v1", "http://model.test/v1\n"])
async def test_a_malformed_base_url_fails_its_calls_clearly_not_crow(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With or without a proxy in the environment, the provider is built; the call says why."""
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    provider = OpenAIProvider("m", base_url=url, api_key="k", max_retries=1)
    with pytest.raises(ProviderError, match="openai: "):
        await text_of(provider)


@pytest.mark.parametrize(
    "proxy", ["socks5://127.0.0.1:1080", "socks4://127.0.0.1:1080", "http://proxy.test:abc"]
)
async def test_a_proxy_httpx_cannot_use_is_warned_about_and_not_used(
    proxy: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ALL_PROXY", proxy)
    with caplog.at_level(logging.WARNING, logger="crow.llm"):
        provider = OpenAIProvider("m", base_url="http://model.test/v1", api_key="k")
    try:
        assert is_direct(provider)
        assert "the environment's proxy cannot be used for http://model.test/v1" in caplog.text
    finally:
        await provider.aclose()


async def test_a_key_that_is_not_ascii_is_a_clear_error_that_does_not_show_it() -> None:
    """A key pasted with a typographic dash: HTTP headers are ASCII. It was a
    UnicodeEncodeError, reported as a bug in the provider."""
    provider = OpenAIProvider("m", base_url="http://127.0.0.1:9/v1", api_key="sk–secret", max_retries=1)
    with pytest.raises(ProviderError) as info:
        await text_of(provider)
    assert str(info.value) == (
        "openai: a request header holds '–', which is not ASCII; check the API key and the provider's `headers`"
    )
    assert "secret" not in str(info.value)


async def test_a_port_out_of_range_is_a_clear_error() -> None:
    provider = OpenAIProvider("m", base_url="http://127.0.0.1:99999/v1", api_key="k", max_retries=1)
    with pytest.raises(ProviderError, match=r"^openai: request failed: Invalid port: 99999$"):
        await text_of(provider)
