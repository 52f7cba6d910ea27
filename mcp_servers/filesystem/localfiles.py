"""`LocalFiles`: the `Files` seam (files.py) over this machine's disk.

Paths resolve and stay confined by `paths.Workspace`; folders are listed and files read
through `localfs` (symlink-safe opens from the root that holds them); glob and grep are
`search`'s, with the workspace's hidden paths skipped and names in another root shown
absolute. A write holds `path_lock`: a lock per file for this process plus an advisory
`flock` other crow processes honour.
"""

from __future__ import annotations

import os
import stat
import weakref
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from mcp_servers.filesystem import localfs, search
from mcp_servers.filesystem.files import Kind, Place
from mcp_servers.filesystem.paths import Workspace
from mcp_servers.filesystem.search import GrepQuery, GrepResult

# One lock per resolved path for every server in this process (a session each); a lock
# lives only while someone holds or awaits it.
_PATH_LOCKS: weakref.WeakValueDictionary[str, anyio.Lock] = weakref.WeakValueDictionary()


@asynccontextmanager
async def path_lock(root: Path, path: Path) -> AsyncIterator[None]:
    """Serialize read-modify-write of one file across calls and sessions, and (by an
    advisory lock on the file) across crow processes."""
    lock = _PATH_LOCKS.get(str(path))
    if lock is None:
        lock = _PATH_LOCKS[str(path)] = anyio.Lock()
    async with lock, localfs.file_lock(root, path):
        yield


def _kind(path: Path) -> Kind:
    # Follows a symlink, as the checks it replaces did (Path.exists, Path.is_dir). Any error
    # reads as "missing": the operation that follows meets it and says why.
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "missing"
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) else "other"


def _list_dir(root: Path, directory: Path) -> list[dict[str, Any]]:
    entries = []
    fd = localfs.open_dir(root, directory)  # a folder swapped for a symlink is refused
    try:
        with os.scandir(fd) as it:  # scandir works on its own copy of the fd
            for entry in it:
                if entry.is_symlink():
                    kind, size = "symlink", None
                elif entry.is_dir():
                    kind, size = "dir", None
                elif entry.is_file():
                    kind, size = "file", entry.stat().st_size
                else:
                    kind, size = "other", None
                entries.append({"name": entry.name, "type": kind, "size": size})
    finally:
        os.close(fd)
    return sorted(entries, key=lambda e: e["name"])


class LocalFiles:
    """The workspace `ws` on this machine's disk. The places it resolves hold `Path`s, which
    is what localfs and search take."""

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self.roots: tuple[Path, ...] = ws.roots

    def __repr__(self) -> str:
        return f"LocalFiles({self.ws!r})"

    async def resolve(self, path: str) -> Place:
        resolved = self.ws.resolve(path)
        return Place(resolved, self.ws.root_of(resolved), self.ws.relative(resolved), _kind(resolved))

    async def list_dir(self, place: Place) -> list[dict[str, Any]]:
        return await anyio.to_thread.run_sync(_list_dir, place.root, place.path, abandon_on_cancel=True)

    async def read_bytes(self, place: Place, limit: int) -> tuple[bytes, int]:
        return await localfs.read_bytes(place.root, place.path, limit)

    async def glob(self, start: Place, pattern: str, max_results: int) -> tuple[list[str], bool]:
        root = start.root
        files, truncated = await anyio.to_thread.run_sync(
            search.glob_files, root, start.path, pattern, max_results, self.ws.hidden_relative(root),
            abandon_on_cancel=True,
        )  # fmt: skip
        if prefix := self.ws.prefix(root):
            files = [prefix + f for f in files]
        return files, truncated

    async def grep(self, start: Place, query: GrepQuery) -> GrepResult:
        root = start.root
        result = await search.grep(
            root, start.path, query.pattern, glob=query.glob, ignore_case=query.ignore_case,
            mode=query.mode, cap=query.cap, hidden=self.ws.hidden_relative(root),
        )  # fmt: skip
        result.under(self.ws.prefix(root))
        return result

    def lock(self, place: Place) -> AbstractAsyncContextManager[None]:
        return path_lock(place.root, place.path)

    def editor_path(self, place: Place) -> str:
        return str(place.path)
