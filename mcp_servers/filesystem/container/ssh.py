"""`DOCKER_HOST=ssh://[USER@]HOST[:PORT]`, as the Docker CLI does it: every connection to the
engine is an `ssh HOST docker system dial-stdio` process whose stdin and stdout carry it.

The user's own ssh does the work (keys, agent, ~/.ssh/config, known hosts); `BatchMode`
keeps it from ever prompting, since crow's stdin and terminal belong to the editor. The
connections plug into httpx as an httpcore network backend, so pooling, the exec streams'
upgrades and timeouts work as on a socket.
"""

from __future__ import annotations

import subprocess
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.abc
import httpcore
import httpx

SSH_CONNECT_TIMEOUT = 5  # seconds for ssh to reach the host


def ssh_argv(host: str) -> list[str]:
    """The ssh command for `host` (ssh://[USER@]HOST[:PORT]); ValueError saying why not."""
    try:
        parts = urlsplit(host)
        port = parts.port
    except ValueError:
        raise ValueError("the port is not a number") from None
    if not parts.hostname:
        raise ValueError("no host name; use ssh://[USER@]HOST[:PORT]")
    if parts.path not in ("", "/") or parts.query or parts.password:
        raise ValueError("ssh:// takes only [USER@]HOST[:PORT]")
    argv = ["ssh", "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT}", "-o", "BatchMode=yes", "-T"]
    if parts.username:
        argv += ["-l", parts.username]
    if port:
        argv += ["-p", str(port)]
    return [*argv, "--", parts.hostname, "docker", "system", "dial-stdio"]


def ssh_transport(argv: list[str]) -> httpx.AsyncHTTPTransport:
    transport = httpx.AsyncHTTPTransport()
    # httpx has no public way to pass a network backend; its pool is this one otherwise.
    transport._pool = httpcore.AsyncConnectionPool(
        network_backend=_SshBackend(argv), max_connections=None, max_keepalive_connections=4,
        keepalive_expiry=30.0,  # an idle connection is an ssh process: keep few, not forever
    )  # fmt: skip
    return transport


class _SshBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, argv: list[str]) -> None:
        self._argv = argv

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, **_: Any) -> _SshStream:
        try:
            process = await anyio.open_process(
                self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True,  # a Ctrl-C at crow's terminal is crow's to handle
            )  # fmt: skip
        except OSError as exc:
            raise httpcore.ConnectError(f"cannot run ssh: {exc}") from exc
        return _SshStream(process)

    async def connect_unix_socket(self, path: str, timeout: float | None = None, **_: Any) -> _SshStream:
        raise httpcore.ConnectError("not over ssh")

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


class _SshStream(httpcore.AsyncNetworkStream):
    def __init__(self, process: anyio.abc.Process) -> None:
        self._process = process

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        assert self._process.stdout is not None
        try:
            with anyio.fail_after(timeout):
                return await self._process.stdout.receive(max_bytes)
        except anyio.EndOfStream:
            await self._raise_if_failed()
            return b""
        except TimeoutError as exc:
            raise httpcore.ReadTimeout("no answer through ssh") from exc
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            await self._raise_if_failed(wait=1)
            raise httpcore.ReadError(str(exc) or type(exc).__name__) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        assert self._process.stdin is not None
        try:
            with anyio.fail_after(timeout):
                await self._process.stdin.send(buffer)
        except TimeoutError as exc:
            raise httpcore.WriteTimeout("ssh did not take the request") from exc
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            await self._raise_if_failed(wait=1)
            raise httpcore.WriteError(str(exc) or type(exc).__name__) from exc

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            if self._process.returncode is None:
                self._process.kill()
            await self._process.aclose()

    def get_extra_info(self, info: str) -> Any:
        return self._half_close if info == "half_close" else None

    async def _half_close(self) -> None:
        assert self._process.stdin is not None
        await self._process.stdin.aclose()

    async def _raise_if_failed(self, wait: float = SSH_CONNECT_TIMEOUT) -> None:
        """ssh's own words when it exited with an error (cannot connect, no `docker` there);
        whichever of its pipes breaks first, they are the cause to report."""
        with anyio.move_on_after(wait):
            await self._process.wait()
        if self._process.returncode is None or self._process.returncode <= 0:  # < 0: we killed it
            return
        said = b""
        with anyio.move_on_after(1):
            assert self._process.stderr is not None
            while len(said) < 4096:
                try:
                    said += await self._process.stderr.receive()
                except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                    break
        text = " / ".join(said.decode(errors="replace").strip().splitlines()[-3:])
        raise httpcore.ReadError(f"ssh failed: {text or f'exit status {self._process.returncode}'}")
