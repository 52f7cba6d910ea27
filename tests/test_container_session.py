"""ContainerSession against the real engine, without crow around it: what the end-to-end
tests (test_container_e2e.py) cannot time, such as a first call cancelled mid-creation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from crow.config import BackendConfig
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


async def test_a_first_call_cancelled_mid_creation_leaves_no_container(workspace: Path, podman: Any) -> None:
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


async def test_closing_a_session_that_never_called_a_tool_touches_no_engine(workspace: Path) -> None:
    made: list[int] = []
    config = BackendConfig(type="docker", image="any")
    box = ContainerSession(config, "never-used", [workspace], lambda: made.append(1))  # type: ignore[arg-type,func-returns-value]
    await box.aclose()
    assert made == []
