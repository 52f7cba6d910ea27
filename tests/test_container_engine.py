"""DockerEngine against a real Podman serving the Docker Engine API: on its unix socket, on
tcp://, over TLS through a TLS-terminating proxy with client certificates, and over ssh://
through a real sshd. The exec stream's demultiplexer is also driven over a socket pair, by
a peer that sends garbage."""

from __future__ import annotations

import contextlib
import getpass
import io
import os
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from anyio.streams.tls import TLSListener

from mcp_servers.filesystem.container import engine as engine_module
from mcp_servers.filesystem.container.engine import (
    DockerEngine,
    EngineError,
    ExecStream,
    NotFound,
    StreamBroken,
    negotiate_version,
)

pytestmark = pytest.mark.anyio

UNREACHABLE = "; start Docker or Podman (`podman system service`), or set DOCKER_HOST"
CERTS = (
    r"; check that it runs and accepts the certificates in DOCKER_CERT_PATH \(ca\.pem, cert\.pem, key\.pem\)"
)


def _spec(podman: Any, **labels: str) -> dict[str, Any]:
    return {"Image": podman.image, "Cmd": ["sleep", "infinity"], "Labels": {**podman.labels, **labels}}


@contextlib.asynccontextmanager
async def _running(eng: DockerEngine, podman: Any, **labels: str) -> AsyncIterator[str]:
    cid = await eng.create_container(_spec(podman, **labels))
    try:
        await eng.start(cid)
        yield cid
    finally:
        await eng.remove(cid)


async def _read_exactly(stream: ExecStream, size: int) -> bytes:
    got = b""
    with anyio.fail_after(30):
        while len(got) < size:
            got += await stream.receive()
    return got


async def _read_to_end(stream: ExecStream) -> bytes:
    got = b""
    with anyio.fail_after(30):
        while True:
            try:
                got += await stream.receive()
            except anyio.EndOfStream:
                return got


async def _round_trip(eng: DockerEngine, podman: Any) -> None:
    """create, start, a process's stdin/stdout/stderr both ways, its end, remove (no
    half-close: TLS has none)."""
    async with _running(eng, podman) as cid:
        stream = await eng.exec_stream(cid, ["sh", "-c", "echo warming >&2; head -c 5; echo bye >&2"])
        async with stream:
            await stream.send(b"ping\n")
            assert await _read_to_end(stream) == b"ping\n"
        assert stream.stderr_tail == b"warming\nbye\n"


async def test_ping_and_image_exists(engine: DockerEngine, podman: Any) -> None:
    await engine.ping()
    assert engine.is_local
    assert await engine.image_exists(podman.image)
    assert not await engine.image_exists("localhost/no-such-image:never")


async def test_create_start_inspect_and_a_process_both_ways(engine: DockerEngine, podman: Any) -> None:
    async with _running(engine, podman) as cid:
        info = await engine.inspect(cid)
        assert info is not None and info["State"]["Running"] and info["Config"]["Labels"]["crow.test"] == podman.token
        stream = await engine.exec_stream(cid, ["sh", "-c", "echo warming >&2; cat; echo bye >&2"])
        async with stream:
            for message in (b"ping\n", b"\x00\x01binary\xff" * 1000):
                await stream.send(message)
                assert await _read_exactly(stream, len(message)) == message
            await stream.send_eof()  # cat sees the end of its input, sh exits
            assert await _read_to_end(stream) == b""
            with pytest.raises(anyio.EndOfStream):
                await stream.receive()
        assert stream.stderr_tail == b"warming\nbye\n"

        # A process that exits by itself ends the stream too.
        async with await engine.exec_stream(cid, ["head", "-c", "4"]) as stream:
            await stream.send(b"abcdefgh")
            assert await _read_to_end(stream) == b"abcd"


async def test_exec_run_reports_exit_code_output_env_workdir_and_user(
    engine: DockerEngine, podman: Any
) -> None:
    async with _running(engine, podman) as cid:
        assert await engine.exec_run(cid, ["sh", "-c", "echo out; echo err >&2; exit 3"]) == (
            3,
            b"out\n",
            b"err\n",
        )
        code, out, _ = await engine.exec_run(
            cid, ["sh", "-c", 'pwd; echo "$FOO"; id -u'], env={"FOO": "bar baz"}, workdir="/tmp", user="65534"
        )
        assert (code, out) == (0, b"/tmp\nbar baz\n65534\n")
        code, out, _ = await engine.exec_run(cid, ["head", "-c", "3000000", "/dev/zero"], max_output=1000)
        assert (code, out) == (0, b"\0" * 1000)
        code, out, err = await engine.exec_run(cid, ["/no/such/program"])
        assert (code, out) == (127, b"") and b'"/no/such/program"' in err
    with pytest.raises(NotFound, match=r"^running 'true' in the container: no container"):
        await engine.exec_run(cid, ["true"])  # removed


async def test_put_archive_then_get_archive(engine: DockerEngine, podman: Any) -> None:
    data = b"hello from the host\n" * 100
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("dir/note.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    async with _running(engine, podman) as cid:
        await engine.put_archive(cid, "/tmp", buf.getvalue())
        assert (await engine.exec_run(cid, ["cat", "/tmp/dir/note.txt"]))[1] == data
        archive = await engine.get_archive(cid, "/tmp/dir/note.txt")
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            member = tar.extractfile("note.txt")
            assert member is not None and member.read() == data
        with pytest.raises(NotFound):
            await engine.get_archive(cid, "/no/such/file")
        assert len(await engine.get_archive(cid, "/tmp/dir", max_bytes=10_000)) <= 10_000
        with pytest.raises(
            EngineError, match=r"^copying /tmp/dir out: the archive is larger than 1000 bytes$"
        ):
            await engine.get_archive(cid, "/tmp/dir", max_bytes=1000)


async def test_list_containers_by_label_in_any_state(engine: DockerEngine, podman: Any) -> None:
    run = uuid.uuid4().hex
    async with _running(engine, podman, **{"crow.run": run, "crow.role": "a"}) as running:
        stopped = await engine.create_container(_spec(podman, **{"crow.run": run}))  # never started
        try:
            found = await engine.list_containers({"crow.run": run})
            assert sorted(c["Id"] for c in found) == sorted([running, stopped])
            assert [c["Id"] for c in await engine.list_containers({"crow.run": run, "crow.role": None})] == [
                running
            ]
            assert await engine.list_containers({"crow.run": run, "crow.role": "b"}) == []
        finally:
            await engine.remove(stopped)
        assert [c["Id"] for c in await engine.list_containers({"crow.run": run})] == [running]


async def test_remove_is_idempotent_and_a_removed_container_inspects_as_none(
    engine: DockerEngine, podman: Any
) -> None:
    cid = await engine.create_container(_spec(podman))
    await engine.start(cid)
    await engine.remove(cid)
    await engine.remove(cid)
    await engine.remove("no-such-container")
    assert await engine.inspect(cid) is None
    assert podman.containers(f"id={cid}") == []
    with pytest.raises(NotFound):
        await engine.start(cid)


async def test_a_missing_image_is_not_found_with_how_to_get_it(engine: DockerEngine, podman: Any) -> None:
    image = "localhost/crow-missing:1"
    with pytest.raises(NotFound) as caught:
        await engine.create_container({"Image": image, "Labels": podman.labels})
    assert str(caught.value) == (
        f"image {image} is not on the engine at {podman.docker_host}; pull it (`docker pull {image}` / "
        f"`podman pull {image}`) or build it"
    )
    assert podman.containers(f"label=crow.test={podman.token}", "status=created") == []


@pytest.mark.parametrize("method", ["ping", "image_exists", "create"])
async def test_an_engine_that_is_not_there_is_a_clear_error(tmp_path: Path, method: str) -> None:
    host = f"unix://{tmp_path}/nothing.sock"
    async with _closing(DockerEngine.from_env({"DOCKER_HOST": host})) as eng:
        with pytest.raises(EngineError) as caught:
            if method == "ping":
                await eng.ping()
            elif method == "image_exists":
                await eng.image_exists("x")
            else:
                await eng.create_container({"Image": "x"})
    assert str(caught.value) == f"cannot reach the container engine at {host}: no socket there{UNREACHABLE}"


async def test_a_closed_tcp_port_is_a_clear_error() -> None:
    port = _free_port()
    host = f"tcp://127.0.0.1:{port}"
    async with _closing(DockerEngine.from_env({"DOCKER_HOST": host})) as eng:
        assert not eng.is_local
        with pytest.raises(EngineError) as caught:
            await eng.exec_stream("x", ["true"])
    assert (
        str(caught.value) == f"cannot reach the container engine at {host}: connection refused{UNREACHABLE}"
    )


async def test_a_server_that_is_not_an_engine_is_a_clear_error() -> None:
    async def answer(conn: anyio.abc.ByteStream) -> None:
        async with conn:
            await conn.receive()
            await conn.send(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    host = f"tcp://127.0.0.1:{listener.extra(anyio.abc.SocketAttribute.local_port)}"
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, answer)
        async with _closing(DockerEngine.from_env({"DOCKER_HOST": host})) as eng:
            with pytest.raises(EngineError) as caught:
                await eng.create_container({"Image": "x"})
        tg.cancel_scope.cancel()
    assert str(caught.value) == (
        f"cannot reach the container engine at {host}: /_ping answered 404: not a Docker or Podman engine{UNREACHABLE}"
    )


async def test_over_tcp(podman: Any, tmp_path: Path) -> None:
    port = _free_port()
    with _service(podman, f"tcp://127.0.0.1:{port}", tmp_path):
        async with _closing(DockerEngine.from_env({"DOCKER_HOST": f"tcp://127.0.0.1:{port}"})) as eng:
            await _wait_for(eng)
            await _round_trip(eng, podman)


async def test_an_engine_that_goes_down_ends_the_stream_and_later_calls_say_so(
    podman: Any, tmp_path: Path
) -> None:
    port = _free_port()
    host = f"tcp://127.0.0.1:{port}"
    async with _closing(DockerEngine.from_env({"DOCKER_HOST": host})) as eng, _running_via(podman) as cid:
        with _service(podman, host, tmp_path) as service:
            await _wait_for(eng)
            stream = await eng.exec_stream(cid, ["cat"])
            await stream.send(b"up")
            assert await _read_exactly(stream, 2) == b"up"
            service.terminate()  # the stream ends like a process that exited: the caller re-execs
            with anyio.fail_after(30), pytest.raises(anyio.EndOfStream):
                await stream.receive()
            await stream.aclose()
        with pytest.raises(EngineError) as caught:
            await eng.inspect(cid)
    assert (
        str(caught.value) == f"cannot reach the container engine at {host}: connection refused{UNREACHABLE}"
    )


async def test_over_tls_with_client_certificates(podman: Any, tmp_path: Path) -> None:
    import trustme

    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    client = ca.issue_cert("crow-client")
    certs = tmp_path / "certs"
    certs.mkdir()
    ca.cert_pem.write_to_path(str(certs / "ca.pem"))
    client.cert_chain_pems[0].write_to_path(str(certs / "cert.pem"))
    client.private_key_pem.write_to_path(str(certs / "key.pem"))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.configure_cert(context)
    ca.configure_trust(context)
    context.verify_mode = ssl.CERT_REQUIRED  # the proxy, like dockerd --tlsverify, wants a client cert

    async with _tls_proxy(context, podman.socket) as port:
        env = {
            "DOCKER_HOST": f"tcp://127.0.0.1:{port}",
            "DOCKER_TLS_VERIFY": "1",
            "DOCKER_CERT_PATH": str(certs),
        }
        async with _closing(DockerEngine.from_env(env)) as eng:
            await _round_trip(eng, podman)

        # Without the client certificate the engine refuses the connection.
        (certs / "key.pem").unlink()
        async with _closing(DockerEngine.from_env(env)) as eng:
            with pytest.raises(
                EngineError,
                match=rf"^cannot reach the container engine at tcp://127\.0\.0\.1:{port}: .*{CERTS}$",
            ):
                await eng.ping()

        # An engine whose certificate this CA did not sign is not trusted.
        other = tmp_path / "other"
        other.mkdir()
        trustme.CA().cert_pem.write_to_path(str(other / "ca.pem"))
        async with _closing(DockerEngine.from_env({**env, "DOCKER_CERT_PATH": str(other)})) as eng:
            with pytest.raises(EngineError, match=rf": TLS failed: CERTIFICATE_VERIFY_FAILED{CERTS}$"):
                await eng.ping()


async def test_over_ssh_through_docker_dial_stdio(podman: Any, sshd: str) -> None:
    async with _closing(DockerEngine.from_env({"DOCKER_HOST": sshd})) as eng:
        assert not eng.is_local
        await _round_trip(eng, podman)
        async with _running(eng, podman) as cid, await eng.exec_stream(cid, ["cat"]) as stream:
            await stream.send(b"over ssh")
            assert await _read_exactly(stream, 8) == b"over ssh"
            await stream.send_eof()  # ssh's stdin closed: cat ends
            assert await _read_to_end(stream) == b""


async def test_ssh_that_cannot_connect_says_why(sshd: str) -> None:
    host = f"ssh://nobody@127.0.0.1:{_free_port()}"
    async with _closing(DockerEngine.from_env({"DOCKER_HOST": host})) as eng:
        with pytest.raises(EngineError) as caught:
            await eng.ping()
    assert str(caught.value) == (
        f"cannot reach the container engine at {host}: ssh failed: ssh: connect to host 127.0.0.1 port "
        f"{host.rsplit(':', 1)[1]}: Connection refused{UNREACHABLE}"
    )


async def test_ssh_failure_is_reported_in_its_own_words_even_when_its_stdin_broke_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An ssh that closes its stdin, then fails: the request's write breaks before the read
    # sees the end, so the broken pipe must not hide what ssh said (the race the real ssh
    # in the test above loses now and then, made certain).
    _script(
        tmp_path / "ssh",
        '#!/bin/sh\nexec 0<&-\necho "ssh: Could not resolve hostname box" >&2\nsleep 0.3\nexit 255\n',
    )
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    async with _closing(DockerEngine.from_env({"DOCKER_HOST": "ssh://box"})) as eng:
        with pytest.raises(EngineError) as caught:
            await eng.ping()
    assert str(caught.value) == (
        f"cannot reach the container engine at ssh://box: ssh failed: ssh: Could not resolve hostname box{UNREACHABLE}"
    )


# -- the exec stream's frames, from a peer that may lie ------------------------------------


def _frame(kind: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxI", kind, len(payload)) + payload


@contextlib.asynccontextmanager
async def _fake_exec() -> AsyncIterator[tuple[ExecStream, socket.socket]]:
    ours, theirs = socket.socketpair()
    stream = ExecStream(await anyio.abc.UNIXSocketStream.from_socket(ours))
    try:
        yield stream, theirs
    finally:
        theirs.close()
        await stream.aclose()


async def test_frames_are_taken_apart_stdout_returned_and_stderr_kept_bounded() -> None:
    async with _fake_exec() as (stream, peer):
        big_err = b"e" * 100_000
        peer.sendall(
            _frame(1, b"hel") + _frame(2, big_err) + _frame(1, b"lo") + _frame(2, b"END") + _frame(1, b"")
        )
        peer.sendall(_frame(3, b"oci runtime error"))
        peer.shutdown(socket.SHUT_WR)
        assert await _read_to_end(stream) == b"hello"
        tail = stream.stderr_tail
        assert len(tail) == 64 * 1024
        assert tail.endswith(b"eeeEND[engine] oci runtime error")


@pytest.mark.parametrize(
    "garbage",
    [
        b"HTTP/1.1 500 Internal Server Error\r\n\r\n",  # not a frame at all
        struct.pack(">BxxxI", 9, 4) + b"abcd",  # an unknown stream
        struct.pack(">BBBBI", 1, 0, 7, 0, 4) + b"abcd",  # header padding not zero
        struct.pack(">BxxxI", 1, 0xFFFFFFF0),  # 4 GB announced: refused, not awaited nor allocated
    ],
)
async def test_a_garbled_frame_ends_the_stream_with_an_error(garbage: bytes) -> None:
    async with _fake_exec() as (stream, peer):
        peer.sendall(_frame(1, b"fine") + garbage)  # the peer stays open: no end to wait for
        assert await stream.receive() == b"fine"
        with anyio.fail_after(5), pytest.raises(StreamBroken, match="garbled"):
            await stream.receive()
        with pytest.raises(anyio.BrokenResourceError):  # and it stays broken
            await stream.receive()


@pytest.mark.parametrize("cut", [3, 8 + 2])
async def test_a_stream_cut_inside_a_frame_is_an_error_not_an_end(cut: int) -> None:
    async with _fake_exec() as (stream, peer):
        peer.sendall(_frame(1, b"fine") + _frame(1, b"truncated")[:cut])
        peer.shutdown(socket.SHUT_WR)
        assert await stream.receive() == b"fine"
        with anyio.fail_after(5), pytest.raises(StreamBroken):
            while True:
                await stream.receive()


# -- DOCKER_HOST ----------------------------------------------------------------------------


def test_docker_host_default_prefers_docker_then_podman(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docker, podman_sock = tmp_path / "docker.sock", tmp_path / "podman.sock"
    monkeypatch.setattr(engine_module, "DEFAULT_SOCKETS", (str(docker), str(podman_sock)))
    assert DockerEngine.from_env({}).host == f"unix://{docker}"  # neither there: the usual one, named
    podman_sock.touch()
    assert DockerEngine.from_env({}).host == f"unix://{podman_sock}"
    docker.touch()
    assert DockerEngine.from_env({"DOCKER_HOST": ""}).host == f"unix://{docker}"


def test_docker_host_tcp_ports_and_tls(tmp_path: Path) -> None:
    assert str(DockerEngine.from_env({"DOCKER_HOST": "tcp://example.test"})._client.base_url) == (
        "http://example.test:2375"
    )
    tls = DockerEngine.from_env(
        {"DOCKER_HOST": "tcp://example.test", "DOCKER_TLS": "1", "HOME": str(tmp_path)}
    )
    assert str(tls._client.base_url) == "https://example.test:2376"
    assert not tls.is_local
    (tmp_path / "ca.pem").write_text("not a certificate")
    with pytest.raises(EngineError, match=rf"^DOCKER_CERT_PATH={tmp_path}: cannot load the TLS certificates"):
        DockerEngine.from_env(
            {
                "DOCKER_HOST": "tcp://example.test:1",
                "DOCKER_TLS_VERIFY": "1",
                "DOCKER_CERT_PATH": str(tmp_path),
            }
        )


@pytest.mark.parametrize(
    ("host", "message"),
    [
        (
            "ssh://me@box/var/run/docker.sock",
            "DOCKER_HOST=ssh://me@box/var/run/docker.sock: ssh:// takes only",
        ),
        ("ssh://", "DOCKER_HOST=ssh://: no host name"),
        (
            "npipe:////./pipe/docker_engine",
            "DOCKER_HOST='npipe:////./pipe/docker_engine' is not an engine address",
        ),
        ("/var/run/docker.sock", "DOCKER_HOST='/var/run/docker.sock' is not an engine address"),
        ("tcp://host:port", "DOCKER_HOST=tcp://host:port: the port is not a number"),
        ("tcp://:2375", "DOCKER_HOST=tcp://:2375: no host name"),
    ],
)
def test_docker_host_that_cannot_work_is_a_clear_error(host: str, message: str) -> None:
    with pytest.raises(EngineError) as caught:
        DockerEngine.from_env({"DOCKER_HOST": host})
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize(
    ("server", "spoken"),
    [("1.41", "1.41"), ("1.40", "1.40"), ("1.52", "1.44"), ("2.0", "1.44"), (None, "1.41"), ("x", "1.41")],
)
def test_api_version_is_the_servers_capped_at_what_the_client_knows(server: str | None, spoken: str) -> None:
    # Podman 4 says 1.41; Docker 29 says 1.52 and refuses anything below 1.44.
    assert negotiate_version(server) == spoken


# -- helpers ------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _running_via(podman: Any) -> AsyncIterator[str]:
    """A running test container made through the session's engine (not the one under test)."""
    async with _closing(DockerEngine.from_env({"DOCKER_HOST": podman.docker_host})) as eng:
        async with _running(eng, podman) as cid:
            yield cid


@contextlib.asynccontextmanager
async def _closing(eng: DockerEngine) -> AsyncIterator[DockerEngine]:
    try:
        yield eng
    finally:
        await eng.aclose()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _service(podman: Any, address: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A second `podman system service` on the same storage, listening at `address`."""
    log = open(tmp_path / "service.log", "wb")
    proc = subprocess.Popen(
        ["podman", "system", "service", "--time=0", address],
        env={**os.environ, **podman.env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


async def _wait_for(eng: DockerEngine) -> None:
    with anyio.fail_after(30):
        while True:
            try:
                await eng.ping()
                return
            except EngineError:
                await anyio.sleep(0.05)


@pytest.fixture
def sshd(podman: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A real sshd on 127.0.0.1 (throwaway keys) whose `docker system dial-stdio` relays to the
    Podman socket: the "remote" engine. Yields its DOCKER_HOST. The `docker` there is a
    stand-in for the Docker CLI's dial-stdio; ssh, sshd and the engine are real."""
    sshd_bin, ssh_bin, keygen = "/usr/sbin/sshd", shutil.which("ssh"), shutil.which("ssh-keygen")
    if not (os.path.exists(sshd_bin) and ssh_bin and keygen):
        why = "openssh-server is not installed (apt-get install openssh-server openssh-client)"
        if os.environ.get("CROW_REQUIRE_CONTAINERS") == "1":  # CI: a skip would prove nothing
            pytest.fail(f"the ssh:// tests must run here (CROW_REQUIRE_CONTAINERS=1) but {why}")
        pytest.skip(why)
    d = tmp_path / "ssh"
    (d / "remote-bin").mkdir(parents=True)
    (d / "client-bin").mkdir()
    for key in ("host_key", "client_key"):
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    _script(d / "remote-bin" / "docker", _DIAL_STDIO.format(python=sys.executable, socket=podman.socket))
    _script(
        d / "remote-bin" / "login",
        f'#!/bin/sh\nPATH={d}/remote-bin:$PATH exec sh -c "$SSH_ORIGINAL_COMMAND"\n',
    )
    (d / "authorized_keys").write_text(
        f'command="{d}/remote-bin/login" ' + (d / "client_key.pub").read_text()
    )
    port = _free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\n"
        f"PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        f"PermitRootLogin prohibit-password\nPidFile {d}/sshd.pid\n"
    )
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} " + (d / "host_key.pub").read_text())
    (d / "ssh_config").write_text(
        f"Host 127.0.0.1\n  IdentityFile {d}/client_key\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {d}/known_hosts\n  StrictHostKeyChecking yes\n"
    )
    # What a user's ~/.ssh/config does: the engine runs `ssh`, found on PATH.
    _script(d / "client-bin" / "ssh", f'#!/bin/sh\nexec {ssh_bin} -F {d}/ssh_config "$@"\n')
    monkeypatch.setenv("PATH", f"{d}/client-bin:{os.environ['PATH']}")
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation folder
    log = open(d / "sshd.log", "wb")
    proc = subprocess.Popen([sshd_bin, "-D", "-e", "-f", str(d / "sshd_config")], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            assert proc.poll() is None and time.monotonic() < deadline, (d / "sshd.log").read_text()
            time.sleep(0.05)
        yield f"ssh://{getpass.getuser()}@127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


_DIAL_STDIO = """#!{python}
import os, socket, sys, threading
if sys.argv[1:] != ["system", "dial-stdio"]:
    sys.exit("this docker stand-in only does `docker system dial-stdio`")
engine = socket.socket(socket.AF_UNIX)
engine.connect("{socket}")
def upstream():
    while data := os.read(0, 65536):
        engine.sendall(data)
    engine.shutdown(socket.SHUT_WR)
threading.Thread(target=upstream, daemon=True).start()
while data := engine.recv(65536):
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
"""


def _script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@contextlib.asynccontextmanager
async def _tls_proxy(context: ssl.SSLContext, target: Path) -> AsyncIterator[int]:
    """TLS on 127.0.0.1:PORT in front of the engine's unix socket, relayed both ways."""

    async def relay(src: anyio.abc.ByteStream, dst: anyio.abc.ByteStream) -> None:
        with contextlib.suppress(
            anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError
        ):
            while True:
                await dst.send(await src.receive())

    async def handle(client: anyio.abc.ByteStream) -> None:
        async with client, await anyio.connect_unix(target) as upstream, anyio.create_task_group() as tg:

            async def client_to_engine() -> None:
                await relay(client, upstream)
                with contextlib.suppress(OSError):
                    await upstream.send_eof()

            tg.start_soon(client_to_engine)
            await relay(upstream, client)
            tg.cancel_scope.cancel()  # the engine is done: close the client (TLS has no half-close)

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        tg.start_soon(TLSListener(listener, context, standard_compatible=False).serve, handle)
        yield port
        tg.cancel_scope.cancel()
