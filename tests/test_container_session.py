"""ContainerSession against the real engine, without crow around it: what the end-to-end
tests (test_container_e2e.py) cannot time, such as a first call cancelled mid-creation."""

from __future__ import annotations

import asyncio
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


async def test_a_first_call_cancelled_mid_creation_leaves_no_container(
    workspace: Path, podman: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(backend, "CREATE_WAIT", 0.5)  # the id never comes: looked for at close
    engine = SlowAnswer.from_env({"DOCKER_HOST": podman.docker_host})
    engine.extra = podman.labels
    SlowAnswer.created = anyio.Event()
    config = BackendConfig(type="docker", image=podman.image)
    box = ContainerSession(config, "cancelled-mid-creation", [workspace], lambda: engine)
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
    engine = SlowCreate.from_env({"DOCKER_HOST": podman.docker_host})
    engine.extra, engine.host_url = podman.labels, podman.docker_host
    SlowCreate.asked = anyio.Event()
    config = BackendConfig(type="docker", image=podman.image)
    box = ContainerSession(config, "cancelled-before-made", [workspace], lambda: engine)
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
