"""How crow's model providers make their HTTP calls (`model_http`).

`Direct`: a streamed POST straight to crow's pool of httpcore2 connections
(`crow.llm.pool`), on crow's asyncio network backend (`crow.llm.sockets`). httpx2's
client around it (URL parsing and merging, cookies, auth and redirect machinery, event
hooks, response wrapping) was a sixth of crow's CPU at 50 busy sessions, for one shape
of request that needs none of it. `ViaHttpx`: the same call through an httpx2 client, when the
environment names a proxy (httpx applies it) or a caller gives its own client.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import ipaddress
import logging
import ssl
import typing
import urllib.request
from collections.abc import AsyncIterator, Mapping

import httpcore2
import httpx2

from crow.llm import sockets
from crow.llm.pool import Pool

log = logging.getLogger("crow.llm")
# One connection per model call in flight, each held for a whole streamed answer: httpx's
# default pool (100 connections, 20 kept idle) made the 101st busy session wait for another
# session's answer, and at 50 busy sessions opened a new connection for a fifth of the calls
# (100 handshakes per 500 turns). No cap: idle connections close after keepalive_expiry.
MODEL_LIMITS = httpx2.Limits(max_connections=None, max_keepalive_connections=None)


def model_http(base_url: str, timeout: httpx2.Timeout, verify: ssl.SSLContext | bool) -> ModelHTTP:
    """How a provider makes its calls: `Direct`, or, when the environment names a proxy for
    `base_url`, through httpx's own client, which applies it. A proxy httpx cannot use
    (socks without socksio, a bad URL) is warned about and not used."""
    if proxied(base_url):
        try:
            return ViaHttpx(httpx2.AsyncClient(timeout=timeout, verify=verify, limits=MODEL_LIMITS), timeout)
        except (ImportError, ValueError, httpx2.InvalidURL) as exc:
            log.warning("the environment's proxy cannot be used for %s (%s): going direct", base_url, exc)
    return Direct(timeout, verify)


def proxied(base_url: str) -> bool:
    """Whether the environment names a proxy (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY; NO_PROXY is
    httpx's to apply) for a model that is not on this machine: then httpx's client makes
    the call, and applies it. A model server on this machine (localhost, a loopback address,
    0.0.0.0) is never reached through one."""
    try:
        host = httpx2.URL(base_url).host
    except (httpx2.InvalidURL, ValueError):
        return False  # its request fails with a clear error (map_http_errors)
    if host.rstrip(".").lower() == "localhost":
        return False  # a model server on this machine: never through a proxy
    with contextlib.suppress(ValueError):  # not an address: a name
        address = ipaddress.ip_address(host)
        if address.is_loopback or address.is_unspecified:
            return False
    return bool({"http", "https", "all"} & urllib.request.getproxies().keys())


class Reply(typing.Protocol):
    """What a provider reads of a streamed answer: an httpx2.Response, or `_Reply`."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    def aiter_bytes(self) -> AsyncIterator[bytes]: ...

    async def aread(self) -> bytes: ...


class ModelHTTP(typing.Protocol):
    def stream(
        self, url: str, headers: Mapping[str, str], content: bytes
    ) -> typing.AsyncContextManager[Reply]: ...

    async def aclose(self) -> None: ...


class ViaHttpx:
    """A model's requests through an httpx2 client (a proxy's, or one a caller gave)."""

    def __init__(self, client: httpx2.AsyncClient, timeout: httpx2.Timeout) -> None:
        self._client, self._timeout = client, timeout

    def stream(
        self, url: str, headers: Mapping[str, str], content: bytes
    ) -> typing.AsyncContextManager[Reply]:
        return self._client.stream("POST", url, content=content, headers=headers, timeout=self._timeout)

    async def aclose(self) -> None:
        await self._client.aclose()


@functools.lru_cache(maxsize=64)
def _target(url: str) -> tuple[httpcore2.URL, bytes, bytes | None]:
    """httpcore2's URL for `url` (parsed and checked by httpx2), its Host header, and the
    Basic credentials its `user:password@` gives, as httpx's client sent them."""
    if "://" not in url:  # `localhost:11434/v1` parses as the scheme "localhost"
        raise httpcore2.UnsupportedProtocol("Request URL is missing an 'http://' or 'https://' protocol.")
    parsed = httpx2.URL(url)
    if parsed.port is not None and not 0 < parsed.port < 65536:  # asyncio would raise IndexError
        raise httpx2.InvalidURL(f"Invalid port: {parsed.port}")
    target = httpcore2.URL(
        scheme=parsed.raw_scheme, host=parsed.raw_host, port=parsed.port, target=parsed.raw_path
    )
    auth = None
    if parsed.userinfo:  # as httpx's client did: user:password@ in the URL is Basic auth
        auth = b"Basic " + base64.b64encode(f"{parsed.username}:{parsed.password}".encode())
    return target, parsed.netloc, auth


# What a request carries unless the provider's headers say otherwise: httpx's defaults,
# but no compression asked for (an answer compressed anyway is decoded: `_Reply`).
_DEFAULT_HEADERS = {
    "accept": (b"Accept", b"*/*"),
    "accept-encoding": (b"Accept-Encoding", b"identity"),
    "connection": (b"Connection", b"keep-alive"),
    "user-agent": (b"User-Agent", f"python-httpx2/{httpx2.__version__}".encode()),
}


class Direct:
    """A model's POSTs straight to crow's pool. Errors are httpcore2's, which
    `map_http_errors` maps as it maps httpx2's."""

    def __init__(self, timeout: httpx2.Timeout, verify: ssl.SSLContext | bool) -> None:
        context = httpx2.create_ssl_context(verify=verify)
        self._pool = Pool(context, MODEL_LIMITS.keepalive_expiry, sockets.Backend())
        self._extensions = {"timeout": timeout.as_dict()}

    @contextlib.asynccontextmanager
    async def stream(self, url: str, headers: Mapping[str, str], content: bytes) -> AsyncIterator[Reply]:
        target, host, auth = _target(url)
        given = {
            name.lower(): (name.encode("ascii"), value.encode("ascii")) for name, value in headers.items()
        }
        defaults = {"host": (b"Host", host), "content-length": (b"Content-Length", b"%d" % len(content))}
        if auth is not None:
            given["authorization"] = (b"Authorization", auth)
        raw = [pair for key, pair in (defaults | _DEFAULT_HEADERS).items() if key not in given]
        raw += given.values()
        request = httpcore2.Request(
            b"POST", target, headers=raw, content=content, extensions=self._extensions
        )
        response = await self._pool.handle_async_request(request)
        reply = _Reply(response)
        try:
            yield reply
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        await self._pool.aclose()


class _Reply:
    """A streamed answer from the pool, as a provider reads it (`Reply`)."""

    def __init__(self, response: httpcore2.Response) -> None:
        self._response = response
        self.status_code = response.status
        self.headers = {
            name.decode("latin-1").lower(): value.decode("latin-1") for name, value in response.headers
        }

    def aiter_bytes(self) -> AsyncIterator[bytes]:
        if self.headers.get("content-encoding", "identity") != "identity":  # unasked: httpx2 decodes
            return httpx2.Response(
                self.status_code, headers=self._response.headers, stream=_Body(self._response)
            ).aiter_bytes()
        return self._response.stream.__aiter__()  # type: ignore[union-attr]

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_bytes()])


class _Body(httpx2.AsyncByteStream):
    def __init__(self, response: httpcore2.Response) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._response.stream:  # type: ignore[union-attr]
            yield chunk
