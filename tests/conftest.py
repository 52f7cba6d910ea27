"""Shared fixtures: the scripted model server and crow spawned as a real ACP subprocess."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.llm_server import ScriptedLLM
from tests.support.acp_schema import WireLog, schemas

CROW = [sys.executable, "-m", "crow"]

# pytest-xdist's workers start with COLUMNS=80 and LINES=24 in their environment (GNU
# readline, which pytest loads, sets them in the controller's): a crow a test starts on a
# terminal would take them over the terminal's own size.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)


# The container tests' files: one pytest-xdist work unit (pytest_xdist_make_scheduler).
CONTAINER_TESTS = "tests/test_container_"


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` (pyproject's addopts): each test file runs whole in one worker, in
    its order, as it does alone; and every container test file in the same worker, so one
    Podman service serves them and no crow killed by a test there (its container left for
    the next crow to remove, which the test checks) meets another worker's crow sweeping
    the containers of dead crows, or that worker's Podman clean-up at its end."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return CONTAINER_TESTS if scope.startswith(CONTAINER_TESTS) else scope

    return Scheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "podman" in getattr(item, "fixturenames", ()) and not item.nodeid.startswith(CONTAINER_TESTS):
            raise pytest.UsageError(
                f"{item.nodeid} uses the container engine: it belongs in {CONTAINER_TESTS}*.py,"
                " which one test worker runs (tests/conftest.py)"
            )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as server:
        yield server


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


def crow_env(llm: ScriptedLLM | None, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CROW_", "OPENAI_", "ANTHROPIC_"))}
    env.update(CROW_HOME=str(home), PYTHONUNBUFFERED="1")
    if llm is not None:
        env.update(CROW_MODEL="openai:scripted", OPENAI_BASE_URL=llm.base_url, OPENAI_API_KEY="test-key")
    env.update(extra)
    return env


class RecordingClient:
    """An ACP client that records every session/update and answers permission prompts."""

    def __init__(self) -> None:
        self.updates: list[tuple[str, Any]] = []
        self.permission_answer: str | None = "allow_once"  # option kind to pick; None = cancel
        self.permission_requests: list[Any] = []
        self.files: dict[str, str] = {}
        self.terminals: dict[str, Any] = {}
        self.released: list[str] = []
        self.wire: WireLog | None = None  # every message on the connection (spawn_crow sets it)

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any
    ) -> Any:
        from acp.schema import (
            AllowedOutcome,
            DeniedOutcome,
            RequestPermissionResponse,
        )

        self.permission_requests.append((tool_call, options))
        if self.permission_answer is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        option = next(o for o in options if o.kind == self.permission_answer)
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=option.option_id)
        )

    # fs/* and terminal/*: used only when a test advertises them in initialize
    async def read_text_file(self, path: str, session_id: str, **kwargs: Any) -> Any:
        from acp.schema import ReadTextFileResponse

        if path in self.files:
            return ReadTextFileResponse(content=self.files[path])
        if not Path(path).is_file():  # as editors answer for a missing file
            from acp import RequestError

            raise RequestError.resource_not_found(Path(path).as_uri())
        return ReadTextFileResponse(content=Path(path).read_text())

    async def write_text_file(self, content: str, path: str, session_id: str, **kwargs: Any) -> Any:
        self.files[path] = content
        return None

    async def create_terminal(
        self,
        command: str,
        session_id: str,
        args: list[str] | None = None,
        cwd: str | None = None,
        **kwargs: Any,
    ) -> Any:
        import asyncio

        from acp.schema import CreateTerminalResponse

        proc = await asyncio.create_subprocess_exec(
            command,
            *(args or []),
            cwd=cwd,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        tid = f"term-{len(self.terminals) + 1}"
        self.terminals[tid] = proc
        return CreateTerminalResponse(terminal_id=tid)

    async def wait_for_terminal_exit(self, session_id: str, terminal_id: str, **kwargs: Any) -> Any:
        from acp.schema import WaitForTerminalExitResponse

        code = await self.terminals[terminal_id].wait()
        return WaitForTerminalExitResponse(exit_code=code)

    async def terminal_output(self, session_id: str, terminal_id: str, **kwargs: Any) -> Any:
        from acp.schema import TerminalOutputResponse

        proc = self.terminals[terminal_id]
        data = await proc.stdout.read() if proc.returncode is not None else b""
        return TerminalOutputResponse(output=data.decode(), truncated=False)

    async def kill_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> Any:
        import os
        import signal

        proc = self.terminals[terminal_id]
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        return None

    async def release_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> Any:
        self.released.append(terminal_id)
        return None

    def of_type(self, name: str, session_id: str | None = None) -> list[Any]:
        return [
            u for s, u in self.updates if type(u).__name__ == name and (session_id is None or s == session_id)
        ]

    def text(self, session_id: str | None = None) -> str:
        return "".join(u.content.text for u in self.of_type("AgentMessageChunk", session_id))

    def kinds(self) -> list[str]:
        return [getattr(u, "session_update", type(u).__name__) for _, u in self.updates]


@contextlib.asynccontextmanager
async def spawn_crow(
    env: dict[str, str],
    *args: str,
    client: RecordingClient | None = None,
    stderr_path: Path | None = None,
    cwd: Path | None = None,
    unstable: bool = False,
) -> AsyncIterator[tuple[Any, Any, RecordingClient]]:
    """Spawn `python -m crow` (in `cwd`, default this process's) and connect an ACP client
    to it (`unstable`: one that routes what the SDK calls unstable, e.g. `elicitation/create`
    to the client's `create_elicitation`). stderr goes to a file so a chatty agent can never
    block on a full pipe."""
    import acp

    client = client or RecordingClient()
    err_path = stderr_path or Path(env["CROW_HOME"]) / "stderr.log"
    err_path.parent.mkdir(parents=True, exist_ok=True)
    wire = WireLog()
    with open(err_path, "ab") as err:
        async with acp.spawn_agent_process(
            client, *CROW, *args, env=env, cwd=cwd, transport_kwargs={"stderr": err}, use_unstable_protocol=unstable
        ) as (conn, proc):
            conn._conn.add_observer(wire)
            client.wire = wire
            yield conn, proc, client
    assert_conforms(wire)


def assert_conforms(wire: WireLog) -> None:
    """Every message crow wrote validates against the official ACP schema (1.25). Without
    the schema (no node/npm here) the check is skipped, except under CI, where it fails."""
    if isinstance(schemas(), str):
        if os.environ.get("CI"):
            raise AssertionError(f"the ACP schema is not available for the conformance check: {schemas()}")
        return
    problems = wire.violations()
    assert not problems, "crow wrote messages the ACP schema refuses:\n" + "\n".join(problems[:20])


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "crow-home"
    h.mkdir()
    return h


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 512 KB tmpfs, to fill up: needs root (CI runs as root) and a kernel that lets it mount."""
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def file_tool_specs() -> dict[str, Any]:
    """crow's file tools as the ToolHub lists them: kind and title template included."""
    from crow.llm.base import ToolSpec
    from mcp_servers.filesystem.server import TOOLS

    return {name: ToolSpec(name, "", {}, kind=kind, title=title) for name, _, kind, title in TOOLS}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The filesystem server's workspace root, for the tests that build one."""
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
async def client(root: Path) -> AsyncIterator[Any]:
    """An MCP client connected in-process to a filesystem server over `root`."""
    from mcp import Client

    from mcp_servers.filesystem import build_server

    async with Client(build_server(root)) as c:
        yield c


FEATURES_125 = {
    "fs": {"readTextFile": False, "writeTextFile": False},
    "terminal": False,
    "session": {"compaction": {}, "notices": {}, "configOptions": {"boolean": {}}},
    "auth": {"terminal": True},
    "elicitation": {"form": {}},
}


async def raw_request(conn: Any, method: str, params: dict[str, Any]) -> Any:
    """A request as a schema-1.25 client writes it (the Python SDK's models predate some
    fields): the raw result dict, or `acp.RequestError`."""
    return await conn._conn.send_request(method, params)


async def initialize_125(conn: Any, capabilities: dict[str, Any] | None = None) -> dict[str, Any]:
    """`initialize` from a client advertising what schema 1.25 adds (`FEATURES_125` unless
    `capabilities` says otherwise)."""
    caps = FEATURES_125 if capabilities is None else capabilities
    return await raw_request(
        conn,
        "initialize",
        {"protocolVersion": 1, "clientCapabilities": caps, "clientInfo": {"name": "t", "version": "0"}},
    )


@pytest.fixture(scope="session")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Podman serving the Docker Engine API, with the test image (tests/support/podman.py);
    the tests using it skip with the reason where no engine can run."""
    from tests.support.podman import podman_service

    with podman_service(tmp_path_factory.mktemp("podman")) as engine:
        yield engine


@pytest.fixture
async def engine(podman: Any) -> AsyncIterator[Any]:
    """A `DockerEngine` on the `podman` fixture's socket, closed after the test."""
    from mcp_servers.filesystem.container.engine import DockerEngine

    eng = DockerEngine.from_env({"DOCKER_HOST": podman.docker_host})
    try:
        yield eng
    finally:
        await eng.aclose()


@pytest.fixture(scope="session")
def postgres() -> Iterator[Any]:
    """A throwaway PostgreSQL cluster on a private unix socket (tests/support/postgres.py);
    the tests using it skip with the reason where it cannot run (fail under
    CROW_REQUIRE_POSTGRES=1)."""
    from tests.support.postgres import postgres_server

    with postgres_server() as server:
        yield server


@pytest.fixture
def pg_url(postgres: Any) -> str:
    """A fresh empty database of the `postgres` cluster, as a postgresql:// URL. A test that
    stopped the server gets it back running for the next one."""
    postgres.start()
    return postgres.new_database()
