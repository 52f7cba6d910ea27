"""The `Files` seam: every one of the seven tools reaches its filesystem only through the
`Files` and the `Backend` given to build_server, which is what a container's filesystem
relies on. The one here is a dict in memory under a root that does not exist on this
machine: any tool that touched the local disk instead would fail or see nothing."""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from mcp import Client
from mcp.server.mcpserver.exceptions import ToolError

from mcp_servers.filesystem import DIFF_META_KEY, BinaryFileError, ExecResult, Workspace, build_server
from mcp_servers.filesystem.files import Files, Place
from mcp_servers.filesystem.localfiles import LocalFiles
from mcp_servers.filesystem.search import GrepQuery, GrepResult, compile_glob
from tests.support.images import png
from tests.test_mcp_filesystem import call, fail, text

pytestmark = pytest.mark.anyio

ROOT = PurePosixPath("/nowhere-on-this-machine/work")
EDITOR_ROOT = "/home/me/project"  # where the editor sees ROOT's files


class MemoryFiles:
    """A `Files` and a `Backend` over a dict of files, recording each call."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.roots = (ROOT,)
        self.data = {ROOT / name: content for name, content in files.items()}
        self.calls: list[tuple[str, str]] = []
        self.locked: set[PurePosixPath] = set()

    def _kind(self, path: PurePosixPath) -> str:
        if path in self.data:
            return "file"
        if path == ROOT or any(p != path and p.is_relative_to(path) for p in self.data):
            return "dir"
        return "missing"

    async def resolve(self, path: str) -> Place:
        self.calls.append(("resolve", path))
        resolved = PurePosixPath(posixpath.normpath(ROOT / path))
        if not resolved.is_relative_to(ROOT):
            raise ToolError(f"path {path!r} is outside the box")
        display = resolved.relative_to(ROOT).as_posix()
        return Place(resolved, ROOT, display, self._kind(resolved))  # type: ignore[arg-type]

    async def list_dir(self, place: Place) -> list[dict[str, Any]]:
        self.calls.append(("list_dir", place.display))
        if self._kind(place.path) != "dir":  # type: ignore[arg-type]
            raise FileNotFoundError(place.display)
        names = {p.relative_to(place.path).parts[0] for p in self.data if p.is_relative_to(place.path)}
        entries = []
        for name in sorted(names):
            child = place.path / name
            size = len(self.data[child]) if child in self.data else None  # type: ignore[index]
            entries.append({"name": name, "type": "file" if size is not None else "dir", "size": size})
        return entries

    async def read_bytes(self, place: Place, limit: int) -> tuple[bytes, int]:
        self.calls.append(("read_bytes", place.display))
        data = self.data[place.path]  # type: ignore[index]
        return data[:limit], len(data)

    def _under(self, start: Place) -> list[str]:
        return sorted(p.relative_to(start.path).as_posix() for p in self.data if p.is_relative_to(start.path))

    async def glob(self, start: Place, pattern: str, max_results: int) -> tuple[list[str], bool]:
        self.calls.append(("glob", start.display))
        rx, prefix = compile_glob(pattern), "" if start.display == "." else start.display + "/"
        found = [prefix + name for name in self._under(start) if rx.match(name)]
        return found[:max_results], len(found) > max_results

    async def grep(self, start: Place, query: GrepQuery) -> GrepResult:
        self.calls.append(("grep", start.display))
        result = GrepResult(query.mode)
        for path, data in sorted(self.data.items()):
            if path.is_relative_to(start.path):
                for n, line in enumerate(data.decode(errors="replace").splitlines(), 1):
                    if re.search(query.pattern, line):
                        result.matches.append(
                            {"file": path.relative_to(ROOT).as_posix(), "line": n, "text": line}
                        )
        return result.finish(query.cap)

    def lock(self, place: Place) -> Any:
        @asynccontextmanager
        async def held() -> AsyncIterator[None]:
            self.calls.append(("lock", place.display))
            self.locked.add(place.path)  # type: ignore[arg-type]
            try:
                yield
            finally:
                self.locked.discard(place.path)  # type: ignore[arg-type]

        return held()

    def editor_path(self, place: Place) -> str:
        return f"{EDITOR_ROOT}/{place.display}"

    # --- the Backend half
    async def read_text(self, path: PurePosixPath) -> str:
        self.calls.append(("read_text", str(path)))
        if path not in self.data:
            raise FileNotFoundError(str(path))
        try:
            return self.data[path].decode("utf-8")
        except UnicodeDecodeError:
            raise BinaryFileError(str(path)) from None

    async def write_text(self, path: PurePosixPath, text: str) -> None:
        self.calls.append(("write_text", str(path)))
        assert path in self.locked, "a write happens under the file's lock"
        self.data[path] = text.encode("utf-8")

    async def run(self, command: str, cwd: PurePosixPath, timeout: float) -> ExecResult:
        self.calls.append(("run", f"{command} in {cwd}"))
        return ExecResult(f"ran {command!r}\n", 0)


@pytest.fixture
def box() -> MemoryFiles:
    return MemoryFiles(
        {"notes.txt": b"one\nneedle two\n", "src/app.py": b"print('needle')\n", "shot.png": png(),
         "shot.dat": png()}
    )  # fmt: skip


@pytest.fixture
async def client(box: MemoryFiles) -> AsyncIterator[Client]:
    assert isinstance(box, Files)
    async with Client(build_server(None, files=box, backend=box)) as c:
        yield c


def ops(box: MemoryFiles) -> list[str]:
    return [op for op, _ in box.calls]


async def test_ls_lists_through_the_files(client: Client, box: MemoryFiles) -> None:
    result = await call(client, "ls")
    assert text(result) == "[.: 4 entries]\nnotes.txt  15\nshot.dat  67\nshot.png  67\nsrc/".replace(
        "67", str(len(png()))
    )
    assert ops(box) == ["resolve", "list_dir"]
    assert "is a file, not a directory" in await fail(client, "ls", path="notes.txt")  # the place's kind


async def test_read_file_reads_text_and_images_through_the_seam(client: Client, box: MemoryFiles) -> None:
    assert "needle two" in text(await call(client, "read_file", path="notes.txt"))
    assert box.calls == [("resolve", "notes.txt"), ("read_text", f"{ROOT}/notes.txt")]
    box.calls.clear()
    result = await call(client, "read_file", path="shot.png")
    assert result.content[1].data  # type: ignore[union-attr]
    assert ops(box) == ["resolve", "read_bytes"]
    box.calls.clear()
    result = await call(client, "read_file", path="shot.dat")  # an image under another name
    assert text(result).startswith("[shot.dat: image/png image")
    assert ops(box) == ["resolve", "read_text", "read_bytes", "read_bytes"]
    assert "missing.txt does not exist" in await fail(client, "read_file", path="missing.txt")
    assert "outside the box" in await fail(client, "read_file", path="../etc/passwd")


async def test_writes_and_edits_go_through_the_lock_and_the_backend(client: Client, box: MemoryFiles) -> None:
    result = await call(client, "write_file", path="new/file.txt", content="fresh\n")
    assert text(result) == "Wrote 6 bytes to new/file.txt (created)."
    assert result.meta[DIFF_META_KEY] == {  # type: ignore[index]
        "path": f"{EDITOR_ROOT}/new/file.txt",
        "old_text": None,
        "new_text": "fresh\n",
    }
    assert ops(box) == ["resolve", "lock", "read_text", "write_text"]
    assert box.data[ROOT / "new/file.txt"] == b"fresh\n"
    box.calls.clear()
    result = await call(client, "edit_file", path="notes.txt", old_text="one", new_text="ONE")
    assert text(result).startswith("Edited notes.txt: 1 replacement.")
    assert result.meta[DIFF_META_KEY]["path"] == f"{EDITOR_ROOT}/notes.txt"  # type: ignore[index]
    assert ops(box) == ["resolve", "lock", "read_text", "write_text"]
    assert box.data[ROOT / "notes.txt"] == b"ONE\nneedle two\n"
    assert "src is a directory; give a file path" in await fail(client, "write_file", path="src", content="x")


async def test_glob_and_grep_search_through_the_files(client: Client, box: MemoryFiles) -> None:
    result = await call(client, "glob", pattern="**/*.py")
    assert result.structured_content == {"files": ["src/app.py"], "truncated": False}
    assert ops(box) == ["resolve", "glob"]
    box.calls.clear()
    result = await call(client, "grep", pattern="needle")
    assert text(result) == "notes.txt:2:needle two\nsrc/app.py:1:print('needle')"
    assert ops(box) == ["resolve", "grep"]
    assert "notes.txt is not a directory" in await fail(client, "glob", pattern="*", path="notes.txt")
    assert "gone does not exist" in await fail(client, "grep", pattern="x", path="gone")


async def test_execute_runs_through_the_backend_in_the_main_root(client: Client, box: MemoryFiles) -> None:
    result = await call(client, "execute", command="ls -la")
    assert text(result) == "ran 'ls -la'\n[exit code 0]"
    assert box.calls == [("run", f"ls -la in {ROOT}")]


async def test_the_instructions_name_the_files_roots(box: MemoryFiles) -> None:
    server = build_server(None, files=box, backend=box)
    assert server.instructions == f"File tools for the workspace {ROOT}. Paths are relative to it."


def test_build_server_refuses_a_files_without_its_backend_or_with_local_options(
    box: MemoryFiles, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="need their backend"):
        build_server(None, files=box)  # its commands would run here
    with pytest.raises(ValueError, match="give them to your files"):
        build_server(None, files=box, backend=box, extra_roots=[tmp_path])
    with pytest.raises(ValueError, match="give the workspace root"):
        build_server(None)
    build_server(None, files=LocalFiles(Workspace(tmp_path)))  # LocalFiles: the local backend


async def test_local_files_report_what_is_at_a_path(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "d")
    files = LocalFiles(Workspace(tmp_path))
    assert isinstance(files, Files)
    kinds = {
        name: (await files.resolve(name)).kind for name in ("f", "d", "fifo", "link", "none", "f/x", ".")
    }
    assert kinds == {
        "f": "file", "d": "dir", "fifo": "other", "link": "dir", "none": "missing", "f/x": "missing", ".": "dir"
    }  # fmt: skip
    place = await files.resolve("link")
    assert (place.path, place.root, place.display) == (tmp_path / "d", tmp_path, "d")
    assert files.editor_path(place) == str(tmp_path / "d")
