"""`ContainerFiles`: the `Files` and `Backend` protocols over a helper in a container.

Paths are the container's (`PurePosixPath`): the roots are the workdir first, then the
session's extra roots as mapped into the container, each paired with its path on this
machine when it has one (a bind mount), which is what `editor_path` shows the editor.
Confinement follows paths.Workspace's rules and words: the string checks here, the
symlink walk in the container (helper.op_resolve). Reads, writes and listings run
localfs's own code in there (helper.py sends it), so symlinks appearing mid-call, atomic
writes and kept modes behave as on the local disk. The container's own `hidden` folders
are none: a command in the container reads all of it anyway.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

import anyio
from mcp.server.mcpserver.exceptions import ToolError

from mcp_servers.filesystem.execute import ExecResult
from mcp_servers.filesystem.files import Place
from mcp_servers.filesystem.localfs import MAX_READ_BYTES
from mcp_servers.filesystem.paths import MAX_PATH_BYTES, _loop, check_path_text
from mcp_servers.filesystem.search import GrepQuery, GrepResult

from .protocol import HelperClient, _Refused

_KINDS = ("file", "dir", "other", "missing")
_ENTRY_TYPES = ("file", "dir", "symlink", "other")

# One lock per (container, path) in this process. A container belongs to one session and
# one crow process, so no other process writes through the file tools there: no flock.
_LOCKS: weakref.WeakValueDictionary[tuple[str, str], anyio.Lock] = weakref.WeakValueDictionary()


class ContainerFiles:
    """The file tools' view of a container through `client`; `env` is added to the
    image's environment for commands (never this process's own)."""

    def __init__(
        self,
        client: HelperClient,
        roots: Sequence[tuple[PurePosixPath, Path | None]],
        *,
        env: Mapping[str, str] | None = None,
        container: str = "",
    ) -> None:
        if not roots:
            raise ValueError("ContainerFiles needs at least one root (the workdir)")
        self.client = client
        self.roots: tuple[PurePath, ...] = tuple(PurePosixPath(r) for r, _ in roots)
        self._host = {PurePosixPath(r): h for r, h in roots}
        self.env = dict(env or {})
        self._container = container or f"helper-{id(client)}"

    # -------------------------------------------------------------- paths
    def _display(self, path: PurePath) -> str:
        main = self.roots[0]
        return (path.relative_to(main).as_posix() or ".") if path.is_relative_to(main) else path.as_posix()

    def _prefix(self, root: PurePath) -> str:
        return "" if root == self.roots[0] else self._display(root).rstrip("/") + "/"

    def _root_of(self, path: PurePath) -> PurePath:
        holding = [r for r in self.roots if path.is_relative_to(r)]
        if not holding:
            raise PermissionError(13, "not a file inside the workspace", str(path))
        return max(holding, key=lambda r: len(r.parts))

    async def resolve(self, path: str) -> Place:
        check_path_text(path)
        try:
            found, _ = await self.client.call("resolve", self._resolved, path=path, roots=self._root_texts())
        except _Refused as refused:
            raise self._refusal(path, refused) from None
        root = self.roots[found["root"]]
        place = root / found["rel"] if found["rel"] else root
        return Place(place, root, self._display(place), found["kind"])

    def _root_texts(self) -> list[str]:
        return [r.as_posix() for r in self.roots]

    def _resolved(self, result: Any, blob: bytes) -> bool:
        return (
            isinstance(result, dict)
            and type(result.get("root")) is int
            and 0 <= result["root"] < len(self.roots)
            and isinstance(result.get("rel"), str)
            and not result["rel"].startswith("/")
            and ".." not in result["rel"].split("/")
            and result.get("kind") in _KINDS
        )

    def _refusal(self, path: str, refused: _Refused) -> ToolError:
        # paths.Workspace.resolve's words, with the container's roots.
        if refused.why == "loop":
            return _loop(path)
        if refused.why == "joined":
            return ToolError(
                f"path is too long once joined to the workspace ({refused.size} bytes; the limit is "
                f"{MAX_PATH_BYTES - 1})"
            )
        extra = ", ".join(r.as_posix() for r in self.roots[1:])
        where = f"the workspace {self.roots[0]}" + (f" and its other roots {extra}" if extra else "")
        return ToolError(f"path {path!r} is outside {where}")

    def editor_path(self, place: Place) -> str:
        host = self._host.get(PurePosixPath(place.root))
        if host is None:
            return str(place.path)
        return str(host.joinpath(*PurePosixPath(place.path).relative_to(place.root).parts))

    @asynccontextmanager
    async def lock(self, place: Place) -> AsyncIterator[None]:
        key = (self._container, str(place.path))
        lock = _LOCKS.get(key)
        if lock is None:
            lock = _LOCKS[key] = anyio.Lock()
        async with lock:
            yield

    # -------------------------------------------------------------- Files
    def _where(self, path: PurePath) -> dict[str, str]:
        return {"root": self._root_of(path).as_posix(), "path": PurePosixPath(path).as_posix()}

    async def list_dir(self, place: Place) -> list[dict[str, Any]]:
        result, _ = await self.client.call("list", _listing, **self._where(place.path))
        return result["entries"]

    async def read_bytes(self, place: Place, limit: int) -> tuple[bytes, int]:
        limit = max(0, min(limit, MAX_READ_BYTES + 1))

        def shape(result: Any, blob: bytes) -> bool:
            return isinstance(result, dict) and _is_count(result.get("size")) and len(blob) <= limit

        result, blob = await self.client.call("read_bytes", shape, limit=limit, **self._where(place.path))
        return blob, result["size"]

    async def glob(self, start: Place, pattern: str, max_results: int) -> tuple[list[str], bool]:
        def shape(result: Any, blob: bytes) -> bool:
            return _has(result, files=_strs, truncated=_bool) and len(result["files"]) <= max_results

        result, _ = await self.client.call(
            "glob", shape, pattern=pattern, cap=max_results, **self._where(start.path)
        )
        prefix = self._prefix(start.root)
        return [prefix + f for f in result["files"]], result["truncated"]

    async def grep(self, start: Place, query: GrepQuery) -> GrepResult:
        result, _ = await self.client.call(
            "grep", _grep_answer, pattern=query.pattern, glob=query.glob, ignore_case=query.ignore_case,
            mode=query.mode, cap=query.cap, **self._where(start.path),
        )  # fmt: skip
        lists = (result["matches"], result["files"], result["counts"])
        found = GrepResult(query.mode, *lists, truncated=result["truncated"])
        found.finish(query.cap).under(self._prefix(start.root))
        return found

    async def scan(self, root: PurePosixPath) -> dict[str, Any]:
        """Every entry under `root` in the container (sync.py's copy mode): `{"files":
        {rel: [size, mtime_ns, mode]}, "dirs": [rel], "symlinks": {rel: target}, "truncated"}`."""
        result, _ = await self.client.call("scan", _scan_answer, root=root.as_posix())
        return result

    # -------------------------------------------------------------- Backend
    async def read_text(self, path: PurePath) -> str:
        _, blob = await self.client.call("read", _any_dict, **self._where(path))
        try:
            return blob.decode("utf-8")
        except UnicodeDecodeError:
            raise await self.client.refuse("the helper's answer to read is not UTF-8") from None

    async def write_text(self, path: PurePath, text: str) -> None:
        await self.client.call("write", _any_dict, data=text.encode("utf-8"), **self._where(path))

    async def run(self, command: str, cwd: PurePath, timeout: float) -> ExecResult:
        result, _ = await self.client.call(
            "run", _run_answer, command=command, cwd=PurePosixPath(cwd).as_posix(), timeout=float(timeout),
            env=self.env,
        )  # fmt: skip
        return ExecResult(result["output"], result["exit_code"], result["timed_out"], result["truncated"])


# ------------------------------------------------------------------ answer shapes
def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _bool(value: Any) -> bool:
    return type(value) is bool


def _str(value: Any) -> bool:
    return isinstance(value, str)


def _strs(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _has(result: Any, **checks: Any) -> bool:
    return isinstance(result, dict) and all(check(result.get(key)) for key, check in checks.items())


def _items(**checks: Any) -> Any:
    return lambda value: isinstance(value, list) and all(_has(v, **checks) for v in value)


def _any_dict(result: Any, blob: bytes) -> bool:
    return isinstance(result, dict)


def _entry_size(value: Any) -> bool:
    return value is None or _is_count(value)


def _listing(result: Any, blob: bytes) -> bool:
    entries = _items(name=_str, type=lambda t: t in _ENTRY_TYPES, size=_entry_size)
    return _has(result, entries=entries, truncated=_bool)


def _grep_answer(result: Any, blob: bytes) -> bool:
    return _has(
        result,
        matches=_items(file=_str, line=_is_count, text=_str),
        files=_strs,
        counts=_items(file=_str, count=_is_count),
        truncated=_bool,
    )


def _run_answer(result: Any, blob: bytes) -> bool:
    exit_code = result.get("exit_code") if isinstance(result, dict) else None
    return _has(result, output=_str, timed_out=_bool, truncated=_bool) and (
        exit_code is None or type(exit_code) is int
    )


def _scan_answer(result: Any, blob: bytes) -> bool:
    def stats(v: Any) -> bool:
        return isinstance(v, list) and len(v) == 3 and all(_is_count(x) for x in v)

    return (
        _has(result, dirs=_strs, truncated=_bool)
        and isinstance(files := result.get("files"), dict)
        and all(stats(v) for v in files.values())
        and isinstance(links := result.get("symlinks"), dict)
        and all(isinstance(v, str) for v in links.values())
    )
