"""What both HTTP providers share: error mapping, HTTP-status translation and retries.

`map_http_errors()` is the one place httpx2 exceptions become crow errors. `error_from_status()`
turns an error response into the most specific `ProviderError`. `stream_with_retries()` runs
one streaming attempt after another until one succeeds, never replaying output that already
reached the caller.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import logging
import os
import random
import re
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import anyio
import httpcore2
import httpx2

from crow import images
from crow.errors import (
    AuthError,
    ContextLengthError,
    MissingKeyError,
    ProviderError,
    RateLimitError,
    StreamCutError,
)
from crow.llm.base import ModelEvent, ModelRequest, ModelResponse, Retrying, ToolSpec
from crow.llm.body import ToolTexts, encode_body
from crow.llm.registry import PUBLIC_HOSTS
from crow.llm.sse import SSEDecoder, SSELines, TooLong
from crow.llm.transport import ModelHTTP, Reply, ViaHttpx, model_http
from crow.messages import valid_value

logger = logging.getLogger("crow.llm")

T = TypeVar("T")

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504, 529})
_CONTEXT_PATTERNS = re.compile(
    r"maximum context length|context length|context window|context size|prompt is too long"
    r"|too many tokens|input is too long|exceeds the context",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_retries: int = 3  # attempts in total, the first one included
    backoff_base: float = 0.5
    backoff_cap: float = 20.0
    retry_after_cap: float = 60.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.retry_after_cap)
        ceiling = min(self.backoff_cap, self.backoff_base * 2 ** (attempt - 1))
        # "equal jitter": never less than half the step, so retries stay spread out
        return ceiling / 2 + random.uniform(0, ceiling / 2)


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds from `retry-after-ms` or `Retry-After` (delta seconds or an HTTP date)."""
    if ms := headers.get("retry-after-ms"):
        with contextlib.suppress(ValueError):
            return max(float(ms) / 1000, 0.0)
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


def redact(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


def _server_message(body: str) -> tuple[str, str]:
    """(message, code) from an OpenAI- or Anthropic-shaped error body, else the raw text."""
    try:
        data: Any = json.loads(body)
    except ValueError:
        return body.strip()[:500], ""
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, str):
            return err, ""
        if isinstance(err, dict):
            message = err.get("message") or data.get("message") or data.get("detail") or body
            code = err.get("code") or err.get("type") or ""
            return str(message)[:1000], str(code)
    return body.strip()[:500], ""


def error_from_status(
    provider: str,
    status: int,
    body: str,
    headers: Mapping[str, str] | None = None,
    *,
    api_key_env: str = "",
    api_key: str | None = None,
) -> ProviderError:
    """The crow error for an HTTP error response (or an in-stream error, status 0)."""
    message, code = _server_message(body)
    message = redact(message, api_key) or "(no message)"
    where = f"{provider}: HTTP {status}" if status else f"{provider}: stream error"
    detail = f"{where}: {message}" + (f" [{code}]" if code else "")
    retry_after = parse_retry_after(headers) if headers is not None else None
    if status in (401, 403) or code in ("authentication_error", "permission_error"):
        hint = f"set {api_key_env} to a valid API key" if api_key_env else "check the API key"
        hint += " or run `crow login`"
        return AuthError(f"{detail}; {hint}", status=status or None)
    if status in (429, 529) or code in ("rate_limit_error", "overloaded_error"):
        return RateLimitError(detail, status=status or None, retryable=True, retry_after=retry_after)
    if code == "context_length_exceeded" or (
        (status == 0 or 400 <= status < 500) and _CONTEXT_PATTERNS.search(message)
    ):
        return ContextLengthError(detail, status=status or None)
    retryable = status in RETRYABLE_STATUS or code in ("api_error", "server_error")
    return ProviderError(detail, status=status or None, retryable=retryable, retry_after=retry_after)


@contextlib.contextmanager
def map_http_errors(provider: str, *, base_url: str = "") -> Iterator[None]:
    """Translate every httpx2 and httpcore2 exception raised inside into a crow
    `ProviderError`; a header value that is not ASCII (HTTP allows no other) too."""
    try:
        yield
    except (httpx2.TimeoutException, httpcore2.TimeoutException) as exc:
        phase = type(exc).__name__.removesuffix("Timeout").lower() or "request"
        raise ProviderError(f"{provider}: {phase} timed out ({base_url})", retryable=True) from exc
    except (httpx2.ConnectError, httpcore2.ConnectError) as exc:
        raise ProviderError(f"{provider}: cannot connect to {base_url}: {exc}", retryable=True) from exc
    except (
        httpx2.RemoteProtocolError,
        httpx2.ReadError,
        httpcore2.RemoteProtocolError,
        httpcore2.ReadError,
    ) as exc:
        # the connection broke while the answer was streaming
        raise StreamCutError(f"{provider}: connection lost mid-response: {exc}", partial=False) from exc
    except (
        httpx2.TransportError,
        httpcore2.NetworkError,
        httpcore2.ProtocolError,
        httpcore2.ProxyError,
    ) as exc:
        raise ProviderError(f"{provider}: network error: {exc}", retryable=True) from exc
    except (httpx2.HTTPError, httpx2.InvalidURL, httpcore2.UnsupportedProtocol) as exc:
        raise ProviderError(f"{provider}: request failed: {exc}") from exc
    except UnicodeEncodeError as exc:  # the value is not shown: it may be the key
        raise ProviderError(
            f"{provider}: a request header holds {exc.object[exc.start]!r}, which is not ASCII;"
            " check the API key and the provider's `headers`"
        ) from None


async def stream_with_retries(
    attempt: Callable[[], AsyncIterator[T]],
    policy: RetryPolicy,
    *,
    provider: str,
) -> AsyncIterator[T | Retrying]:
    """Yield from `attempt()`, starting it again on retryable errors before any output
    (saying so first: `Retrying`, which is not output).

    Once an item has been yielded a failure is final: a transient one (a cut, a timeout)
    becomes `StreamCutError(partial=True)`, so the caller decides instead of us replaying.
    """
    number = 0
    while True:
        number += 1
        yielded = False
        try:
            async with contextlib.aclosing(attempt()) as events:
                async for event in events:
                    yielded = True
                    yield event
            return
        except ProviderError as exc:
            if yielded:
                if exc.retryable:
                    raise StreamCutError(f"{exc} (after partial output)", partial=True) from exc
                raise
            if not exc.retryable or number >= policy.max_retries:
                raise
            delay, why = policy.delay(number, exc.retry_after), str(exc)
            logger.warning(
                "%s; retrying in %.2fs (attempt %d of %d)",
                exc,
                delay,
                number + 1,
                policy.max_retries,
            )
        yield Retrying(why, number + 1, policy.max_retries, delay)
        await anyio.sleep(delay)


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse_event(provider: str, data: str) -> dict[str, Any]:
    """One SSE event's JSON data, which must be an object. Every model's text passes here,
    so here it is made valid Unicode: JSON can escape a lone UTF-16 surrogate (`"\\ud83d"`,
    half an emoji), which no encoder downstream (store, wire, next request) accepts."""
    try:
        event = json.loads(data)
    except ValueError as exc:
        raise ProviderError(f"{provider}: malformed stream event: {data[:200]!r}") from exc
    if not isinstance(event, dict):
        raise ProviderError(f"{provider}: malformed stream event: {data[:200]!r}")
    if _SURROGATE_ESCAPE.search(data):  # rare: walk the event only then
        event = valid_value(event)
    return event


def tls_context(base_url: str) -> ssl.SSLContext | bool:
    """Certificate verification as usual for https. A plain-http endpoint (a local model
    server) never does TLS, so it skips loading the CA bundle (~50 ms and ~3 MB at the
    first prompt): its context verifies with no trusted roots, so if an https URL were ever
    requested it would fail, never pass unchecked."""
    if base_url.startswith("http://"):
        return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    return True


class StreamAssembler(Protocol):
    """Builds one streamed answer from SSE event data (a provider's wire format)."""

    ended: bool  # the last event came: what follows is read, not fed
    finished: bool  # the model finished its answer (else the stream was cut)

    def feed(self, data: str) -> list[ModelEvent]: ...

    def response(self) -> ModelResponse: ...


class HTTPProvider:
    """Plumbing both providers share: one keep-alive client, the key, the retry policy,
    and the streaming attempt (`_attempt`) around a provider's `StreamAssembler`."""

    # What a subclass's wire defaults to; every one can be overridden per instance.
    default_base_url: str
    default_key_env: str
    default_name: str
    default_context_window: int = 128_000

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str | None = None,
        name: str | None = None,
        context_window: int | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        reasoning_effort: str | None = None,
        accepts_images: bool = True,
        connect_timeout: float = 10,
        read_timeout: float = 300,
        max_retries: int = 3,
        backoff_base: float = 0.5,
        backoff_cap: float = 20.0,
        headers: Mapping[str, str] | None = None,
        client: httpx2.AsyncClient | None = None,
    ) -> None:
        self.model = model
        self.name = name or self.default_name
        self.context_window = context_window or self.default_context_window
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.reasoning_effort = reasoning_effort
        self.accepts_images = accepts_images
        self._extra_headers = dict(headers or {})
        self.base_url = (base_url or self.default_base_url).rstrip("/")
        self.api_key_env = api_key_env or self.default_key_env
        # "" means "no key, do not look in the environment" (the registry resolved it)
        key = api_key if api_key is not None else os.environ.get(self.api_key_env, "")
        self._api_key = key or None
        self.retry = RetryPolicy(max(1, max_retries), backoff_base, backoff_cap)
        timeout = httpx2.Timeout(read_timeout, connect=connect_timeout)
        self._owns_client = client is None
        self._http: ModelHTTP = (
            model_http(self.base_url, timeout, tls_context(self.base_url))
            if client is None
            else ViaHttpx(client, timeout)
        )
        self._tool_texts = ToolTexts(self.convert_tool)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """The Provider method: one request, retried as the policy allows."""
        self._require_key()
        if not self.accepts_images:  # a note in each image's place, whoever added it
            request = request.replace(messages=images.without_images(request.messages))
        elif (fitting := images.newest(request.messages)) is not request.messages:
            request = request.replace(messages=fitting)
        body = self.build_body(request)
        async for event in stream_with_retries(lambda: self._attempt(body), self.retry, provider=self.name):
            yield event

    def build_body(self, request: ModelRequest) -> dict[str, Any]:
        """The request's body: JSON values, and `RawJSON` text (its tools, `_tool_texts`)."""
        raise NotImplementedError

    def convert_tool(self, tool: ToolSpec) -> dict[str, Any]:
        raise NotImplementedError

    # What a subclass's wire adds: the endpoint, its headers, and a fresh stream assembler.
    def _url(self) -> str:
        raise NotImplementedError

    def _headers(self) -> dict[str, str]:
        raise NotImplementedError

    def _new_stream(self) -> StreamAssembler:
        raise NotImplementedError

    async def _attempt(self, body: Mapping[str, Any]) -> AsyncIterator[ModelEvent]:
        """One streaming request: SSE events in, model events out, the response last."""
        stream = self._new_stream()
        produced = False
        decoder, lines = SSEDecoder(), SSELines()

        def events(texts: list[str]) -> list[ModelEvent]:
            out: list[ModelEvent] = []
            for line in texts:
                for sse in decoder.decode(line):
                    if not stream.ended:
                        out += stream.feed(sse.data)
            return out

        with map_http_errors(self.name, base_url=self.base_url):
            async with self._post_stream(self._url(), body, self._headers()) as response:
                # Read to the end of the body even after the last event: leaving early makes
                # httpx2 drop the connection instead of keeping it alive for the next call.
                try:
                    async for chunk in response.aiter_bytes():
                        for event in events(lines.feed(chunk)):
                            produced = True
                            yield event
                    for event in events(lines.flush()):
                        produced = True
                        yield event
                except TooLong as exc:
                    raise ProviderError(f"{self.name}: {exc}") from None
        if not stream.finished:
            raise StreamCutError(f"{self.name}: stream ended before the model finished", partial=produced)
        yield stream.response()

    def _stream_error(self, data: str) -> ProviderError:
        """An error the server reported inside a 200 stream."""
        return error_from_status(self.name, 0, data, api_key_env=self.api_key_env, api_key=self._api_key)

    def __repr__(self) -> str:  # never show the key
        return f"{type(self).__name__}(name={self.name!r}, model={self.model!r}, base_url={self.base_url!r})"

    def _require_key(self) -> None:
        if self._api_key is None and any(h in self.base_url for h in PUBLIC_HOSTS):
            raise MissingKeyError(f"{self.name}: no API key; set {self.api_key_env} or run `crow login`")

    @contextlib.asynccontextmanager
    async def _post_stream(
        self, url: str, body: Mapping[str, Any], headers: Mapping[str, str]
    ) -> AsyncIterator[Reply]:
        """POST and hand back a streaming 2xx response; error statuses raise mapped errors."""
        headers = dict(headers)
        if not any(name.lower() == "content-type" for name in headers):  # a configured one wins
            headers["Content-Type"] = "application/json"
        async with self._http.stream(url, headers, encode_body(body)) as response:
            if response.status_code >= 400:
                text = (await response.aread()).decode("utf-8", "replace")
                raise error_from_status(
                    self.name,
                    response.status_code,
                    text,
                    response.headers,
                    api_key_env=self.api_key_env,
                    api_key=self._api_key,
                )
            yield response

    async def aclose(self) -> None:
        if self._owns_client:
            await self._http.aclose()
