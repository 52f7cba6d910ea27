"""ContainerSession against the real engine, without crow around it: what the end-to-end
tests (test_container_e2e.py) cannot time, such as a first call cancelled mid-creation."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from crow.config import BackendConfig
from mcp_servers.filesystem.container import backend
from mcp_servers.filesystem.container.backend import ContainerSession
from mcp_servers.filesystem.container.engine import DockerEngine

pytestmark = pytest.mark.anyio


class SlowAnswer(DockerEngine):
    """A real engine whose answer to `create` is held back after the container exists: the
    moment a cancel leaves crow without its id."""

    created = anyio.Event()

    async def create_container(self, spec: dict[str, Any], name: str | None = None) -> str:
        await super().create_container({**spec, "Labels": {**spec["Labels"], **self.extra}}, name)
        self.created.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


def engine_of(cls: type[DockerEngine], podman: Any, host: str | None = None) -> Any:
    """A `cls` engine on Podman's socket (or `host`, a proxy before it) whose containers
    carry the test run's labels (the podman fixture removes what a failed test leaves)."""
    engine: Any = cls.from_env({"DOCKER_HOST": host or podman.docker_host})
    engine.extra, engine.host_url = podman.labels, podman.docker_host
    return engine


def session_on(engine: Any, podman: Any, name: str, workspace: Path) -> ContainerSession:
    return ContainerSession(BackendConfig(type="docker", image=podman.image), name, [workspace], lambda: engine)


async def test_a_first_call_cancelled_mid_creation_leaves_no_container(
    workspace: Path, podman: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(backend, "CREATE_WAIT", 0.5)  # the id never comes: looked for at close
    SlowAnswer.created = anyio.Event()
    box = session_on(engine_of(SlowAnswer, podman), podman, "cancelled-mid-creation", workspace)
    async with anyio.create_task_group() as tg:
        tg.start_soon(box.resolve, ".")
        await SlowAnswer.created.wait()
        assert len(podman.containers("label=crow.session=cancelled-mid-creation")) == 1
        tg.cancel_scope.cancel()
    await box.aclose()
    assert podman.containers("label=crow.session=cancelled-mid-creation") == []


class SlowCreate(DockerEngine):
    """A real engine that makes the container a moment after it was asked, whether or not
    the caller still waits for it: Podman and Docker finish a create whose request was cut
    short (measured: a create whose socket was closed 0-20 ms after sending still made it).
    The making is the engine's own work: another client, in a task of its own."""

    asked = anyio.Event()
    making: asyncio.Future[str]

    async def create_container(self, spec: dict[str, Any], name: str | None = None) -> str:
        SlowCreate.asked.set()
        SlowCreate.making = asyncio.ensure_future(self._made_later(spec, name))
        return await asyncio.shield(SlowCreate.making)

    async def _made_later(self, spec: dict[str, Any], name: str | None) -> str:
        await asyncio.sleep(1.0)
        maker = DockerEngine.from_env({"DOCKER_HOST": self.host_url})
        try:
            return await maker.create_container({**spec, "Labels": {**spec["Labels"], **self.extra}}, name)
        finally:
            await maker.aclose()


async def test_a_first_call_cancelled_before_the_engine_made_its_container_leaves_none(
    workspace: Path, podman: Any
) -> None:
    SlowCreate.asked = anyio.Event()
    box = session_on(engine_of(SlowCreate, podman), podman, "cancelled-before-made", workspace)
    async with anyio.create_task_group() as tg:
        tg.start_soon(box.resolve, ".")
        await SlowCreate.asked.wait()
        tg.cancel_scope.cancel()
    assert not SlowCreate.making.done()  # the cancel was not held up by the engine
    await box.aclose()
    assert SlowCreate.making.done()  # aclose waited for it
    assert podman.containers("label=crow.session=cancelled-before-made") == []


async def test_closing_a_session_that_never_called_a_tool_touches_no_engine(workspace: Path) -> None:
    made: list[int] = []
    config = BackendConfig(type="docker", image="any")
    box = ContainerSession(config, "never-used", [workspace], lambda: made.append(1))  # type: ignore[arg-type,func-returns-value]
    await box.aclose()
    assert made == []


@contextlib.asynccontextmanager
async def slow_to_create(
    podman: Any, path: Path, delay: float, asked: anyio.Event, answered: anyio.Event | None = None
) -> AsyncIterator[str]:
    """The engine's socket behind a proxy that hands it a create `delay` s late, whatever
    the client does meanwhile: an engine busy making the container (its DOCKER_HOST).
    `answered` is set once the engine has answered that create (the container exists)."""
    forwarded = anyio.Event()

    async def pipe(src: Any, dst: Any, slow: bool) -> None:
        with contextlib.suppress(Exception):
            async for data in src:
                if slow and b"/containers/create" in data:
                    asked.set()
                    with anyio.CancelScope(shield=True):
                        await anyio.sleep(delay)
                    await dst.send(data)
                    forwarded.set()
                    continue
                if not slow and forwarded.is_set() and answered is not None:
                    answered.set()
                await dst.send(data)
        with contextlib.suppress(Exception):
            await dst.send_eof()

    async def serve(client: Any) -> None:
        async with client:
            upstream = await anyio.connect_unix(podman.docker_host.removeprefix("unix://"))
            async with upstream, anyio.create_task_group() as tg:
                tg.start_soon(pipe, client, upstream, True)
                tg.start_soon(pipe, upstream, client, False)

    listener = await anyio.create_unix_listener(path)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        yield f"unix://{path}"
        tg.cancel_scope.cancel()


class Labelled(DockerEngine):
    async def create_container(self, spec: dict[str, Any], name: str | None = None) -> str:
        return await super().create_container({**spec, "Labels": {**spec["Labels"], **self.extra}}, name)


async def gone(podman: Any, label: str) -> bool:
    """Whether the session's container is gone, or goes within 10 s."""
    for _ in range(100):
        if not podman.containers(label):
            return True
        await anyio.sleep(0.1)
    return False


async def test_a_create_cut_short_and_slower_than_the_close_wait_is_still_removed(
    workspace: Path, podman: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing the engine then would only cut the create's own connection: the engine makes
    the container all the same. The engine stays open until it is removed."""
    monkeypatch.setattr(backend, "CREATE_WAIT", 0.5)
    asked, answered = anyio.Event(), anyio.Event()
    async with slow_to_create(podman, tmp_path / "engine.sock", 1.5, asked, answered) as host:
        box = session_on(engine_of(Labelled, podman, host), podman, "slow-made", workspace)
        async with anyio.create_task_group() as tg:
            tg.start_soon(box.resolve, ".")
            await asked.wait()
            tg.cancel_scope.cancel()
        await box.aclose()
        assert not answered.is_set()  # closed before the engine had made it
        with anyio.fail_after(30):
            await answered.wait()
        assert await gone(podman, "label=crow.session=slow-made")


async def test_closing_while_a_call_makes_the_container_leaves_none(
    workspace: Path, podman: Any, tmp_path: Path
) -> None:
    """A session closed (its tools rebuilt, its connection gone) while an uncancelled call
    is making its container: the call ends, saying so, and removes what it made."""
    asked = anyio.Event()
    errors: list[Exception] = []
    async with slow_to_create(podman, tmp_path / "engine.sock", 1.0, asked) as host:
        box = session_on(engine_of(Labelled, podman, host), podman, "closed-meanwhile", workspace)

        async def call() -> None:
            try:
                await box.resolve(".")
            except Exception as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await asked.wait()
            await box.aclose()
        assert await gone(podman, "label=crow.session=closed-meanwhile")
    assert [str(e) for e in errors] == ["this session was closed"]
