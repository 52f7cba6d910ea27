"""A hostile model or repository against the container backend (the real engine): what
crow hides must stay hidden whatever the configuration mounts."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

import anyio
import pytest

from crow.config import BackendConfig
from mcp_servers.filesystem.container import engine as engine_module
from mcp_servers.filesystem.container.backend import ContainerSession
from mcp_servers.filesystem.container.engine import DockerEngine, EngineError

pytestmark = pytest.mark.anyio


class Labeled(DockerEngine):
    """The real engine; the containers it creates carry this test session's label."""

    extra: ClassVar[dict[str, str]] = {}

    async def create_container(self, spec: dict[str, Any], name: str | None = None) -> str:
        return await super().create_container({**spec, "Labels": {**spec["Labels"], **self.extra}}, name)


async def test_hidden_paths_under_a_configured_mount_are_masked_too(tmp_path: Path, podman: Any) -> None:
    # `backend.mounts` (a trusted project's, or the user's own) bringing in the home folder
    # must not bring in crow's home (API keys) or ~/.ssh: masked as the workspace's are.
    home, ws = tmp_path / "home", tmp_path / "ws"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
    (home / ".crow").mkdir()
    (home / ".crow" / "config.yaml").write_text("api_key: sk-SECRET")
    (home / "notes.txt").write_text("visible")
    ws.mkdir()
    engine = Labeled.from_env({"DOCKER_HOST": podman.docker_host})
    engine.extra = podman.labels
    config = BackendConfig(type="docker", image=podman.image, mounts=[f"{home}:/h:ro", f"{home}/.ssh:/keys"])
    hidden = [home / ".crow", home / ".ssh"]
    box = ContainerSession(config, "hostile-mounts", [ws], lambda: engine, hidden=hidden)
    try:
        result = await box.run(
            "cat /h/notes.txt; cat /h/.ssh/id_ed25519 /h/.crow/config.yaml /keys/id_ed25519; true",
            PurePosixPath("/workspace"), 60,
        )  # fmt: skip
    finally:
        await box.aclose()
    assert "visible" in result.output
    assert "PRIVATE" not in result.output and "SECRET" not in result.output, result.output


async def test_hidden_paths_in_the_workspace_are_masked(tmp_path: Path, podman: Any) -> None:
    ws = tmp_path / "ws"
    (ws / ".ssh").mkdir(parents=True)
    (ws / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
    (ws / "cfg.yaml").write_text("api_key: sk-SECRET")
    engine = Labeled.from_env({"DOCKER_HOST": podman.docker_host})
    engine.extra = podman.labels
    config = BackendConfig(type="docker", image=podman.image)
    box = ContainerSession(config, "hostile-ws", [ws], lambda: engine, hidden=[ws / ".ssh", ws / "cfg.yaml"])
    try:
        result = await box.run("cat .ssh/id_ed25519 cfg.yaml; true", PurePosixPath("/workspace"), 60)
    finally:
        await box.aclose()
    assert "PRIVATE" not in result.output and "SECRET" not in result.output, result.output


@contextlib.contextmanager
def hostile_engine(answer: Callable[[socket.socket], None]) -> Iterator[str]:
    """A DOCKER_HOST (tcp://) that pings as an engine, then answers every other request with
    `answer` (writing to the connection as it likes)."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while not stop.is_set():
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    head += chunk
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                while length and len(head.split(b"\r\n\r\n", 1)[1]) < int(length[1]):
                    head += conn.recv(65536)  # the request's body read: closing then resets nothing
                if head.startswith(b"GET /_ping"):
                    conn.sendall(b"HTTP/1.1 200 OK\r\nAPI-Version: 1.41\r\nContent-Length: 2\r\n\r\nOK")
                else:
                    answer(conn)
                    return

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                threading.Thread(target=serve, args=(server.accept()[0],), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        server.close()


def gigantic(conn: socket.socket) -> None:
    conn.sendall(
        b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    block = b" " * (1 << 20)
    for _ in range(300):  # 300 MB of JSON whitespace
        conn.sendall(b"%x\r\n%s\r\n" % (len(block), block))
    conn.sendall(b"0\r\n\r\n")


def slow_loris(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
    for _ in range(100):
        conn.sendall(b" ")
        time.sleep(0.5)


async def test_an_engine_sending_a_gigantic_answer_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    with hostile_engine(gigantic) as url:
        engine = DockerEngine.from_env({"DOCKER_HOST": url})
        try:
            with anyio.fail_after(60), pytest.raises(EngineError, match="answered more than 64 MB"):
                await engine.create_container({"Image": "x"})
        finally:
            await engine.aclose()


async def test_an_engine_dripping_its_answer_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_module, "REQUEST_TIMEOUT", 2.0)  # each byte comes well within it
    with hostile_engine(slow_loris) as url:
        engine = DockerEngine.from_env({"DOCKER_HOST": url})
        try:
            with anyio.fail_after(30), pytest.raises(EngineError, match="did not answer within 2 s"):
                await engine.create_container({"Image": "x"})
        finally:
            await engine.aclose()
