"""The Docker Engine API over httpx: one client for Docker and Podman, local or remote.

The container backend needs about a dozen endpoints (ping, image inspect, container
create/start/inspect/list/remove, exec create/start/inspect, archive in and out), so this
speaks them directly instead of pulling in the docker SDK (sync, on requests: a thread per
call, and its ssh needs paramiko). `DOCKER_HOST` is read as the Docker CLI reads it.

Every failure becomes an `EngineError` whose message says what failed and what to do; a
404 is `NotFound`. A process started with `exec_stream` is an `ExecStream` (execstream.py)
over the connection its exec-start request was upgraded to.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import anyio
import httpx

from mcp_servers.filesystem.container.execstream import ExecStream, StreamBroken, UpgradedConnection
from mcp_servers.filesystem.container.ssh import ssh_argv, ssh_transport

__all__ = ["DockerEngine", "EngineError", "ExecStream", "NotFound", "StreamBroken", "negotiate_version"]

API_VERSION = "1.41"  # what Podman 4 serves, and Docker since 20.10
NEWEST_API_VERSION = "1.44"  # Docker 29 refuses anything older; every Docker since 25 serves it
CONNECT_TIMEOUT = 3.0  # seconds: an engine that is down must not hold up a tool call
REQUEST_TIMEOUT = 120.0  # seconds of silence on a request (big archives, slow removes)
MAX_ANSWER = 64 << 20  # bytes of one API answer (JSON; a container list is far smaller)
DEFAULT_SOCKETS = ("/var/run/docker.sock", "/run/podman/podman.sock")


class EngineError(Exception):
    """The container engine could not be reached or refused a request; the message says
    what failed and what to do."""


class NotFound(EngineError):
    """The engine answered 404: no such container, image, exec or path."""


class DockerEngine:
    """One container engine. `host` names it in messages; `is_local` says whether it runs
    on this machine (a unix socket), so bind mounts of this machine's folders work."""

    def __init__(
        self, host: str, transport: httpx.AsyncBaseTransport, base_url: str, *, is_local: bool
    ) -> None:
        self.host = host
        self.is_local = is_local
        self.tls = base_url.startswith("https:")
        timeout = httpx.Timeout(REQUEST_TIMEOUT, connect=CONNECT_TIMEOUT)
        self._client = httpx.AsyncClient(transport=transport, base_url=base_url, timeout=timeout)
        self._prefix: str | None = None  # "/v1.41": settled by the first request's ping
        self._podman = False  # the ping says (is_podman)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DockerEngine:
        """The engine `DOCKER_HOST` names (`unix://`, `tcp://`, `ssh://`), with `DOCKER_TLS_VERIFY`,
        `DOCKER_TLS` and `DOCKER_CERT_PATH` as the Docker CLI reads them."""
        env = os.environ if env is None else env
        host = env.get("DOCKER_HOST", "").strip()
        if not host:
            path = next((p for p in DEFAULT_SOCKETS if os.path.exists(p)), DEFAULT_SOCKETS[0])
            host = f"unix://{path}"
        scheme, _, rest = host.partition("://")
        if scheme == "unix" and rest:
            limits = httpx.Limits(max_connections=None)
            return cls(
                host, httpx.AsyncHTTPTransport(uds=rest, limits=limits), "http://docker", is_local=True
            )
        if scheme == "tcp" and rest:
            return _tcp_engine(host, env)
        if scheme == "ssh":
            try:
                argv = ssh_argv(host)
            except ValueError as exc:
                raise EngineError(f"DOCKER_HOST={host}: {exc}") from None
            return cls(host, ssh_transport(argv), "http://docker", is_local=False)
        raise EngineError(
            f"DOCKER_HOST={host!r} is not an engine address; use unix:///var/run/docker.sock or "
            "tcp://HOST:PORT (with DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH for TLS) or ssh://[USER@]HOST[:PORT]"
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    # -- the API ---------------------------------------------------------------------------

    async def ping(self) -> None:
        """Raises `EngineError` unless the engine answers."""
        self._prefix = None
        await self._api_prefix()

    async def image_exists(self, name: str) -> bool:
        try:
            await self._request("GET", f"/images/{_path(name)}/json", f"looking up image {name}")
        except NotFound:
            return False
        return True

    async def create_container(self, spec: dict[str, Any], name: str | None = None) -> str:
        """A new container from `spec` (the Docker create body); its id."""
        params = {"name": name} if name else None
        image = spec.get("Image")
        try:
            resp = await self._request(
                "POST", "/containers/create", "creating a container", params=params, json=spec
            )
        except NotFound:
            if isinstance(image, str) and not await self.image_exists(image):
                raise NotFound(
                    f"image {image} is not on the engine at {self.host}; pull it (`docker pull {image}` / "
                    f"`podman pull {image}`) or build it"
                ) from None
            raise
        return _id(resp, "creating a container")

    async def start(self, container: str) -> None:
        await self._request("POST", f"/containers/{_path(container)}/start", "starting the container")

    async def inspect(self, container: str) -> dict[str, Any] | None:
        """The container's state and config; None when it is gone."""
        try:
            resp = await self._request(
                "GET", f"/containers/{_path(container)}/json", "inspecting the container"
            )
        except NotFound:
            return None
        return _json(resp, "inspecting the container")

    async def remove(self, container: str) -> None:
        """Kill and remove it at once (no stop grace); a container already gone is fine."""
        # force: SIGKILL then remove, on Docker and Podman alike (~0.1 s, no stop timeout).
        params = {"force": "true", "v": "true"}
        with contextlib.suppress(NotFound):
            await self._request(
                "DELETE", f"/containers/{_path(container)}", "removing the container", params=params
            )

    async def list_containers(self, labels: Mapping[str, str | None]) -> list[dict[str, Any]]:
        """Containers in any state carrying every label (`None`: any value)."""
        wanted = [name if value is None else f"{name}={value}" for name, value in labels.items()]
        params = {"all": "true", "filters": json.dumps({"label": wanted})}
        resp = await self._request("GET", "/containers/json", "listing containers", params=params)
        found = _json(resp, "listing containers")
        if not isinstance(found, list):
            raise EngineError(f"listing containers: the engine at {self.host} answered {found!r:.200}")
        return found

    async def exec_stream(
        self, container: str, cmd: list[str], *, env: Mapping[str, str] | None = None,
        workdir: str | None = None, user: str | None = None,
    ) -> ExecStream:  # fmt: skip
        """`cmd` running in the container, its stdin, stdout and stderr on one connection."""
        what = f"starting {cmd[0]!r} in the container" if cmd else "exec"
        return await self._exec(container, cmd, env, workdir, user, stdin=True, what=what)

    async def exec_run(
        self, container: str, cmd: list[str], *, env: Mapping[str, str] | None = None,
        workdir: str | None = None, user: str | None = None, max_output: int = 1024 * 1024,
    ) -> tuple[int, bytes, bytes]:  # fmt: skip
        """Run `cmd` to its end with no stdin: (exit code, the first `max_output` bytes of
        stdout, the last 64 KB of stderr). For one-shot setup steps, not the model's commands."""
        what = f"running {cmd[0]!r} in the container" if cmd else "exec"
        out = bytearray()
        async with await self._exec(container, cmd, env, workdir, user, stdin=False, what=what) as stream:
            with contextlib.suppress(anyio.EndOfStream):
                while True:
                    chunk = await stream.receive()
                    out += chunk[: max(0, max_output - len(out))]
        return await self._exit_code(stream.exec_id, what), bytes(out), stream.stderr_tail

    async def put_archive(self, container: str, path: str, tar: bytes) -> None:
        """Unpack `tar` into the folder `path` in the container (Docker answers 404 when it
        does not exist; Podman 4 creates it)."""
        await self._request(
            "PUT", f"/containers/{_path(container)}/archive", f"copying files into {path}",
            params={"path": path}, content=tar, headers={"Content-Type": "application/x-tar"},
        )  # fmt: skip

    async def get_archive(self, container: str, path: str, *, max_bytes: int | None = None) -> bytes:
        """`path` in the container (file or folder) as a tar archive; `EngineError` once it
        grows past `max_bytes` (what the model made there can be any size)."""
        what = f"copying {path} out"
        url = f"{await self._api_prefix()}/containers/{_path(container)}/archive"
        data = bytearray()
        with self._errors(what):
            async with self._client.stream("GET", url, params={"path": path}) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    raise self._status_error(resp, what)
                async for chunk in resp.aiter_raw():
                    data += chunk
                    if max_bytes is not None and len(data) > max_bytes:
                        raise EngineError(f"{what}: the archive is larger than {max_bytes} bytes")
        return bytes(data)

    # -- plumbing ----------------------------------------------------------------------------

    async def _exec(
        self, container: str, cmd: list[str], env: Mapping[str, str] | None,
        workdir: str | None, user: str | None, *, stdin: bool, what: str,
    ) -> ExecStream:  # fmt: skip
        if not cmd:
            raise ValueError("exec needs a command")
        body: dict[str, Any] = {
            "AttachStdin": stdin, "AttachStdout": True, "AttachStderr": True, "Tty": False, "Cmd": list(cmd),
        }  # fmt: skip
        if env:
            body["Env"] = [f"{k}={v}" for k, v in env.items()]
        if workdir:
            body["WorkingDir"] = workdir
        if user:
            body["User"] = user
        resp = await self._request("POST", f"/containers/{_path(container)}/exec", what, json=body)
        exec_id = _id(resp, what)
        prefix = await self._api_prefix()
        request = self._client.build_request(
            "POST", f"{prefix}/exec/{exec_id}/start", json={"Detach": False, "Tty": False},
            headers={"Connection": "Upgrade", "Upgrade": "tcp"},
        )  # fmt: skip
        with self._errors(what):
            response = await self._client.send(request, stream=True)
        if response.status_code != 101:
            with self._errors(what):
                await response.aread()
            await response.aclose()
            if response.status_code >= 400:
                raise self._status_error(response, what)
            raise EngineError(f"{what}: the engine at {self.host} did not upgrade the connection "
                              f"(answered {response.status_code})")  # fmt: skip
        return ExecStream(UpgradedConnection(response), exec_id)

    async def _exit_code(self, exec_id: str, what: str) -> int:
        # The stream can end a moment before the engine records the exit.
        delay = 0.005
        with anyio.move_on_after(10):
            while True:
                resp = await self._request("GET", f"/exec/{exec_id}/json", what)
                state = _json(resp, what)
                if (
                    isinstance(state, dict)
                    and not state.get("Running")
                    and isinstance(state.get("ExitCode"), int)
                ):
                    return state["ExitCode"]
                await anyio.sleep(delay)
                delay = min(delay * 2, 0.2)
        raise EngineError(f"{what}: the engine at {self.host} did not report the exit code")

    async def _api_prefix(self) -> str:
        if self._prefix is None:
            resp = await self._send("GET", "/_ping", "connecting")
            if resp.status_code != 200:
                raise self._unreachable(f"/_ping answered {resp.status_code}: not a Docker or Podman engine")
            self._prefix = f"/v{negotiate_version(resp.headers.get('API-Version'))}"
            self._podman = "Libpod-API-Version" in resp.headers
        return self._prefix

    async def is_podman(self) -> bool:
        """Whether the engine is Podman (its /_ping says Libpod): its tmpfs mounts copy up
        what lay beneath unless told not to (spec.create_body's masks)."""
        await self._api_prefix()
        return self._podman

    async def _request(self, method: str, path: str, what: str, **kwargs: Any) -> httpx.Response:
        resp = await self._send(method, await self._api_prefix() + path, what, **kwargs)
        if resp.status_code >= 400:
            raise self._status_error(resp, what)
        return resp

    async def _send(self, method: str, url: str, what: str, **kwargs: Any) -> httpx.Response:
        """One API call, its answer read whole. DOCKER_HOST may name anything: an answer is
        cut at MAX_ANSWER bytes, and a server dripping a byte at a time (each read within
        the timeout) is stopped at REQUEST_TIMEOUT, counted from the headers (or from the
        start when there is no upload, which may take long)."""
        request = self._client.build_request(method, url, **kwargs)
        try:
            with self._errors(what):
                with anyio.fail_after(None if "content" in kwargs else REQUEST_TIMEOUT):
                    resp = await self._client.send(request, stream=True)
                try:
                    body = bytearray()
                    with anyio.fail_after(REQUEST_TIMEOUT):
                        async for chunk in resp.aiter_bytes():
                            body += chunk
                            if len(body) > MAX_ANSWER:
                                raise EngineError(
                                    f"{what}: the engine at {self.host} answered more than "
                                    f"{MAX_ANSWER >> 20} MB: is it a Docker or Podman engine?"
                                )
                finally:
                    await resp.aclose()
        except TimeoutError:
            raise EngineError(
                f"{what}: the container engine at {self.host} did not answer within {REQUEST_TIMEOUT:.0f} s"
            ) from None
        headers = [(k, v) for k, v in resp.headers.multi_items() if k.lower() != "content-encoding"]
        return httpx.Response(resp.status_code, headers=headers, content=bytes(body), request=request)

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """httpx's errors as `EngineError`s that say what to do."""
        try:
            yield
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol) as exc:
            raise self._unreachable(_why(exc)) from None
        except httpx.TimeoutException:
            raise EngineError(
                f"{what}: the container engine at {self.host} did not answer within {REQUEST_TIMEOUT:.0f} s"
            ) from None
        except httpx.TransportError as exc:
            if what == "connecting":  # e.g. a TLS engine refusing our certificate after the handshake
                raise self._unreachable(_why(exc)) from None
            raise EngineError(
                f"{what}: the connection to the container engine at {self.host} broke: {_why(exc)}"
            ) from None

    def _unreachable(self, why: str) -> EngineError:
        todo = (
            "check that it runs and accepts the certificates in DOCKER_CERT_PATH (ca.pem, cert.pem, key.pem)"
            if self.tls
            else "start Docker or Podman (`podman system service`), or set DOCKER_HOST"
        )
        return EngineError(f"cannot reach the container engine at {self.host}: {why}; {todo}")

    def _status_error(self, resp: httpx.Response, what: str) -> EngineError:
        try:
            message = str(resp.json().get("message") or "")
        except (ValueError, AttributeError):
            message = resp.text
        message = message.strip()[:500] or resp.reason_phrase
        if resp.status_code == 404:
            return NotFound(f"{what}: {message}")
        return EngineError(f"{what}: the engine at {self.host} answered {resp.status_code}: {message}")


def negotiate_version(server: str | None) -> str:
    """The API version to speak: the server's newest, capped at NEWEST_API_VERSION (what
    the calls here are written against); API_VERSION when the server does not say."""
    try:
        major, minor = (int(part) for part in (server or "").split("."))
    except ValueError:
        return API_VERSION
    newest = tuple(int(part) for part in NEWEST_API_VERSION.split("."))
    return NEWEST_API_VERSION if (major, minor) >= newest else f"{major}.{minor}"


def _tcp_engine(host: str, env: Mapping[str, str]) -> DockerEngine:
    verify = env.get("DOCKER_TLS_VERIFY", "") != ""  # the CLI's rule: any value, even 0, is on
    tls = verify or env.get("DOCKER_TLS", "") != ""
    parts = urlsplit(host)
    try:
        port = parts.port or (2376 if tls else 2375)
    except ValueError:
        raise EngineError(f"DOCKER_HOST={host}: the port is not a number") from None
    if not parts.hostname:
        raise EngineError(f"DOCKER_HOST={host}: no host name; use tcp://HOST:PORT")
    name = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    limits = httpx.Limits(max_connections=None)
    if not tls:
        return DockerEngine(
            host, httpx.AsyncHTTPTransport(limits=limits), f"http://{name}:{port}", is_local=False
        )
    certs = Path(env.get("DOCKER_CERT_PATH") or Path.home() / ".docker")
    ca, cert, key = certs / "ca.pem", certs / "cert.pem", certs / "key.pem"
    try:
        # Like the CLI: the CA and client certificate files are used where they exist.
        context = ssl.create_default_context(cafile=str(ca) if verify and ca.is_file() else None)
        if not verify:  # DOCKER_TLS alone: encrypted, the engine's certificate not checked
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if cert.is_file() and key.is_file():
            context.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise EngineError(f"DOCKER_CERT_PATH={certs}: cannot load the TLS certificates: {exc}") from None
    transport = httpx.AsyncHTTPTransport(verify=context, limits=limits)
    return DockerEngine(host, transport, f"https://{name}:{port}", is_local=False)


def _path(part: str) -> str:
    return quote(part, safe="/:@")


def _json(resp: httpx.Response, what: str) -> Any:
    try:
        return resp.json()
    except ValueError:
        raise EngineError(
            f"{what}: the engine answered something that is not JSON: {resp.text[:200]!r}"
        ) from None


def _id(resp: httpx.Response, what: str) -> str:
    body = _json(resp, what)
    ident = body.get("Id") if isinstance(body, dict) else None
    if not isinstance(ident, str) or not ident:
        raise EngineError(f"{what}: the engine answered without an id: {body!r:.200}")
    return ident


def _why(exc: BaseException) -> str:
    """The cause of a connection failure, in words: a known root cause, else the first
    message along the chain of causes (the outermost says the most)."""
    if isinstance(exc, httpx.ConnectTimeout):
        return f"no answer within {CONNECT_TIMEOUT:.0f} s"
    words = ""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, FileNotFoundError):
            return "no socket there"
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, PermissionError):
            return "permission denied (is this user allowed to use the engine's socket?)"
        if isinstance(cause, ssl.SSLError):
            return f"TLS failed: {cause.reason or cause}"
        words = words or str(cause)
        cause = cause.__cause__ or cause.__context__
    return words or type(exc).__name__
