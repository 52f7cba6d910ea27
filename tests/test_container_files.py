"""`ContainerFiles` against a real container (the `podman` fixture's image: Debian with
python3-minimal only): the helper exec'd with `podman exec -i`, the workspace bind-mounted
at /workspace, an extra root living only in the container."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath
from typing import Any

import anyio
import pytest
from mcp.server.mcpserver.exceptions import ToolError

from mcp_servers.filesystem.container.engine import DockerEngine
from mcp_servers.filesystem.container.files import ContainerFiles
from mcp_servers.filesystem.container.protocol import HelperClient, HelperGone, helper_source
from mcp_servers.filesystem.localfs import BinaryFileError
from mcp_servers.filesystem.search import GrepQuery
from tests.support.container_helper import helper_process

pytestmark = pytest.mark.anyio
WORKDIR, EXTRA = PurePosixPath("/workspace"), PurePosixPath("/extra")


@pytest.fixture
async def container(podman: Any, engine: DockerEngine, tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    ws = tmp_path / "ws"
    ws.mkdir()
    spec = {
        "Image": podman.image, "Cmd": ["sleep", "infinity"], "Labels": podman.labels,
        "HostConfig": {"Binds": [f"{ws}:{WORKDIR}"]},
    }  # fmt: skip
    cid = await engine.create_container(spec)
    try:
        await engine.start(cid)
        assert (await engine.exec_run(cid, ["mkdir", str(EXTRA)]))[0] == 0
        yield cid, ws
    finally:
        await engine.remove(cid)


@pytest.fixture
async def files(engine: DockerEngine, container: tuple[str, Path]) -> AsyncIterator[ContainerFiles]:
    """The helper on the engine's exec stream, as the backend runs it."""
    cid, ws = container
    client = HelperClient(await engine.exec_stream(cid, ["python3", "-c", helper_source()]))
    try:
        await client.handshake()
        yield ContainerFiles(client, [(WORKDIR, ws), (EXTRA, None)], env={"GIVEN": "given"}, container=cid)
    finally:
        await client.aclose()


async def test_the_helper_runs_over_podman_exec_too(podman: Any, container: tuple[str, Path]) -> None:
    cid, ws = container
    argv = ["podman", "exec", "-i", cid, "python3", "-c", helper_source()]
    async with helper_process(argv, podman.env) as (client, _):
        files = ContainerFiles(client, [(WORKDIR, ws)])
        await files.write_text(WORKDIR / "via-cli.txt", "cli")
        assert (await files.run("cat via-cli.txt", WORKDIR, 30)).output == "cli"


async def test_the_images_python3_minimal_runs_the_helper(files: ContainerFiles) -> None:
    assert files.client.info == {"python": "3.11.2", "shell": "/bin/bash"}


async def test_confinement_inside_the_container(files: ContainerFiles, container: tuple[str, Path]) -> None:
    _, ws = container
    await files.run("ln -s /etc out; ln -s l2 l1; ln -s l1 l2; ln -s /extra to_extra", WORKDIR, 30)
    where = "the workspace /workspace and its other roots /extra"
    for path in ("../etc/passwd", "/etc/passwd", "out/passwd", "/proc/self/root/etc"):
        with pytest.raises(ToolError) as caught:
            await files.resolve(path)
        assert str(caught.value) == f"path {path!r} is outside {where}"
    with pytest.raises(ToolError, match=r"^cannot resolve path 'l1/x': it goes through a symlink loop$"):
        await files.resolve("l1/x")
    with pytest.raises(ToolError, match="contains a NUL byte"):
        await files.resolve("a\x00b")
    place = await files.resolve("to_extra/new.txt")  # a symlink into another root is that root's file
    assert (str(place.path), str(place.root), place.display, place.kind) == (
        "/extra/new.txt", "/extra", "/extra/new.txt", "missing",
    )  # fmt: skip
    assert files.editor_path(place) == "/extra/new.txt"  # no path on this machine
    inside = await files.resolve("sub/../x.py")
    assert (inside.display, files.editor_path(inside)) == ("x.py", str(ws / "x.py"))


async def test_write_then_execute_sees_it_and_so_does_the_host(
    files: ContainerFiles, container: tuple[str, Path]
) -> None:
    _, ws = container
    await files.write_text(WORKDIR / "src/app.py", "print('hi')\r\n")
    result = await files.run("cat src/app.py; python3 src/app.py", WORKDIR, 30)
    assert (result.output, result.exit_code) == ("print('hi')\r\nhi\n", 0)
    assert (ws / "src/app.py").read_bytes() == b"print('hi')\r\n"
    await files.write_text(EXTRA / "only/here.txt", "container only")
    assert await files.read_text(EXTRA / "only/here.txt") == "container only"
    await files.run("chmod 750 src/app.py", WORKDIR, 30)
    await files.write_text(WORKDIR / "src/app.py", "again")
    assert (await files.run("stat -c %a src/app.py", WORKDIR, 30)).output == "750\n"


async def test_reads_listings_and_searches_see_the_containers_files(files: ContainerFiles) -> None:
    setup = (
        "mkdir -p pkg/build .git && printf 'needle\\n' > pkg/a.py && printf 'needle\\n' > pkg/b.log"
        " && printf 'needle\\n' > pkg/build/c.py && printf 'needle\\n' > .git/HEAD"
        " && printf '*.log\\nbuild/\\n' > .gitignore && printf 'x\\000y' > bin.dat"
    )
    assert (await files.run(setup, WORKDIR, 30)).exit_code == 0
    root = await files.resolve(".")
    assert await files.glob(root, "**/*", 100) == ([".gitignore", "bin.dat", "pkg/a.py"], False)
    found = await files.grep(root, GrepQuery("NEEDLE", None, True, "content", 100))
    assert found.matches == [{"file": "pkg/a.py", "line": 1, "text": "needle"}]
    with pytest.raises(BinaryFileError):
        await files.read_text(WORKDIR / "bin.dat")
    assert await files.read_bytes(await files.resolve("bin.dat"), 100) == (b"x\x00y", 3)
    names = [(e["name"], e["type"]) for e in await files.list_dir(await files.resolve("pkg"))]
    assert names == [("a.py", "file"), ("b.log", "file"), ("build", "dir")]
    etc = await files.scan(PurePosixPath("/etc"))  # the sync's view: everything, nothing skipped
    assert "os-release" in etc["symlinks"] and "passwd" in etc["files"] and "apt" in etc["dirs"]


async def test_commands_get_the_images_environment_plus_the_given_one(
    files: ContainerFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CROW_SECRET_FOR_TEST", "must-not-enter")
    result = await files.run('echo "$PATH|$GIVEN|${CROW_SECRET_FOR_TEST-unset}"', WORKDIR, 30)
    assert result.output == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin|given|unset\n"


def _gone(files: ContainerFiles, pid: int) -> Any:
    # Dead or a zombie (PID 1 here is `sleep`, which reaps no one).
    return files.run(
        f"grep -q '^State:.*Z' /proc/{pid}/status 2>/dev/null || ! test -e /proc/{pid}", WORKDIR, 30
    )


async def test_a_timed_out_command_leaves_no_process_in_the_container(files: ContainerFiles) -> None:
    result = await files.run("sleep 100 & echo $! > /tmp/pid; sleep 200", WORKDIR, 0.5)
    assert result.timed_out and result.exit_code is None
    pid = int((await files.run("cat /tmp/pid", WORKDIR, 30)).output)
    assert (await _gone(files, pid)).exit_code == 0
    background = await files.run("sleep 100 & echo $!", WORKDIR, 30)
    assert (await _gone(files, int(background.output))).exit_code == 0


async def test_cancel_kills_the_command_inside(files: ContainerFiles) -> None:
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(files.run, "trap '' TERM; echo $$ > /tmp/shell; sleep 100", WORKDIR, 60)
            with anyio.fail_after(30):
                while (await files.run("cat /tmp/shell 2>/dev/null", WORKDIR, 30)).output == "":
                    pass
            scope.cancel()
    shell = int((await files.run("cat /tmp/shell", WORKDIR, 30)).output)
    assert (await _gone(files, shell)).exit_code == 0


async def test_a_command_that_kills_the_helper_ends_its_stream(files: ContainerFiles) -> None:
    with pytest.raises(HelperGone, match="exited"):
        await files.run("kill -9 $PPID", WORKDIR, 30)
    with pytest.raises(HelperGone):
        await files.read_text(WORKDIR / "x")


async def test_closing_the_stream_ends_the_helper_and_its_commands(
    engine: DockerEngine, container: tuple[str, Path], files: ContainerFiles
) -> None:
    cid, _ = container

    async def sh(script: str) -> tuple[int, bytes]:
        code, out, _ = await engine.exec_run(cid, ["sh", "-c", script])
        return code, out

    async def run() -> None:
        with pytest.raises(HelperGone):
            await files.run("echo $$ > /tmp/shell; sleep 100", WORKDIR, 60)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        with anyio.fail_after(30):
            while (await sh("cat /tmp/shell"))[0] != 0:
                pass
        await files.client.aclose()
    shell = int((await sh("cat /tmp/shell"))[1])
    with anyio.fail_after(30):  # the helper saw its stdin end, killed the group, and exited
        while (await sh(f"grep -q '^State:.*Z' /proc/{shell}/status 2>/dev/null || ! test -e /proc/{shell}"))[
            0
        ]:
            pass
    code, _ = await sh(
        "for p in /proc/[0-9]*; do grep -q ^python3 $p/cmdline 2>/dev/null && exit 1; done; exit 0"
    )
    assert code == 0  # no helper left either


async def test_the_seven_tools_run_in_the_container(
    files: ContainerFiles, container: tuple[str, Path]
) -> None:
    from mcp import Client

    from mcp_servers.filesystem.server import build_server

    _, ws = container

    async def call(c: Client, tool: str, **args: Any) -> Any:
        result = await c.call_tool(tool, args)
        return result.is_error, result.content[0].text, result.structured_content, result.meta

    async with Client(build_server(None, files=files, backend=files)) as c:
        error, _, _, meta = await call(c, "write_file", path="pkg/mod.py", content="x = 1\n")
        assert not error and meta["crow/diff"]["path"] == str(ws / "pkg/mod.py")  # the editor's path
        error, text, _, _ = await call(c, "edit_file", path="pkg/mod.py", old_text="x = 1", new_text="x = 2")
        assert not error and "1 replacement" in text
        assert (await call(c, "read_file", path="pkg/mod.py"))[1].endswith("x = 2")
        assert (await call(c, "ls", path="pkg"))[2]["entries"] == [
            {"name": "mod.py", "type": "file", "size": 6}
        ]
        assert (await call(c, "glob", pattern="**/*.py"))[2]["files"] == ["pkg/mod.py"]
        assert (await call(c, "grep", pattern="x = 2"))[2]["matches"] == [
            {"file": "pkg/mod.py", "line": 1, "text": "x = 2"}
        ]
        error, text, structured, _ = await call(
            c, "execute", command="python3 pkg/mod.py && cat /etc/debian_version"
        )
        assert (
            not error and structured["exit_code"] == 0 and text.startswith("12.")
        )  # the image's, not this machine's
        outside = "path '/etc/passwd' is outside the workspace /workspace and its other roots /extra"
        assert (await call(c, "read_file", path="/etc/passwd"))[:2] == (
            True,
            f"Error executing tool read_file: {outside}",
        )
        error, text, structured, _ = await call(c, "execute", command="sleep 100 & wait", timeout=0.5)
        assert structured["timed_out"] and "timed out after 0.5 s" in text
