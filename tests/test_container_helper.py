"""The container helper (helper.py) and its host side (protocol.py, files.py), with the
helper run as a local subprocess: every op against the local disk's own answers (the same
confinement messages, listings, glob and grep results), commands and their kills, and a
helper that lies, garbles, or dies."""

from __future__ import annotations

import ast
import glob
import os
import signal
import stat
import sys
import threading
import time
from pathlib import Path, PurePosixPath

import anyio
import pytest
from mcp.server.mcpserver.exceptions import ToolError

from mcp_servers.filesystem import search
from mcp_servers.filesystem.container import protocol
from mcp_servers.filesystem.container.files import ContainerFiles
from mcp_servers.filesystem.container.protocol import HelperGone, HelperProtocolError, helper_source
from mcp_servers.filesystem.files import Files
from mcp_servers.filesystem.localfiles import LocalFiles, _list_dir
from mcp_servers.filesystem.localfs import MAX_READ_BYTES, BinaryFileError, PathChangedError
from mcp_servers.filesystem.paths import Workspace
from mcp_servers.filesystem.search import GrepQuery
from tests.support.container_helper import helper_process

pytestmark = pytest.mark.anyio
# The helper must run on Python 3.8 too (old images): run it on this interpreter and on a
# 3.8 where this machine has one.
OLD_PYTHONS = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8")))


@pytest.fixture(params=["current", "3.8"])
def helper_argv(request: pytest.FixtureRequest) -> list[str]:
    if request.param == "current":
        return [sys.executable, "-c", helper_source()]
    if not OLD_PYTHONS:
        pytest.skip("no Python 3.8 on this machine")
    return [OLD_PYTHONS[0], "-c", helper_source()]


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    ws, extra = tmp_path / "ws", tmp_path / "extra"
    ws.mkdir()
    extra.mkdir()
    return _real(ws), _real(extra)


def _files(client, roots: tuple[Path, Path], **kw) -> ContainerFiles:
    return ContainerFiles(client, [(PurePosixPath(r), r) for r in roots], **kw)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


async def _wait_for(path: Path, lines: int = 1) -> list[int]:
    with anyio.fail_after(30):
        while not path.exists() or len(path.read_text().split()) < lines:  # noqa: ASYNC110 (another process)
            await anyio.sleep(0.01)
    return [int(x) for x in path.read_text().split()]


def test_source_is_python_3_8_and_self_contained() -> None:
    text = helper_source()
    ast.parse(text, feature_version=(3, 8))
    assert len(text.encode()) < 128 * 1024  # one argv string (MAX_ARG_STRLEN)
    tree = ast.parse(text)
    imported = {
        alias.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {
        node.module.split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom) and node.module
    }
    # What the test image's python3-minimal has (checked with `podman run ... python3 -c "import X"`).
    allowed = {"__future__", "marshal", "os", "re", "signal", "stat", "struct", "subprocess", "sys",
               "threading", "time", "pathlib", "typing", "errno", "functools"}  # fmt: skip
    assert imported - allowed == set()


async def test_handshake_and_every_file_op(helper_argv: list[str], roots: tuple[Path, Path]) -> None:
    ws, extra = roots
    (ws / "a.txt").write_text("one\ntwo\n")
    (ws / "d").mkdir()
    (ws / "d" / "b.bin").write_bytes(b"\x00\x01" * 50)
    (ws / "lnk").symlink_to("a.txt")
    async with helper_process(helper_argv) as (client, _):
        version = (await anyio.run_process([helper_argv[0], "-V"])).stdout.decode().split()[1]
        assert client.info == {"python": version, "shell": "/bin/bash"}
        files = _files(client, roots)
        assert isinstance(files, Files)
        place = await files.resolve("a.txt")
        assert (place.path, place.root, place.display, place.kind) == (
            PurePosixPath(ws / "a.txt"), PurePosixPath(ws), "a.txt", "file",
        )  # fmt: skip
        assert (await files.resolve("d")).kind == "dir"
        assert (await files.resolve("new/x")).kind == "missing"
        assert (await files.resolve(str(extra))).display == str(extra)
        assert await files.read_text(place.path) == "one\ntwo\n"
        assert await files.list_dir(await files.resolve(".")) == _list_dir(ws, ws)
        data, size = await files.read_bytes(await files.resolve("d/b.bin"), 10)
        assert (data, size) == (b"\x00\x01" * 5, 100)
        with pytest.raises(BinaryFileError):
            await files.read_text(PurePosixPath(ws / "d/b.bin"))
        with pytest.raises(FileNotFoundError):
            await files.read_text(PurePosixPath(ws / "nope"))
        with pytest.raises(IsADirectoryError):
            await files.read_text(PurePosixPath(ws / "d"))
        with pytest.raises(NotADirectoryError):
            await files.read_text(PurePosixPath(ws / "a.txt/x"))
        with pytest.raises(PathChangedError):  # a symlink as the file itself is never followed
            await files.read_text(PurePosixPath(ws / "lnk"))
        (ws / "big.txt").touch()
        os.truncate(ws / "big.txt", MAX_READ_BYTES + 10)
        with pytest.raises(ToolError, match="larger than 20 MB"):
            await files.read_text(PurePosixPath(ws / "big.txt"))
        assert files.editor_path(place) == str(ws / "a.txt")
        scan = await files.scan(PurePosixPath(ws))
        assert scan["files"]["a.txt"] == [
            8,
            (ws / "a.txt").stat().st_mtime_ns,
            stat.S_IMODE((ws / "a.txt").stat().st_mode),
        ]
        assert scan["dirs"] == ["d"] and scan["symlinks"] == {"lnk": "a.txt"} and not scan["truncated"]
        assert set(scan["files"]) == {"a.txt", "d/b.bin", "big.txt"}


async def test_editor_path_is_the_container_path_without_a_host_root(
    helper_argv: list[str], roots: tuple[Path, Path]
) -> None:
    ws, extra = roots
    async with helper_process(helper_argv) as (client, _):
        files = ContainerFiles(client, [(PurePosixPath(ws), Path("/host/ws")), (PurePosixPath(extra), None)])
        (ws / "s").mkdir()
        assert files.editor_path(await files.resolve("s/f.py")) == "/host/ws/s/f.py"
        assert files.editor_path(await files.resolve(f"{extra}/f.py")) == f"{extra}/f.py"


async def test_write_is_atomic_keeps_the_mode_and_never_follows_a_symlink(
    helper_argv: list[str], roots: tuple[Path, Path]
) -> None:
    ws, _ = roots
    target = ws / "x.sh"
    target.write_text("old")
    target.chmod(0o750)
    inode = target.stat().st_ino
    (ws / "victim").write_text("keep")
    (ws / "link").symlink_to(ws / "victim")
    async with helper_process(helper_argv) as (client, _):
        files = _files(client, roots)
        await files.write_text(PurePosixPath(target), "new\r\n")
        assert target.read_bytes() == b"new\r\n"
        assert stat.S_IMODE(target.stat().st_mode) == 0o750
        assert target.stat().st_ino != inode  # replaced by a rename, not rewritten in place
        await files.write_text(PurePosixPath(ws / "p/q/r.txt"), "deep")
        assert (ws / "p/q/r.txt").read_text() == "deep"
        with pytest.raises(PathChangedError):
            await files.write_text(PurePosixPath(ws / "link"), "evil")
        assert (ws / "victim").read_text() == "keep" and (ws / "link").is_symlink()
        assert not [p for p in ws.rglob("*") if p.name.startswith(".crow-write")]


ATTACKS = [
    "a.txt", ".", "d", "d/../a.txt", "../x", "d/../../x", "/etc/passwd", "out/passwd", "out",
    "inlink/x", "l1", "l1/x", "missing/../l1/..", "missing/../../x", "missing/new.txt", "a\x00b",
    "x" * 256, "a/" * 2100, "/proc/self/root/etc", "\ud800", "to_extra/f", "a.txt/x",
]  # fmt: skip


async def test_confinement_matches_the_local_workspace_word_for_word(
    helper_argv: list[str], roots: tuple[Path, Path]
) -> None:
    ws, extra = roots
    (ws / "a.txt").write_text("x")
    (ws / "d").mkdir()
    (ws / "out").symlink_to("/etc")
    (ws / "inlink").symlink_to("d")
    (ws / "l1").symlink_to("l2")
    (ws / "l2").symlink_to("l1")
    (extra / "f").write_text("in another root")
    (ws / "to_extra").symlink_to(extra)
    local = LocalFiles(Workspace(ws, extra_roots=[extra]))
    deep = "d/" + "n" * 200 + "/" + "m" * 200 + "/"
    attacks = [*ATTACKS, str(extra / "f"), str(ws) + "/../extra/f", deep * 9 + "f"]
    async with helper_process(helper_argv) as (client, _):
        files = _files(client, roots)
        for path in attacks:
            answers = []
            for side in (local, files):
                try:
                    place = await side.resolve(path)
                    answers.append((str(place.path), str(place.root), place.display, place.kind))
                except ToolError as exc:
                    answers.append(f"refused: {exc}")
            assert answers[1] == answers[0], path


def _tree(ws: Path) -> None:
    layout = {
        ".gitignore": "*.log\nbuild/\n/top.txt\n!keep.log\nsub/**/deep.txt\n# comment\n",
        "a.py": "import os\nprint('TODO one')\n", "x.log": "TODO log", "keep.log": "TODO keep",
        "top.txt": "TODO top", "sub/top.txt": "TODO sub top", "build/b.py": "TODO built",
        "sub/build": "TODO a file named build", "sub/.gitignore": "*.py\n!main.py\n",
        "sub/main.py": "todo main\nTODO again\n", "sub/other.py": "TODO other",
        "sub/a/b/deep.txt": "TODO deep", "deep.txt": "TODO shallow", ".git/config": "TODO git",
        "nested/.gitignore": "/anchored.txt\n", "nested/anchored.txt": "TODO", "nested/x/anchored.txt": "TODO",
        "bin.dat": "TODO\x00binary", "long.txt": "TODO " + "y" * 900,
    }  # fmt: skip
    for name, text in layout.items():
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(text)


async def test_glob_and_grep_match_the_local_search(helper_argv: list[str], roots: tuple[Path, Path]) -> None:
    ws, _ = roots
    _tree(ws)
    async with helper_process(helper_argv) as (client, _):
        files = _files(client, roots)
        root = await files.resolve(".")
        found, truncated = await files.glob(root, "**/*", 1000)
        assert (found, truncated) == search.glob_files(ws, ws, "**/*", 1000)
        assert sorted(found) == sorted([
            ".gitignore", "a.py", "keep.log", "sub/build", "sub/top.txt", "sub/.gitignore", "sub/main.py", "deep.txt",
            "nested/.gitignore", "nested/x/anchored.txt", "bin.dat", "long.txt",
        ])  # fmt: skip
        assert await files.glob(root, "**/*.{py,log}", 2) == search.glob_files(ws, ws, "**/*.{py,log}", 2)
        with pytest.raises(ToolError, match="must be relative"):
            await files.glob(root, "/etc/*", 5)
        for query in (
            GrepQuery("TODO", None, False, "content", 100),
            GrepQuery("todo", "*.py", True, "files_with_matches", 100),
            GrepQuery("TODO", None, False, "count", 100),
            GrepQuery("TODO", "sub/**", False, "content", 1),
        ):
            local = search._grep_python(ws, ws, query, threading.Event())
            assert await files.grep(root, query) == local, query
        assert "line cut, 905 chars" in str(
            await files.grep(root, GrepQuery("y{9}", None, False, "content", 9))
        )
        with pytest.raises(ToolError, match="invalid regex"):
            await files.grep(root, GrepQuery("(", None, False, "content", 9))


async def test_names_in_another_root_come_back_absolute(
    helper_argv: list[str], roots: tuple[Path, Path]
) -> None:
    extra = roots[1]
    (extra / "f.txt").write_text("needle")
    async with helper_process(helper_argv) as (client, _):
        files = _files(client, roots)
        start = await files.resolve(str(extra))
        assert await files.glob(start, "*.txt", 10) == ([f"{extra}/f.txt"], False)
        result = await files.grep(start, GrepQuery("needle", None, False, "files_with_matches", 10))
        assert result.files == [f"{extra}/f.txt"]


async def test_run_exit_codes_environment_and_output_cap(
    helper_argv: list[str], roots: tuple[Path, Path]
) -> None:
    ws, _ = roots
    async with helper_process(helper_argv, {"HELPER_OWN": "own"}) as (client, _):
        files = _files(client, roots, env={"GIVEN": "given"})
        result = await files.run("echo $HELPER_OWN $GIVEN; pwd; exit 3", PurePosixPath(ws), 30)
        assert (result.output, result.exit_code, result.timed_out) == (f"own given\n{ws}\n", 3, False)
        assert (await files.run("kill -9 $$", PurePosixPath(ws), 30)).exit_code == -9
        big = await files.run("head -c 300000 /dev/zero | tr '\\0' a; echo; echo END", PurePosixPath(ws), 30)
        assert big.truncated and big.output.endswith("END\n")
        assert "\n\n... [200005 bytes of output omitted] ...\n\n" in big.output  # 300005 - 100000


async def test_timeout_and_exit_kill_the_whole_tree(helper_argv: list[str], roots: tuple[Path, Path]) -> None:
    ws, _ = roots
    async with helper_process(helper_argv) as (client, _):
        files = _files(client, roots)
        result = await files.run("sleep 100 & echo $! > pid; wait", PurePosixPath(ws), 0.5)
        assert result.timed_out and result.exit_code is None
        (grandchild,) = await _wait_for(ws / "pid")
        assert not _alive(grandchild)
        result = await files.run("sleep 100 & echo $!", PurePosixPath(ws), 30)
        assert result.exit_code == 0 and not _alive(int(result.output))  # the background job went too


async def test_cancel_kills_the_command_before_the_call_returns(
    helper_argv: list[str], roots: tuple[Path, Path]
) -> None:
    ws, _ = roots
    async with helper_process(helper_argv) as (client, _):
        files = _files(client, roots)
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                command = "trap '' TERM; sleep 100 & echo $$ $! > pids; wait"
                tg.start_soon(files.run, command, PurePosixPath(ws), 60)
                shell, sleeper = await _wait_for(ws / "pids", 2)
                began = time.monotonic()
                scope.cancel()
        print(f"cancel answered after {1000 * (time.monotonic() - began):.0f} ms")  # bench: < 200 ms
        assert not _alive(shell) and not _alive(sleeper)  # TERM ignored: killed by the KILL


async def test_many_requests_in_flight(helper_argv: list[str], roots: tuple[Path, Path]) -> None:
    ws, _ = roots
    for i in range(40):
        (ws / f"f{i}").write_text(f"content {i}")
    answers: dict[str, str] = {}
    async with helper_process(helper_argv) as (client, _):
        files = _files(client, roots)

        async def run(i: int) -> None:
            answers[f"run{i}"] = (await files.run(f"sleep 0.2; echo {i}", PurePosixPath(ws), 30)).output

        async def read(i: int) -> None:
            answers[f"read{i}"] = await files.read_text(PurePosixPath(ws / f"f{i}"))

        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(run, i)
                tg.start_soon(read, i)
    assert answers == {
        **{f"run{i}": f"{i}\n" for i in range(40)},
        **{f"read{i}": f"content {i}" for i in range(40)},
    }


async def _run_until_gone(files: ContainerFiles, command: str, gone: list[BaseException]) -> None:
    try:
        await files.run(command, files.roots[0], 60)
    except HelperGone as exc:
        gone.append(exc)


async def test_helper_killed_mid_request_fails_every_waiter(
    helper_argv: list[str], roots: tuple[Path, Path]
) -> None:
    ws, _ = roots
    failures: list[BaseException] = []
    async with helper_process(helper_argv) as (client, process):
        files = _files(client, roots)

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(_run_until_gone, files, "echo $$ >> pids; sleep 100", failures)
            pids = await _wait_for(ws / "pids", 5)
            process.send_signal(signal.SIGKILL)
        with pytest.raises(HelperGone, match="exited"):
            await files.read_text(PurePosixPath(ws / "pids"))
    for pid in pids:  # a SIGKILLed helper cannot kill them: in a container, its removal does
        os.killpg(pid, signal.SIGKILL)
    assert len(failures) == 5 and all("exited" in str(e) for e in failures)


async def test_aclose_ends_the_helper_and_its_commands(
    helper_argv: list[str], roots: tuple[Path, Path]
) -> None:
    ws, _ = roots
    async with helper_process(helper_argv) as (client, process):
        files = _files(client, roots)
        gone: list[BaseException] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(_run_until_gone, files, "echo $$ > pid; sleep 100", gone)
            (shell,) = await _wait_for(ws / "pid")
            await client.aclose()
        with anyio.fail_after(10):
            await process.wait()
        assert gone and not _alive(shell)


async def test_a_command_forging_the_helpers_output_breaks_only_the_stream(
    helper_argv: list[str], roots: tuple[Path, Path]
) -> None:
    ws, _ = roots
    async with helper_process(helper_argv) as (client, _):
        files = _files(client, roots)
        # fd 4 is the helper's private copy of its stdout (fd 3 its stdin): garbage there.
        with pytest.raises(HelperProtocolError, match="frame of 4294967295 bytes"):
            await files.run(
                "printf '\\377\\377\\377\\377' > /proc/$PPID/fd/4; sleep 1", PurePosixPath(ws), 30
            )
        with pytest.raises(HelperProtocolError):
            await files.read_text(PurePosixPath(ws / "x"))


FAKE = """
import os, struct, sys
def frame(text, blob=b""):
    body = struct.pack(">I", len(text)) + text + blob
    os.write(1, struct.pack(">I", len(body)) + body)
frame(b'{"ready": true, "python": "3.11.2", "shell": "/bin/sh"}')
sys.stdin.buffer.read(4)
"""
FORGERIES = {
    "oversized": ("os.write(1, struct.pack('>I', 1 << 31))", "frame of 2147483648 bytes"),
    "not json": ("frame(b'\\x80\\x03garbage')", "not JSON"),
    "marshal": ("import marshal; frame(marshal.dumps({'id': 1, 'ok': {}}))", "not JSON"),
    "deep": ("frame(b'{\"id\": 1, \"ok\": ' + b'[' * 200000 + b']' * 200000 + b'}')", "not JSON"),
    "unknown id": ('frame(b\'{"id": 99, "ok": {}}\')', "never made"),
    "not an object": ("frame(b'[1, 2]')", "not a JSON object"),
    "wrong shape": ('frame(b\'{"id": 1, "ok": {"entries": "no", "truncated": false}}\')', "wrong shape"),
    "bad entry": (
        'frame(b\'{"id": 1, "ok": {"entries": [{"name": 1, "type": "file"}], "truncated": false}}\')',
        "wrong shape",
    ),
    "malformed error": ('frame(b\'{"id": 1, "error": "boom"}\')', "malformed error"),
    "short frame": ("os.write(1, struct.pack('>I', 2) + b'ab')", "malformed frame"),
}


@pytest.mark.parametrize("case", sorted(FORGERIES))
async def test_forged_or_garbled_answers_are_refused_cleanly(case: str, roots: tuple[Path, Path]) -> None:
    code, message = FORGERIES[case]
    script = FAKE + code + "\nsys.stdin.buffer.read()\n"
    async with helper_process([sys.executable, "-c", script]) as (client, process):
        files = _files(client, roots)
        with pytest.raises(HelperProtocolError, match=message):
            await files.list_dir(await _place(files))
        with pytest.raises(HelperProtocolError, match=message):  # and the client stays failed
            await files.read_text(PurePosixPath(roots[0] / "x"))
        with anyio.fail_after(10):  # its stream was closed: the helper saw the end of its input
            await process.wait()


async def _place(files: ContainerFiles):
    from mcp_servers.filesystem.files import Place

    return Place(files.roots[0], files.roots[0], ".", "dir")


async def test_a_missing_handshake_or_a_cut_stream_is_reported(roots: tuple[Path, Path]) -> None:
    script = "import os, struct; os.write(1, struct.pack('>II', 100, 6) + b'{\"id\":')"
    async with helper_process([sys.executable, "-c", script], handshake=False) as (client, _):
        with pytest.raises(HelperGone, match="exited") as caught:
            await client.handshake()
        assert not isinstance(caught.value, HelperProtocolError)
    script = "import os, struct; os.write(1, struct.pack('>II', 12, 8) + b'{\"id\":1}'); import sys; sys.stdin.read()"
    async with helper_process([sys.executable, "-c", script], handshake=False) as (client, _):
        with pytest.raises(HelperProtocolError, match="handshake"):
            await client.handshake()


async def test_a_run_cancelled_as_the_helper_dies_is_still_just_cancelled(roots: tuple[Path, Path]) -> None:
    # The fake reads the run request, says so, then exits on the next frame: the cancel.
    script = FAKE.replace("sys.stdin.buffer.read(4)", "") + (
        "def skip():\n    sys.stdin.buffer.read(struct.unpack('>I', sys.stdin.buffer.read(4))[0])\n"
        f"skip(); open({str(roots[0] / 'got')!r}, 'w').write('1'); skip()\n"
    )
    async with helper_process([sys.executable, "-c", script]) as (client, _):
        files = _files(client, roots)
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(files.run, "sleep 100", files.roots[0], 60)
                await _wait_for(roots[0] / "got")
                scope.cancel()
        assert scope.cancelled_caught  # not a HelperGone from the cancel's own request


async def test_scan_stops_at_its_cap(roots: tuple[Path, Path]) -> None:
    ws, _ = roots
    for i in range(10):
        (ws / f"f{i}").write_text("x")
    source = helper_source().replace("SCAN_CAP = 200_000", "SCAN_CAP = 3")
    assert "SCAN_CAP = 3" in source
    async with helper_process([sys.executable, "-c", source]) as (client, _):
        scan = await _files(client, roots).scan(PurePosixPath(ws))
    assert scan["truncated"] and len(scan["files"]) == 3


async def test_a_helper_out_of_threads_answers_instead_of_dying(roots: tuple[Path, Path]) -> None:
    # What a fork bomb in the container leaves: no thread can start. The helper says so.
    no_threads = 'def _refuse(self):\n    raise RuntimeError("can\'t start new thread")\nthreading.Thread.start = _refuse\n'
    source = helper_source()
    assert source.endswith("\nmain()\n")
    argv = [sys.executable, "-c", source.removesuffix("main()\n") + no_threads + "main()\n"]
    async with helper_process(argv) as (client, _):
        files = _files(client, roots)
        for _ in range(2):  # and it keeps serving
            with pytest.raises(BlockingIOError, match="can't start new thread"):
                await files.read_text(PurePosixPath(roots[0] / "x"))


async def test_a_waiter_cancelled_while_decoding_anothers_answer_does_not_lose_it(
    roots: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fake answers request 2 first; the waiter of request 1 reads that frame and is
    # cancelled while it is being decoded (in a thread: large answers are).
    script = FAKE.replace("sys.stdin.buffer.read(4)", "") + (
        "def skip():\n    sys.stdin.buffer.read(struct.unpack('>I', sys.stdin.buffer.read(4))[0])\n"
        "skip(); skip()\n"
        'frame(b\'{"id": 2, "ok": {"entries": [], "truncated": false}}\')\n'
        'frame(b\'{"id": 1, "ok": {"entries": [], "truncated": false}}\')\n'
    )
    decoding, gate = anyio.Event(), anyio.Event()
    real = anyio.to_thread.run_sync

    async def slow_decode(*args: object, **kwargs: object) -> object:
        decoding.set()
        await gate.wait()
        return await real(*args, **kwargs)

    second: list[object] = []
    async with helper_process([sys.executable, "-c", script]) as (client, _):
        monkeypatch.setattr(protocol, "_THREAD_DECODE", 0)  # after the handshake
        monkeypatch.setattr(anyio.to_thread, "run_sync", slow_decode)
        files = _files(client, roots)
        place = await _place(files)

        first = anyio.CancelScope()

        async def list_first() -> None:
            with first:
                await files.list_dir(place)

        async def list_second() -> None:
            second.append(await files.list_dir(place))

        async with anyio.create_task_group() as tg:
            tg.start_soon(list_first)
            with anyio.fail_after(10):
                while not client._read_lock.locked():  # noqa: ASYNC110 (request 1 reads first)
                    await anyio.sleep(0.001)
            tg.start_soon(list_second)
            await decoding.wait()
            first.cancel()
            gate.set()
            with anyio.fail_after(10):
                while not second:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
    assert second == [[]]


async def test_grep_skips_fifos_and_devices(helper_argv: list[str], roots: tuple[Path, Path]) -> None:
    # A FIFO blocked the search on open; a device (here one like /dev/zero) never ended.
    ws, _ = roots
    (ws / "a.txt").write_text("needle")
    os.mkfifo(ws / "pipe.txt")
    os.mknod(ws / "zero.txt", stat.S_IFCHR | 0o666, os.makedev(1, 5))
    async with helper_process(helper_argv) as (client, _):
        files = _files(client, roots)
        with anyio.fail_after(20):
            found = await files.grep(
                await files.resolve("."), GrepQuery("needle", None, False, "files_with_matches", 9)
            )
    assert found.files == ["a.txt"]


async def test_a_gitignore_that_is_a_fifo_or_a_symlink_is_not_read(
    helper_argv: list[str], roots: tuple[Path, Path]
) -> None:
    ws, _ = roots
    for folder in ("fifo", "linked"):
        (ws / folder).mkdir()
        (ws / folder / "f.txt").write_text("x")
    os.mkfifo(ws / "fifo" / ".gitignore")
    (ws / "rules").write_text("*.txt\n")
    (ws / "linked" / ".gitignore").symlink_to(ws / "rules")  # git does not follow it either
    async with helper_process(helper_argv) as (client, _):
        files = _files(client, roots)
        with anyio.fail_after(20):
            found, _ = await files.glob(await files.resolve("."), "**/f.txt", 9)
    assert found == ["fifo/f.txt", "linked/f.txt"]
    assert search.glob_files(ws, ws, "**/f.txt", 9) == (found, False)  # the local disk agrees


async def test_a_cancelled_grep_stops_walking(roots: tuple[Path, Path]) -> None:
    ws, _ = roots
    for i in range(100):
        (ws / f"f{i:03}.txt").write_text("needle")
    seen = ws.parent / "seen"
    # Each file read takes 50 ms and is counted: 5 s for the whole tree if nothing stops it.
    slow = (
        "_plain_read_text = _read_text\n"
        "def _read_text(path):\n"
        f"    with open({str(seen)!r}, 'a') as f:\n"
        "        f.write('x')\n"
        "    time.sleep(0.05)\n"
        "    return _plain_read_text(path)\n"
    )
    source = helper_source().removesuffix("main()\n") + "import time\n" + slow + "main()\n"
    async with helper_process([sys.executable, "-c", source]) as (client, _):
        files = _files(client, roots)
        place = await files.resolve(".")
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(files.grep, place, GrepQuery("needle", None, False, "content", 500))
                with anyio.fail_after(10):
                    while not seen.exists():  # noqa: ASYNC110 (the helper writes it)
                        await anyio.sleep(0.01)
                scope.cancel()
        read = len(seen.read_text())
        await anyio.sleep(
            0.5
        )  # the grep's thread was told to stop (and said it had) before the call returned
        assert len(seen.read_text()) == read < 100


async def test_a_read_answer_that_is_not_utf8_ends_the_stream(roots: tuple[Path, Path]) -> None:
    script = FAKE + "frame(b'{\"id\": 1, \"ok\": {}}', b'\\xff\\xfe')\nsys.stdin.buffer.read()\n"
    async with helper_process([sys.executable, "-c", script]) as (client, process):
        files = _files(client, roots)
        for _ in range(2):
            with pytest.raises(HelperProtocolError, match="answer to read is not UTF-8"):
                await files.read_text(PurePosixPath(roots[0] / "x"))
        with anyio.fail_after(10):
            await process.wait()
