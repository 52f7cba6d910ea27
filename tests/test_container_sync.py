"""The workspace in copy mode (container/sync.py, synchost.py): this machine's side first
(walking, packing, the caps, applying hostile names safely), then the whole round trip
against the real Podman engine, a hostile container included."""

from __future__ import annotations

import io
import os
import socket
import tarfile
from pathlib import Path

import pytest

from mcp_servers.filesystem import localfs
from mcp_servers.filesystem.container import synchost
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


def test_a_workspace_over_100_000_files_is_refused(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    for d in range(101):
        sub = ws / f"d{d}"
        sub.mkdir(parents=True)
        for i in range(1000 if d < 100 else 1):
            (sub / str(i)).touch()
    with pytest.raises(WorkspaceTooLarge, match="more than 100,000 files"):
        synchost.walk(ws, frozenset())
    (ws / "d100" / "0").unlink()
    assert len(synchost.walk(ws, frozenset()).files) == 100_000  # the cap itself is allowed


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
