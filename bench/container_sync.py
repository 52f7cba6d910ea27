"""The workspace in copy mode (container/sync.py) against Podman's Docker API: copying a
2,000-file workspace in, a turn's pull when nothing changed (one scan), and a pull that
brings 10 changed files back (one archive call).

    python bench/container_sync.py            (or as a group: `run(ctx)`)

Needs podman, runc and the test image (tests/support/podman.py builds and caches it).
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import Ctx, Figure, median, ms, not_measured  # noqa: E402

GROUP = "container_sync"
FILES = 2000


def _workspace(ws: Path) -> None:
    """2,000 source-sized files (1-4 KB) in 40 folders."""
    for i in range(FILES):
        folder = ws / f"pkg{i % 40}"
        folder.mkdir(exist_ok=True)
        (folder / f"mod{i}.py").write_text(f"# module {i}\n" + "x = 1\n" * (150 + i % 500))


async def _measure(ctx: Ctx, docker_host: str, image: str) -> list[Figure]:
    from mcp_servers.filesystem.container.engine import DockerEngine
    from mcp_servers.filesystem.container.protocol import HelperClient, helper_source
    from mcp_servers.filesystem.container.sync import WorkspaceSync

    engine = DockerEngine.from_env({"DOCKER_HOST": docker_host})
    copy_in: list[float] = []
    idle: list[float] = []
    ten: list[float] = []
    try:
        for _ in range(ctx.reps(5, 2)):
            ws = ctx.home("sync-ws")
            _workspace(ws)
            spec = {
                "Image": image,
                "Labels": {"crow.bench": "sync"},
                "Cmd": ["python3", "-c", "import signal; signal.pause()"],
            }
            cid = await engine.create_container(spec)
            try:
                await engine.start(cid)
                client = HelperClient(await engine.exec_stream(cid, ["python3", "-c", helper_source()]))
                await client.handshake()
                sync = WorkspaceSync(engine, [(PurePosixPath("/workspace"), ws)])
                t = time.perf_counter()
                await sync.copy_in(cid, client)
                copy_in.append(time.perf_counter() - t)
                for _ in range(5):
                    t = time.perf_counter()
                    assert await sync.pull(cid, client) == []
                    idle.append(time.perf_counter() - t)
                names = " ".join(f"/workspace/pkg{i % 40}/mod{i}.py" for i in range(0, 1000, 100))
                await engine.exec_run(cid, ["sh", "-c", f"for f in {names}; do echo changed >> $f; done"])
                t = time.perf_counter()
                assert await sync.pull(cid, client) == []
                ten.append(time.perf_counter() - t)
                await client.aclose()
            finally:
                await engine.remove(cid)
    finally:
        await engine.aclose()
    n = len(copy_in)
    return [
        Figure(GROUP, f"copy_in, {FILES:,} files (4.8 MB)", ms(median(copy_in)), samples=n),
        Figure(GROUP, "pull, nothing changed (one scan)", ms(median(idle)), samples=len(idle)),
        Figure(GROUP, "pull, 10 files changed", ms(median(ten)), samples=n),
    ]


async def run(ctx: Ctx) -> list[Figure]:
    from _pytest.outcomes import Skipped

    from tests.support.podman import podman_service

    try:
        with tempfile.TemporaryDirectory() as tmp, podman_service(Path(tmp)) as eng:
            return await _measure(ctx, eng.docker_host, eng.image)
    except Skipped as exc:  # podman_service skips (pytest's way) where no engine can run
        return [not_measured(GROUP, "copy mode sync", str(exc))]


if __name__ == "__main__":
    import anyio

    with contextlib.suppress(KeyboardInterrupt):
        for fig in anyio.run(run, Ctx()):
            print(f"{fig.name}: {fig.value:.1f} {fig.unit} (median of {fig.samples})")
