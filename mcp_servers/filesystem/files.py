"""The seam between the seven tools and the filesystem they see: `Files`.

`FileTools` (server.py) does its argument checks and formats every result; where paths
resolve, what a folder holds, what glob and grep find, and how one file is kept to one
writer at a time come from a `Files`. `LocalFiles` is this machine's disk (paths.Workspace,
localfs, search); `ContainerFiles` (container/) is a container's filesystem, reached through
a helper process running inside it. Reading and writing text and running commands stay on
the `Backend` protocol (backend.py), which a `Files` for a container implements too.

Paths inside a `Place` are in the namespace of the filesystem they belong to: this
machine's for `LocalFiles`, the container's for `ContainerFiles`.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Literal, Protocol, runtime_checkable

from mcp_servers.filesystem.search import GrepQuery, GrepResult

Kind = Literal["file", "dir", "other", "missing"]


@dataclass(frozen=True, slots=True)
class Place:
    """A path resolved and confined to the workspace: `path` absolute and symlink-free,
    `root` the (deepest) root holding it, `display` what the model is shown (POSIX, relative
    to the main root, `.` for it, or absolute in another root), `kind` what is there now."""

    path: PurePath
    root: PurePath
    display: str
    kind: Kind


@runtime_checkable
class Files(Protocol):
    roots: tuple[PurePath, ...]  # the main root first

    async def resolve(self, path: str) -> Place:
        """`path` (relative to the main root, or absolute inside a root) resolved; a
        `ToolError` saying why when it is outside every root, hidden, or unusable."""
        ...

    async def list_dir(self, place: Place) -> list[dict[str, Any]]:
        """`[{"name", "type": "file"|"dir"|"symlink"|"other", "size"}]` sorted by name
        (`size` only for files). OSError subclasses as the `Backend` raises them."""
        ...

    async def read_bytes(self, place: Place, limit: int) -> tuple[bytes, int]:
        """The first `limit` bytes of the file and its whole size (images)."""
        ...

    async def glob(self, start: Place, pattern: str, max_results: int) -> tuple[list[str], bool]:
        """Files under `start` matching `pattern`, in display form, sorted; whether more
        than `max_results` matched (gitignored files and .git skipped)."""
        ...

    async def grep(self, start: Place, query: GrepQuery) -> GrepResult:
        """Matches under `start` (a folder or one file), file names in display form."""
        ...

    def lock(self, place: Place) -> AbstractAsyncContextManager[None]:
        """Held while a write or edit reads and writes `place`: one writer per file."""
        ...

    def editor_path(self, place: Place) -> str:
        """Where the editor finds this file (`crow/diff` meta): the path on this machine."""
        ...
