"""The workspace in copy mode (container/sync.py, synchost.py): this machine's side first
(walking, packing, the caps, applying hostile names safely), then the whole round trip
against the real Podman engine, a hostile container included."""

from __future__ import annotations

import io
import os
import socket
import tarfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from mcp_servers.filesystem import localfs
from mcp_servers.filesystem.container import synchost
from mcp_servers.filesystem.container.engine import DockerEngine
from mcp_servers.filesystem.container.protocol import HelperClient, helper_source
from mcp_servers.filesystem.container.sync import WorkspaceSync
from mcp_servers.filesystem.container.synchost import WorkspaceTooLarge


def _members(tar: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        return {m.name: m for m in t.getmembers()}


def _snapshot(folder: Path) -> dict[str, tuple[str, bytes | str | None]]:
    """Everything under `folder` (symlinks not followed), to assert nothing there changed."""
    seen: dict[str, tuple[str, bytes | str | None]] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = str(p.relative_to(folder))
            if p.is_symlink():
                seen[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                seen[rel] = ("dir", None)
            else:
                seen[rel] = ("file", p.read_bytes())
    return seen


# ------------------------------------------------------------------ walking and packing
def test_walk_keeps_files_folders_symlinks_and_git_but_skips_hidden_sockets_fifos(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (ws / "run.sh").write_text("#!/bin/sh\n")
    (ws / "run.sh").chmod(0o755)
    os.symlink("/etc/passwd", ws / "out")  # kept as a symlink, never followed
    (ws / ".crow").mkdir()
    (ws / ".crow" / "config.yaml").write_text("api_key: secret\n")
    (ws / ".netrc").write_text("machine x password y\n")
    os.mkfifo(ws / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(ws / "sock"))
    try:
        hidden = synchost.hidden_rels(ws, [ws / ".crow", ws / ".netrc", tmp_path / "elsewhere"])
        tree = synchost.walk(ws, hidden)
    finally:
        sock.close()
    assert hidden == {".crow", ".netrc"}
    assert set(tree.files) == {".git/HEAD", "run.sh"}
    assert tree.files["run.sh"][2] == 0o755
    assert tree.dirs == {".git"}
    assert tree.links == {"out": "/etc/passwd"}

    tar = synchost.pack(ws, "workspace", tree, [*tree.dirs, *tree.files, *tree.links], with_root=True)
    members = _members(tar)
    assert set(members) == {
        "workspace",
        "workspace/.git",
        "workspace/.git/HEAD",
        "workspace/run.sh",
        "workspace/out",
    }
    assert members["workspace/out"].issym() and members["workspace/out"].linkname == "/etc/passwd"
    assert members["workspace/run.sh"].mode == 0o755
    assert list(members).index("workspace/.git") < list(members).index("workspace/.git/HEAD")


def test_a_workspace_over_two_gigabytes_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with open(ws / "big.img", "wb") as f:  # sparse: costs no disk
        f.truncate(synchost.MAX_BYTES + 1)
    with pytest.raises(WorkspaceTooLarge) as err:
        synchost.walk(ws, frozenset())
    assert "more than 2 GB" in str(err.value)
    assert "use a local engine, where the workspace is mounted" in str(err.value)
    assert "smaller folder" in str(err.value)


def test_a_workspace_over_the_file_cap_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert synchost.MAX_FILES == 100_000
    monkeypatch.setattr(synchost, "MAX_FILES", 50)  # 100,000 real files take a minute here
    ws = tmp_path / "ws"
    for d in range(5):
        (ws / f"d{d}").mkdir(parents=True)
        for i in range(10):
            (ws / f"d{d}" / str(i)).touch()
    assert len(synchost.walk(ws, frozenset()).files) == 50  # the cap itself is allowed
    (ws / "one-more").touch()
    with pytest.raises(WorkspaceTooLarge, match="more than 50 files"):
        synchost.walk(ws, frozenset())


# ------------------------------------------------------------------ hostile names, checked here
@pytest.mark.parametrize(
    "name",
    ["../../x", "/etc/passwd", "a/../../x", "./a", "a//b", "", "a/./b", "..", "a\x00b", ".crow/config.yaml"],
)
def test_names_that_could_leave_the_root_or_reach_hidden_paths_are_refused(name: str) -> None:
    assert synchost.safe_rel(name, frozenset({".crow"})) is None


def test_plain_names_are_accepted() -> None:
    assert synchost.safe_rel("src/a b/ü.py", frozenset({".crow"})) == "src/a b/ü.py"
    assert synchost.safe_rel(".crowd", frozenset({".crow"})) == ".crowd"


def test_a_symlink_target_must_stay_inside_as_written_and_as_it_resolves(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    os.symlink(str(tmp_path), ws / "users_link_out")  # the user's own, pointing outside
    ok = synchost.safe_link_target
    assert ok(ws, "src/l", "../README", frozenset())
    assert ok(ws, "l", "src", frozenset())
    assert not ok(ws, "l", "/etc", frozenset())
    assert not ok(ws, "src/l", "../../x", frozenset())
    assert not ok(ws, "l", "users_link_out/x", frozenset())  # inside as written, outside once resolved
    assert not ok(ws, "l", ".crow/config.yaml", frozenset({".crow"}))


def test_writes_refuse_a_symlinked_parent_and_leave_the_outside_alone(tmp_path: Path) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    os.symlink(str(outside), ws / "d")
    before = _snapshot(outside)
    with pytest.raises(localfs.PathChangedError):
        synchost.write_file(ws, "d/x", b"pwned", 0o644)
    with pytest.raises(localfs.PathChangedError):
        synchost.write_link(ws, "d/l", "x")
    with pytest.raises(localfs.PathChangedError):
        synchost.make_dirs(ws, "d/sub")
    assert _snapshot(outside) == before


def test_write_link_replaces_a_file_atomically_but_never_a_folder(tmp_path: Path) -> None:
    ws = tmp_path
    (ws / "f").write_text("x")
    synchost.write_link(ws, "f", "target")
    assert os.readlink(ws / "f") == "target"
    (ws / "dir").mkdir()
    with pytest.raises(IsADirectoryError):
        synchost.write_link(ws, "dir", "target")
    assert (ws / "dir").is_dir() and sorted(os.listdir(ws)) == ["dir", "f"]  # no temp name left


# ------------------------------------------------------------------ the round trip, real engine
CROOT = PurePosixPath("/workspace")


@dataclass
class Box:
    """A running container with the helper exec'd in it, and a workspace on this machine."""

    engine: Any
    cid: str
    client: Any
    ws: Path
    outside: Path  # next to the workspace: nothing may ever change here

    async def sh(self, script: str) -> str:
        code, out, err = await self.engine.exec_run(self.cid, ["sh", "-c", script])
        assert code == 0, err.decode(errors="replace")
        return out.decode()

    async def read(self, path: str) -> bytes:
        code, out, _ = await self.engine.exec_run(self.cid, ["cat", path])
        assert code == 0, path
        return out

    async def exists(self, path: str) -> bool:
        code, _, _ = await self.engine.exec_run(self.cid, ["test", "-e", path])
        return code == 0


@pytest.fixture
async def box(
    podman: Any, engine: DockerEngine, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Box]:
    """A container (running as `request.param`, a user, when parametrized) with the helper
    exec'd in it, and a workspace with a folder beside it."""
    spec = {
        "Image": podman.image,
        "Labels": podman.labels,
        "Cmd": ["python3", "-c", "import signal; signal.pause()"],
        "User": getattr(request, "param", ""),
    }
    cid = await engine.create_container(spec)
    try:
        await engine.start(cid)
        client = HelperClient(await engine.exec_stream(cid, ["python3", "-c", helper_source()]))
        await client.handshake()
        ws, outside = tmp_path / "ws", tmp_path / "outside"
        ws.mkdir()
        outside.mkdir()
        (outside / "precious").write_text("the user's\n")
        yield Box(engine, cid, client, ws, outside)
        await client.aclose()
    finally:
        await engine.remove(cid)


def _sync(b: Box, hidden: list[Path] | None = None) -> WorkspaceSync:
    return WorkspaceSync(b.engine, [(CROOT, b.ws)], hidden or [])


async def _copied_in(b: Box) -> WorkspaceSync:
    """The usual workspace (_workspace), copied into the container."""
    _workspace(b.ws)
    sync = _sync(b)
    await sync.copy_in(b.cid, b.client)
    return sync


BINARY = bytes(range(256)) * 40 + b"\x00\xff\r\n"


def _workspace(ws: Path) -> None:
    (ws / "src").mkdir()
    (ws / "src" / "main.py").write_text("print('hi')\n")
    (ws / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (ws / "run.sh").chmod(0o755)
    (ws / "blob.bin").write_bytes(BINARY)
    (ws / ".git").mkdir()
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    os.symlink("src/main.py", ws / "link.py")
    (ws / "empty").mkdir()


@pytest.mark.anyio
async def test_copy_in_puts_the_workspace_in_the_container_hidden_paths_left_out(box: Box) -> None:
    _workspace(box.ws)
    (box.ws / ".crow").mkdir()
    (box.ws / ".crow" / "config.yaml").write_text("api_key: sk-secret\n")  # crow's home inside
    (box.ws / ".netrc").write_text("machine h password p\n")
    sync = _sync(box, [box.ws / ".crow", box.ws / ".netrc"])
    await sync.copy_in(box.cid, box.client)

    assert await box.read("/workspace/src/main.py") == b"print('hi')\n"
    assert await box.read("/workspace/blob.bin") == BINARY
    assert await box.read("/workspace/.git/HEAD") == b"ref: refs/heads/main\n"
    assert await box.sh("/workspace/run.sh") == "ran\n"
    assert await box.sh("readlink /workspace/link.py") == "src/main.py\n"
    assert await box.sh("test -d /workspace/empty && echo yes") == "yes\n"
    assert not await box.exists("/workspace/.crow/config.yaml")
    assert not await box.exists("/workspace/.crow")
    assert not await box.exists("/workspace/.netrc")
    assert await box.sh("grep -r sk-secret /workspace || echo none") == "none\n"


@pytest.mark.anyio
async def test_a_workspace_over_the_cap_is_refused_before_anything_is_copied(box: Box) -> None:
    with open(box.ws / "disk.img", "wb") as f:
        f.truncate(synchost.MAX_BYTES + 1)
    with pytest.raises(WorkspaceTooLarge, match="use a local engine"):
        await _sync(box).copy_in(box.cid, box.client)
    assert not await box.exists("/workspace")


@pytest.mark.anyio
async def test_the_models_changes_come_back_at_pull_binary_byte_for_byte(box: Box) -> None:
    sync = await _copied_in(box)
    assert await sync.pull(box.cid, box.client) == []  # nothing changed: nothing to say

    new_binary = bytes(reversed(BINARY)) + b"\x00" * 1000
    await box.engine.put_archive(box.cid, "/workspace/src", _tar_of({"data.bin": new_binary}))
    await box.sh(
        "cd /workspace && echo 'print(1)' > src/main.py && mkdir -p pkg/deep && echo x > pkg/deep/new.txt"
        " && chmod 700 run.sh && ln -s ../src pkg/src && rm blob.bin && rmdir empty"
    )
    assert await sync.pull(box.cid, box.client) == []
    assert (box.ws / "src" / "main.py").read_text() == "print(1)\n"
    assert (box.ws / "src" / "data.bin").read_bytes() == new_binary
    assert (box.ws / "pkg" / "deep" / "new.txt").read_text() == "x\n"
    assert os.readlink(box.ws / "pkg" / "src") == "../src"
    assert (box.ws / "run.sh").stat().st_mode & 0o777 == 0o700
    assert not (box.ws / "blob.bin").exists()
    assert not (box.ws / "empty").exists()
    assert _snapshot(box.outside) == {"precious": ("file", b"the user's\n")}
    assert await sync.pull(box.cid, box.client) == []  # and nothing comes back twice


@pytest.mark.anyio
async def test_the_users_edits_between_turns_reach_the_container_at_push(box: Box) -> None:
    sync = await _copied_in(box)
    (box.ws / "src" / "main.py").write_text("print('edited')\n")
    (box.ws / "docs").mkdir()
    (box.ws / "docs" / "new.md").write_text("# new\n")
    (box.ws / "blob.bin").unlink()
    (box.ws / "src" / "main.py").chmod(0o600)
    os.rmdir(box.ws / "empty")
    os.unlink(box.ws / "link.py")
    os.symlink("docs/new.md", box.ws / "link.py")
    assert await sync.push(box.cid, box.client) == []
    assert await box.read("/workspace/src/main.py") == b"print('edited')\n"
    assert await box.sh("stat -c %a /workspace/src/main.py") == "600\n"
    assert await box.read("/workspace/docs/new.md") == b"# new\n"
    assert await box.sh("readlink /workspace/link.py") == "docs/new.md\n"
    assert not await box.exists("/workspace/blob.bin")
    assert not await box.exists("/workspace/empty")
    # What was pushed does not come back as the model's change, nor is lost on the way.
    assert await sync.pull(box.cid, box.client) == []
    assert (box.ws / "src" / "main.py").read_text() == "print('edited')\n"


@pytest.mark.anyio
async def test_a_file_changed_on_both_sides_keeps_the_users_version(box: Box) -> None:
    sync = await _copied_in(box)
    await box.sh("echo model > /workspace/src/main.py && echo model > /workspace/both-new.txt")
    (box.ws / "src" / "main.py").write_text("user\n")
    (box.ws / "both-new.txt").write_text("user\n")
    notices = await sync.pull(box.cid, box.client)
    assert sorted(notices) == sorted(
        f"{box.ws / n}: changed here during the turn and changed in the container; "
        "kept yours, the model's version was dropped"
        for n in ("src/main.py", "both-new.txt")
    )
    assert (box.ws / "src" / "main.py").read_text() == "user\n"
    assert (box.ws / "both-new.txt").read_text() == "user\n"
    assert sorted(os.listdir(box.ws / "src")) == ["main.py"]  # no copy of the model's beside it
    # The next turn starts with the user's version in the container too.
    await sync.push(box.cid, box.client)
    assert await box.read("/workspace/src/main.py") == b"user\n"
    assert await box.read("/workspace/both-new.txt") == b"user\n"


@pytest.mark.anyio
async def test_deletions_come_back_only_for_what_the_user_left_alone(box: Box) -> None:
    _workspace(box.ws)
    (box.ws / "keep.txt").write_text("v1\n")
    sync = _sync(box)
    await sync.copy_in(box.cid, box.client)
    await box.sh("cd /workspace && rm -r src keep.txt link.py run.sh")
    (box.ws / "keep.txt").write_text("v2, the user's\n")
    (box.ws / "run.sh").unlink()  # deleted on both sides: they agree, nothing to say
    notices = await sync.pull(box.cid, box.client)
    assert notices == [
        f"{box.ws / 'keep.txt'}: changed here during the turn and deleted in the container; "
        "kept yours, the model's version was dropped"
    ]
    assert not (box.ws / "src").exists() and not os.path.lexists(box.ws / "link.py")
    assert (box.ws / "keep.txt").read_text() == "v2, the user's\n"
    await sync.push(box.cid, box.client)
    assert await box.read("/workspace/keep.txt") == b"v2, the user's\n"


@pytest.mark.anyio
async def test_symlinks_leading_out_do_not_come_back(box: Box) -> None:
    sync = await _copied_in(box)
    await box.sh(
        f"cd /workspace && ln -s /etc etc && ln -s ../../.. up && ln -s {box.outside} out && mkdir d && ln -s ../.. d/up"
    )
    notices = await sync.pull(box.cid, box.client)
    assert sorted(notices) == sorted(
        f"skipped the symlink {n} -> {t} from the container: it leads outside"
        for n, t in (("etc", "/etc"), ("up", "../../.."), ("out", str(box.outside)), ("d/up", "../.."))
    )
    assert sorted(os.listdir(box.ws)) == sorted(
        [".git", "blob.bin", "d", "empty", "link.py", "run.sh", "src"]
    )
    assert os.listdir(box.ws / "d") == []
    assert _snapshot(box.outside) == {"precious": ("file", b"the user's\n")}


def _tar_of(files: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            t.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            t.addfile(info)
    return buf.getvalue()


class _Forging:
    """A helper (and engine) a hostile command has taken over: its scan lists extra entries
    and the engine's archives carry extra members."""

    def __init__(self, real: Any, files: dict[str, Any], members: bytes | None = None, **fields: Any) -> None:
        self.real, self.files, self.members, self.fields = real, files, members, fields

    async def call(self, op: str, shape: Any, **args: Any) -> tuple[Any, bytes]:
        result, blob = await self.real.call(op, shape, **args)
        if op == "scan":
            result["files"].update(self.files)
            result.update(self.fields)
        return result, blob

    async def get_archive(self, cid: str, path: str, **kwargs: Any) -> bytes:
        if self.members is not None:
            return self.members
        return await self.real.get_archive(cid, path, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.mark.anyio
async def test_forged_names_in_the_scan_never_write_outside(box: Box) -> None:
    sync = await _copied_in(box)
    forged = {
        n: [5, 1, 0o644]
        for n in ("../outside/x", "../../x", f"{box.outside}/x", "src/../../outside/x", "./x")
    }
    client = _Forging(box.client, forged)
    before = _snapshot(box.ws.parent)
    notices = await sync.pull(box.cid, client)
    assert sorted(notices) == sorted(
        f"skipped {n!r} from the container: outside the workspace, or hidden" for n in forged
    )
    assert _snapshot(box.ws.parent) == before
    # A name that is fine but not there (deleted between the scan and the copy): no harm.
    assert await sync.pull(box.cid, _Forging(box.client, {"ghost.txt": [5, 1, 0o644]})) == []
    assert not (box.ws / "ghost.txt").exists()


@pytest.mark.anyio
async def test_forged_archive_members_never_write_outside(box: Box) -> None:
    sync = await _copied_in(box)
    await box.sh("echo model > /workspace/src/main.py")
    hostile = _tar_of(
        {"../outside/x": b"pwned", f"{box.outside}/precious": b"pwned", "main.py/../../x": b"pwned"},
        links={"main.py": str(box.outside / "precious")},  # the wanted name, but a symlink
    )
    engine = _Forging(box.engine, {}, hostile)
    sync._engine = engine  # type: ignore[assignment]  # the engine's answers forged from here on
    before = _snapshot(box.ws.parent)
    await sync.pull(box.cid, box.client)
    assert _snapshot(box.ws.parent) == before  # nothing written, the user's file as it was
    sync._engine = box.engine  # type: ignore[assignment]
    await box.sh("touch /workspace/src/main.py")  # the next pull fetches it again, honestly
    assert await sync.pull(box.cid, box.client) == []
    assert (box.ws / "src" / "main.py").read_text() == "model\n"


@pytest.mark.anyio
async def test_a_symlinked_parent_here_is_not_followed(box: Box) -> None:
    os.symlink(str(box.outside), box.ws / "data")  # the user's own link, pointing outside
    sync = _sync(box)
    await sync.copy_in(box.cid, box.client)
    assert await box.sh("readlink /workspace/data") == f"{box.outside}\n"  # copied as a link
    # A forged scan says `data/precious` is a new file (while `data` still looks like the link).
    client = _Forging(box.client, {"data/precious": [6, 1, 0o644]})
    engine = _Forging(box.engine, {}, _tar_of({"precious": b"pwned\n"}))
    sync._engine = engine  # type: ignore[assignment]
    notices = await sync.pull(box.cid, client)
    assert notices == ["skipped 'data/precious' from the container: a symlink here is on its way"]
    assert _snapshot(box.outside) == {"precious": ("file", b"the user's\n")}


class _Counting:
    """The real engine or client, its calls counted."""

    def __init__(self, real: Any) -> None:
        self.real, self.calls = real, []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.real, name)
        if not callable(attr):
            return attr

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args[1] if name != "call" else args[0]))
            return await attr(*args, **kwargs)

        return counted


@pytest.mark.anyio
async def test_a_quiet_turn_costs_one_scan_and_changes_come_in_one_archive(box: Box) -> None:
    for i in range(30):
        (box.ws / "pkg").mkdir(exist_ok=True)
        (box.ws / "pkg" / f"m{i}.py").write_text(f"m = {i}\n")
    (box.ws / "README").write_text("read me\n")
    engine, client = _Counting(box.engine), _Counting(box.client)
    sync = WorkspaceSync(engine, [(CROOT, box.ws)])
    await sync.copy_in(box.cid, client)
    engine.calls.clear()
    client.calls.clear()
    assert await sync.push(box.cid, client) == [] and await sync.pull(box.cid, client) == []
    assert engine.calls == [] and client.calls == [("call", "scan")]

    await box.engine.exec_run(
        box.cid, ["sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do echo $i >> /workspace/pkg/m$i.py; done"]
    )
    client.calls.clear()
    assert await sync.pull(box.cid, client) == []
    assert engine.calls == [("get_archive", "/workspace/pkg")]
    assert (box.ws / "pkg" / "m10.py").read_text() == "m = 10\n10\n"


def test_the_fetch_plan_weighs_calls_against_bytes() -> None:
    from mcp_servers.filesystem.container.sync import _CALL_BYTES, _plan

    small = {f"src/m{i}.py": (1000, 1, 0o644) for i in range(100)}
    big = {f"data/d{i}.bin": (_CALL_BYTES, 1, 0o644) for i in range(10)}
    files = {**small, **big, "README": (100, 1, 0o644)}
    assert _plan(files, ["src/m1.py"]) == ["src/m1.py"]  # one file: just it
    assert _plan(files, [f"src/m{i}.py" for i in range(10)]) == ["src"]  # one folder: one call
    assert _plan(files, ["data/d1.bin", "data/d2.bin"]) == ["data/d1.bin", "data/d2.bin"]  # not 20 MB for 4
    assert sorted(_plan(files, ["src/m1.py", "src/m2.py", "data/d1.bin"])) == ["data/d1.bin", "src"]
    assert _plan(small | {"README": (100, 1, 0o644)}, ["src/m1.py", "README"]) == [""]  # the whole root


@pytest.mark.anyio
async def test_a_file_the_model_only_touched_is_left_as_it_is_here(box: Box) -> None:
    sync = await _copied_in(box)
    before = (box.ws / "src" / "main.py").stat()
    await box.sh("touch -d '2001-01-01' /workspace/src/main.py")
    assert await sync.pull(box.cid, box.client) == []
    after = (box.ws / "src" / "main.py").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not rewritten
    assert await sync.pull(box.cid, box.client) == []


@pytest.mark.anyio
async def test_a_truncated_or_malformed_scan_deletes_nothing_here(box: Box) -> None:
    sync = await _copied_in(box)
    await box.sh("rm /workspace/src/main.py && echo new > /workspace/new.txt")
    bad = {"x.txt": [1, 2], "y.txt": "big", "z.txt": [-1, 0, 0]}
    notices = await sync.pull(box.cid, _Forging(box.client, bad, truncated=True))
    assert notices == [
        "ignored 3 malformed entries in the container's listing of /workspace",
        "/workspace in the container holds too many files to list: no deletion brought back",
    ]
    assert (box.ws / "src" / "main.py").exists()  # absent from a truncated list proves nothing
    assert (box.ws / "new.txt").read_text() == "new\n"  # what it does list still comes back
    assert not (box.ws / "x.txt").exists()


@pytest.mark.anyio
async def test_a_turn_over_the_caps_brings_nothing_back_until_it_fits(
    box: Box, monkeypatch: pytest.MonkeyPatch
) -> None:
    sync = _sync(box)
    await sync.copy_in(box.cid, box.client)
    await box.sh("mkdir /workspace/gen && cd /workspace/gen && for i in 1 2 3 4 5 6; do echo $i > f$i; done")
    monkeypatch.setattr(synchost, "MAX_FILES", 5)
    assert await sync.pull(box.cid, box.client) == [
        "the model changed more than 5 files or 2 GB in /workspace: none of it was brought back"
    ]
    assert os.listdir(box.ws) == []
    await box.sh("rm /workspace/gen/f6")
    assert await sync.pull(box.cid, box.client) == []
    assert sorted(os.listdir(box.ws / "gen")) == ["f1", "f2", "f3", "f4", "f5"]


@pytest.mark.anyio
@pytest.mark.parametrize("box", ["1000:1000"], indirect=True)
async def test_the_copy_belongs_to_the_containers_user(box: Box) -> None:
    sync = await _copied_in(box)
    assert (
        await box.sh("stat -c '%u:%g' /workspace /workspace/src/main.py /workspace/src") == "1000:1000\n" * 3
    )
    await box.sh("echo model > /workspace/src/main.py && echo new > /workspace/src/new.py")  # as user 1000
    assert await sync.pull(box.cid, box.client) == []
    assert (box.ws / "src" / "new.py").read_text() == "new\n"


@pytest.mark.anyio
async def test_an_extra_root_inside_the_workdir_is_copied_once_at_its_own_path(box: Box) -> None:
    (box.ws / "lib").mkdir()
    (box.ws / "lib" / "x.py").write_text("x = 1\n")
    (box.ws / "main.py").write_text("import lib\n")
    sync = WorkspaceSync(box.engine, [(CROOT, box.ws), (PurePosixPath("/mnt/lib"), box.ws / "lib")])
    await sync.copy_in(box.cid, box.client)
    assert await box.read("/mnt/lib/x.py") == b"x = 1\n"
    assert not await box.exists("/workspace/lib")
    await box.sh("echo 'x = 2' > /mnt/lib/x.py")
    assert await sync.pull(box.cid, box.client) == []  # one copy: no conflict with itself
    assert (box.ws / "lib" / "x.py").read_text() == "x = 2\n"
