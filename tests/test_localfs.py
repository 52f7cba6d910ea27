"""Writes that cannot tear and opens a swapped symlink cannot redirect: crow's own local
file I/O (mcp_servers/filesystem/localfs.py) under a kill, a full disk and a racing
command, driven through the real filesystem server where the tools are involved."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp_types import CallToolResult

from mcp_servers.filesystem import LocalBackend, Workspace, build_server, localfs

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parent.parent




def text(result: CallToolResult) -> str:
    return result.content[0].text  # type: ignore[union-attr]


def unnamed_temps(folder: Path) -> bool:
    """Whether this filesystem gives O_TMPFILE (overlayfs before Linux 6.6 does not)."""
    try:
        os.close(os.open(folder, os.O_TMPFILE | os.O_WRONLY, 0o600))
    except OSError:
        return False
    return True


@pytest.fixture(params=["unnamed", "named"])
def temp_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, root: Path) -> str:
    """Writes through an O_TMPFILE temp file, and through the named one used where the
    filesystem has no O_TMPFILE."""
    if request.param == "named":
        monkeypatch.setattr(localfs, "_proc_fds", lambda: False)
    elif not unnamed_temps(root):
        pytest.skip("this filesystem has no O_TMPFILE")
    return str(request.param)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".crow-write-"))


# --- a symlink swapped in between the check and the use -----------------------------


@pytest.fixture
def swap_after_resolve(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Path, Path]]]:
    """Each resolve is followed by the swaps listed (path -> symlink target): what a
    command running beside the tool could do between the check and the open."""
    swaps: list[tuple[Path, Path]] = []
    original = Workspace.resolve

    def resolve_then_swap(self: Workspace, path: str) -> Path:
        resolved = original(self, path)
        for where, target in swaps:
            where.rename(where.with_name(where.name + ".moved"))
            where.symlink_to(target)
        swaps.clear()
        return resolved

    monkeypatch.setattr(Workspace, "resolve", resolve_then_swap)
    yield swaps


async def test_a_folder_swapped_for_a_symlink_cannot_carry_a_write_outside(
    client: Client, root: Path, tmp_path: Path, swap_after_resolve: list[tuple[Path, Path]]
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("inside\n")
    for tool, args in [
        ("write_file", {"path": "src/app.py", "content": "pwned\n"}),
        ("write_file", {"path": "src/new/deeper/x.py", "content": "pwned\n"}),
        ("edit_file", {"path": "src/app.py", "old_text": "inside", "new_text": "pwned"}),
    ]:
        swap_after_resolve.append((root / "src", outside))
        result = await client.call_tool(tool, args)
        assert result.is_error, (tool, args)
        assert "changed while in use" in text(result) and "symlink" in text(result), text(result)
        (root / "src").unlink()
        (root / "src.moved").rename(root / "src")
    assert list(outside.iterdir()) == [], "nothing was written outside the workspace"
    assert (root / "src" / "app.py").read_text() == "inside\n"


async def test_a_folder_swapped_for_a_symlink_cannot_carry_a_read_outside(
    client: Client, root: Path, tmp_path: Path, swap_after_resolve: list[tuple[Path, Path]]
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keys.txt").write_text("SECRET-KEY\n")
    (root / "src").mkdir()
    (root / "src" / "keys.txt").write_text("harmless\n")
    swap_after_resolve.append((root / "src", outside))
    result = await client.call_tool("read_file", {"path": "src/keys.txt"})
    assert result.is_error and "changed while in use" in text(result), text(result)
    assert "SECRET" not in text(result)


async def test_a_folder_swapped_for_a_symlink_cannot_be_listed(
    client: Client, root: Path, tmp_path: Path, swap_after_resolve: list[tuple[Path, Path]]
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "id_rsa").write_text("SECRET-KEY\n")
    (root / "src").mkdir()
    swap_after_resolve.append((root / "src", outside))
    result = await client.call_tool("ls", {"path": "src"})
    assert result.is_error and "changed while in use" in text(result), text(result)
    assert "id_rsa" not in text(result)


async def test_a_file_swapped_for_a_symlink_is_not_followed(
    client: Client, root: Path, tmp_path: Path, swap_after_resolve: list[tuple[Path, Path]]
) -> None:
    target = tmp_path / "outside.txt"
    target.write_text("theirs\n")
    (root / "a.txt").write_text("mine\n")
    for tool, args in [
        ("read_file", {"path": "a.txt"}),
        ("write_file", {"path": "a.txt", "content": "pwned\n"}),
        ("edit_file", {"path": "a.txt", "old_text": "mine", "new_text": "pwned"}),
    ]:
        swap_after_resolve.append((root / "a.txt", target))
        result = await client.call_tool(tool, args)
        assert result.is_error and "changed while in use" in text(result), (tool, text(result))
        (root / "a.txt").unlink()
        (root / "a.txt.moved").rename(root / "a.txt")
    assert target.read_text() == "theirs\n"
    assert (root / "a.txt").read_text() == "mine\n"
    assert leftovers(root) == []


async def test_symlinks_inside_the_workspace_still_work(client: Client, root: Path) -> None:
    (root / "real").mkdir()
    (root / "alias").symlink_to("real")
    result = await client.call_tool("write_file", {"path": "alias/x.txt", "content": "ok"})
    assert not result.is_error, text(result)
    assert (root / "real" / "x.txt").read_text() == "ok"


async def test_a_fifo_is_refused_without_hanging(client: Client, root: Path) -> None:
    os.mkfifo(root / "pipe")
    result = await client.call_tool("read_file", {"path": "pipe"})
    assert result.is_error and "not a regular file" in text(result), text(result)


# --- what a replaced file keeps -----------------------------------------------------


async def test_overwrite_keeps_mode_and_owner(client: Client, root: Path, temp_kind: str) -> None:
    path = root / "run.sh"
    path.write_text("#!/bin/sh\necho old\n")
    path.chmod(0o750)
    if os.geteuid() == 0:
        os.chown(path, 1234, 2345)
    before = path.stat()
    result = await client.call_tool("edit_file", {"path": "run.sh", "old_text": "old", "new_text": "new"})
    assert not result.is_error, text(result)
    after = path.stat()
    assert after.st_ino != before.st_ino, "the file was replaced by a rename"
    assert (after.st_mode, after.st_uid, after.st_gid) == (before.st_mode, before.st_uid, before.st_gid)
    assert path.read_text() == "#!/bin/sh\necho new\n"
    assert leftovers(root) == []


async def test_a_hard_linked_file_is_split_from_its_other_names(
    client: Client, root: Path, tmp_path: Path
) -> None:
    """A link into the workspace (a package store, `cp -al`) must not carry the write out."""
    (tmp_path / "store.txt").write_text("shared\n")
    os.link(tmp_path / "store.txt", root / "a.txt")
    result = await client.call_tool("write_file", {"path": "a.txt", "content": "new\n"})
    assert not result.is_error, text(result)
    assert (root / "a.txt").read_text() == "new\n"
    assert (tmp_path / "store.txt").read_text() == "shared\n"


def cannot_chown(fd: int, uid: int, gid: int) -> None:
    raise PermissionError(1, "Operation not permitted")


async def test_when_the_owner_cannot_be_kept_the_file_is_written_in_place(
    client: Client, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = root / "theirs.txt"
    path.write_text("old\n")
    if os.geteuid() != 0:
        pytest.skip("giving a file to another owner needs root")
    os.chown(path, 1234, 2345)
    inode = path.stat().st_ino
    monkeypatch.setattr(localfs.os, "fchown", cannot_chown)  # as for a user who is not root
    result = await client.call_tool("write_file", {"path": "theirs.txt", "content": "new\n"})
    assert not result.is_error, text(result)
    assert path.read_text() == "new\n"
    assert (path.stat().st_ino, path.stat().st_uid) == (inode, 1234) and leftovers(root) == []


# --- a full disk ---------------------------------------------------------------------


async def test_a_full_disk_leaves_the_file_unchanged_and_says_so(small_disk: Path) -> None:
    body = "HEAD\n" + "filler line\n" * 25_000  # 300 KB: a second copy does not fit
    (small_disk / "app.py").write_text(body)
    original = (small_disk / "app.py").read_bytes()
    async with Client(build_server(small_disk)) as c:
        for tool, args in [
            ("edit_file", {"path": "app.py", "old_text": "HEAD", "new_text": "HEAD 2"}),
            ("write_file", {"path": "app.py", "content": "x" * 400_000}),
        ]:
            result = await c.call_tool(tool, args)
            assert result.is_error, tool
            assert text(result).endswith(": disk full: app.py was left unchanged"), text(result)
            assert (small_disk / "app.py").read_bytes() == original
            assert leftovers(small_disk) == []
        # written in place (the owner cannot be kept), the space is reserved first: intact
        os.chown(small_disk / "app.py", 1234, 2345)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(localfs.os, "fchown", cannot_chown)
            result = await c.call_tool("write_file", {"path": "app.py", "content": "y" * 600_000})
        assert text(result).endswith(": disk full: app.py was left unchanged"), text(result)
        assert (small_disk / "app.py").read_bytes() == original
        # a write that fits still works (the new copy needs room beside the old one)
        result = await c.call_tool("write_file", {"path": "app.py", "content": "small\n"})
        assert not result.is_error, text(result)
        assert (small_disk / "app.py").read_text() == "small\n"


# --- a kill in the middle of a write -------------------------------------------------

WRITER = """
import sys
import tempfile
from pathlib import Path
import anyio
from mcp_servers.filesystem import LocalBackend

root, size = Path(sys.argv[1]), int(sys.argv[2])

async def main() -> None:
    backend = LocalBackend(root)
    i = 0
    while True:
        await backend.write_text(root / "big.txt", "ab"[i % 2] * size)
        print(i, flush=True)
        i += 1

anyio.run(main)
"""


@pytest.mark.slow
def test_sigkill_mid_write_leaves_the_old_or_the_new_file(root: Path) -> None:
    size = 50 * 1024 * 1024
    big = root / "big.txt"
    big.write_bytes(b"a" * size)
    for delay in (0.0, 0.05, 0.1, 0.2, 0.3, 0.45):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root), str(size)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "0", "the writer did not start"
        time.sleep(delay)  # it is busy writing the next version from here on
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        data = big.read_bytes()
        assert len(data) == size, f"torn: {len(data)} bytes after a kill at +{delay}s"
        assert data.count(data[:1]) == size, f"mixed content after a kill at +{delay}s"
        if unnamed_temps(root):  # nothing left behind (but for a microsecond's window)
            assert leftovers(root) == []
        for stray in leftovers(root):  # a named temp file: a kill before the rename leaves it
            (root / stray).unlink()


async def test_write_errors_before_the_rename_remove_the_temp_file(
    root: Path, monkeypatch: pytest.MonkeyPatch, temp_kind: str
) -> None:
    (root / "f.txt").write_text("old\n")

    def broken_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(localfs.os, "fsync", broken_fsync)
    async with Client(build_server(root)) as c:
        result = await c.call_tool("write_file", {"path": "f.txt", "content": "new\n"})
    assert text(result).endswith(": cannot write f.txt (Input/output error); it was left unchanged")
    assert (root / "f.txt").read_text() == "old\n" and leftovers(root) == []
    backend = LocalBackend(root)
    with pytest.raises(localfs.WriteError):
        await backend.write_text(root / "g.txt", "x")
    assert not (root / "g.txt").exists() and leftovers(root) == []


# --- the advisory lock other crow processes honour -------------------------------------


async def test_the_file_lock_follows_a_file_replaced_while_waiting(root: Path) -> None:
    """B waits on the file A holds; A replaces it (a rename: a new inode) and lets go. B
    must then hold the lock on the new file, or a third process could edit beside it."""
    path = root / "f.txt"
    path.write_text("v1\n")
    b_holds = anyio.Event()
    release_b = anyio.Event()

    async def b() -> None:
        async with localfs.file_lock(root, path):
            b_holds.set()
            await release_b.wait()

    async with anyio.create_task_group() as tg:
        async with localfs.file_lock(root, path):
            tg.start_soon(b)
            await anyio.sleep(0.05)
            assert not b_holds.is_set(), "B waits while A holds the lock"
            localfs.write_bytes(root, path, b"v2\n")
        with anyio.fail_after(5):
            await b_holds.wait()
        fd = os.open(path, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):  # as a third process would find it
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
            release_b.set()


async def test_the_file_lock_is_nothing_for_a_file_not_there_yet(root: Path) -> None:
    async with localfs.file_lock(root, root / "new.txt"):
        localfs.write_bytes(root, root / "new.txt", b"made\n")
    assert (root / "new.txt").read_text() == "made\n"


# --- a file its owner made read-only ---------------------------------------------------

WRITE_AS_OWNER = """
import sys
import tempfile
from pathlib import Path
from mcp_servers.filesystem import localfs
root = Path(sys.argv[1])
for name in sys.argv[2:]:
    try:
        localfs.write_bytes(root, root / name, b"replaced\\n")
        print(name, "written")
    except PermissionError:
        print(name, "refused")
"""


def _reachable_by_others(path: Path) -> bool:
    """Whether uid 65534 can reach `path` (every folder above it searchable by others)."""
    return all(os.stat(p).st_mode & 0o001 for p in [path, *path.parents])


def test_a_read_only_file_is_not_replaced() -> None:
    # The atomic rename needs only the folder writable; a file whose owner removed its write
    # permission must still be refused, as a plain write would be. As root (which may write
    # anything) the write runs as the unprivileged owner of the folder.
    folder = Path(tempfile.mkdtemp(prefix="crow-ro-", dir="/var/tmp"))
    try:
        (folder / "locked.txt").write_text("keep\n")
        (folder / "open.txt").write_text("old\n")
        os.chmod(folder / "locked.txt", 0o444)
        argv = [sys.executable, "-c", WRITE_AS_OWNER, str(folder), "locked.txt", "open.txt"]
        if os.geteuid() == 0:
            if not _reachable_by_others(ROOT) or not _reachable_by_others(Path(sys.executable).parent):
                pytest.skip("this checkout (or its venv) is not readable by an unprivileged user")
            for path in (folder, *folder.iterdir()):
                os.chown(path, 65534, 65534)
            os.chmod(folder, 0o755)
            argv = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=30)
        assert done.stdout.split("\n")[:2] == ["locked.txt refused", "open.txt written"], done.stderr
        assert (folder / "locked.txt").read_text() == "keep\n"
        assert (folder / "open.txt").read_text() == "replaced\n"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --- a file that is a mount point ---------------------------------------------------------


@pytest.fixture
def bind_mounted(root: Path, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A workspace file with another file bind-mounted over it, as a dev container or
    `docker run -v ./app.yml:/work/app.yml` gives: it cannot be renamed over (EBUSY)."""
    if os.geteuid() != 0:
        pytest.skip("a bind mount needs root")
    source = tmp_path / "mounted.txt"
    source.write_text("old\n")
    target = root / "app.yml"
    target.write_text("under the mount\n")
    done = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"bind mounts are not permitted here: {done.stderr.strip()}")
    try:
        yield target, source
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


async def test_a_bind_mounted_file_is_written_in_place(
    client: Client, root: Path, bind_mounted: tuple[Path, Path]
) -> None:
    target, source = bind_mounted
    result = await client.call_tool("write_file", {"path": "app.yml", "content": "new\n"})
    assert not result.is_error, text(result)
    assert "(overwrote)" in text(result)
    result = await client.call_tool("edit_file", {"path": "app.yml", "old_text": "new", "new_text": "edited"})
    assert not result.is_error, text(result)
    assert target.read_text() == source.read_text() == "edited\n"
    assert leftovers(root) == []


async def test_overwrite_keeps_extended_attributes(client: Client, root: Path, temp_kind: str) -> None:
    # POSIX ACLs are extended attributes too: a replacement file without them would silently
    # take away a colleague's access (or a label a tool put there).
    path = root / "shared.txt"
    path.write_text("old\n")
    try:
        os.setxattr(path, "user.crow-test", b"keep me")
    except OSError as exc:
        pytest.skip(f"this filesystem has no user extended attributes: {exc}")
    result = await client.call_tool("edit_file", {"path": "shared.txt", "old_text": "old", "new_text": "new"})
    assert not result.is_error, text(result)
    assert path.read_text() == "new\n"
    assert os.getxattr(path, "user.crow-test") == b"keep me"
    assert leftovers(root) == []


def test_write_bytes_with_a_mode_and_remove_file_never_follow_a_symlink(root: Path, tmp_path: Path) -> None:
    """What putting back a checkpoint uses: a write that sets the mode (new file or not) and
    a removal that refuses a symlink, in the path or as the file, never touching the outside."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("keep\n")
    localfs.write_bytes(root, root / "new.sh", b"#!/bin/sh\n", 0o750)
    assert (root / "new.sh").stat().st_mode & 0o777 == 0o750
    (root / "old.txt").write_text("x")
    (root / "old.txt").chmod(0o644)
    localfs.write_bytes(root, root / "old.txt", b"y", 0o600)
    assert (root / "old.txt").stat().st_mode & 0o777 == 0o600 and (root / "old.txt").read_bytes() == b"y"
    (root / "link.txt").symlink_to(outside / "victim.txt")
    (root / "dir").symlink_to(outside)
    for path in (root / "link.txt", root / "dir" / "victim.txt"):
        with pytest.raises(localfs.PathChangedError):
            localfs.remove_file(root, path)
    assert (outside / "victim.txt").read_text() == "keep\n" and (root / "link.txt").is_symlink()
    assert localfs.remove_file(root, root / "old.txt") is True
    assert localfs.remove_file(root, root / "old.txt") is False  # gone already
    (root / "folder").mkdir()
    with pytest.raises(OSError, match="not a regular file"):
        localfs.remove_file(root, root / "folder")
