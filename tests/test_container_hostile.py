"""A hostile model or repository against the container backend (the real engine): what
crow hides must stay hidden whatever the configuration mounts."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

import pytest

from crow.config import BackendConfig
from mcp_servers.filesystem.container.backend import ContainerSession
from mcp_servers.filesystem.container.engine import DockerEngine

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
