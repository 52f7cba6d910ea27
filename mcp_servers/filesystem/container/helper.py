"""The program that runs inside the container: `python3 -c SOURCE` (protocol.helper_source()).

It serves the file tools and `execute` over its stdin/stdout (protocol.py): frames of
`u32 BE length + payload`; requests are `marshal` dicts `{"id", "op", ...}` (the host is
trusted), answers are JSON written by the small encoder below (the host never unmarshals
what comes out of the container: a command the model runs there could forge it). Each
request runs in its own thread, so many are in flight and a `cancel` reaches a running
command at once. The first frame is a handshake: `{"ready": true, "python", "shell"}`. At
the end of stdin every running command's group is killed and the helper exits.

Answers: `{"id", "ok": result}` (plus raw bytes after the JSON for read and read_bytes)
or `{"id", "error": {"kind", ...}}`: kind "os" (errno, message), "changed" (a symlink
appeared: localfs.PathChangedError), "write" (localfs.WriteError: the file is intact),
"binary", "tool" (a message for the model), "path" (resolve refused it: why, size), "bug".

Stdlib only, Python >= 3.8, and only modules Debian's python3-minimal has (no json,
tempfile, shutil, dataclasses, secrets). The code it shares with the local disk (localfs's
symlink-safe opens and atomic writes, the file listing, the gitignore-aware walk, glob,
Python grep, execute's output cap and group checks) is not copied here:
protocol.helper_source() appends those functions' own source text, so the container runs
exactly what the local disk runs.
`pathspec` does not exist in there: `GitIgnoreSpec` below stands in for it (a small
gitignore matcher: nested files, negation, dir-only and anchored patterns, `**`).
Commands (run, cancel) are in helper_exec.py, sent with this file.
"""

from __future__ import annotations

import errno
import marshal
import os
import re
import stat
import struct
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # in the container these come from the tail helper_source() appends
    from mcp_servers.filesystem.container.helper_exec import SEARCHES, SHELL, end_commands
    from mcp_servers.filesystem.localfiles import _kind, _list_dir
    from mcp_servers.filesystem.localfs import (
        MAX_READ_BYTES,
        BinaryFileError,
        PathChangedError,
        WriteError,
        _open_for_read,
        _read_fd,
        _read_upto,
        _real_root,
        write_bytes,
    )  # fmt: skip
    from mcp_servers.filesystem.search import _grep_python, _translate, glob_files

SCAN_CAP = 200_000  # entries a scan lists before it says truncated
RESULT_BUDGET = 32 << 20  # bytes of names a glob, grep or ls answer holds (the host caps frames at 64 MB)
SCAN_BUDGET = 48 << 20

_out_lock = threading.Lock()
_OUT = -1  # the protocol's stdout (fd 1 itself is pointed at stderr)


class ToolError(Exception):
    """A message for the model (the host raises it as mcp's ToolError)."""


class _Refused(Exception):
    """resolve() refused the path: the host words the message (paths.Workspace's)."""

    def __init__(self, why: str, size: int = 0) -> None:
        self.why, self.size = why, size


# ---------------------------------------------------------------- JSON out
_ESCAPE = re.compile('[\\x00-\\x1f"\\\\\ud800-\udfff]')


def _escape(m: re.Match) -> str:
    c = m.group()
    return '\\"' if c == '"' else "\\\\" if c == "\\" else f"\\u{ord(c):04x}"


def _quote(s: str) -> str:
    # Surrogates (undecodable file names) travel as \udcXX: the host's os.fsencode restores the bytes.
    return '"' + _ESCAPE.sub(_escape, s) + '"'


def _json(obj: Any) -> str:
    if obj is None or obj is True or obj is False:
        return {None: "null", True: "true", False: "false"}[obj]
    if isinstance(obj, int):
        return str(int(obj))
    if isinstance(obj, float):
        return repr(obj) if obj == obj and obj not in (float("inf"), float("-inf")) else "null"
    if isinstance(obj, str):
        return _quote(obj)
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join(_json(x) for x in obj) + "]"
    if isinstance(obj, dict):
        return "{" + ",".join(_quote(str(k)) + ":" + _json(v) for k, v in obj.items()) + "}"
    return _quote(str(obj))


def _send(obj: dict, blob: bytes = b"") -> None:
    body = _json(obj).encode("utf-8")
    frame = struct.pack(">II", 4 + len(body) + len(blob), len(body)) + body + blob
    with _out_lock:
        view = memoryview(frame)
        while view:
            view = view[os.write(_OUT, view) :]


def _cost(item: Any) -> int:
    return len(_json(item).encode("utf-8")) + 1


def _fit(items: list, budget: int = RESULT_BUDGET) -> tuple[list, bool]:
    """The leading items whose JSON fits in `budget` bytes, and whether some were left off."""
    used = 0
    for i, item in enumerate(items):
        used += _cost(item)
        if used > budget:
            return items[:i], True
    return items, False


# ---------------------------------------------------------------- gitignore
class _Check:
    def __init__(self, include: bool | None) -> None:
        self.include = include


class GitIgnoreSpec:
    """The part of `pathspec.GitIgnoreSpec` search.py uses: `from_lines`, `check_file`
    (`.include`: True ignored, False re-included by `!`, None no rule), `match_file`.
    Paths are relative to the .gitignore's folder, folders given with a trailing "/"."""

    def __init__(self, rules: list) -> None:
        self.rules = rules

    @classmethod
    def from_lines(cls, lines: Any) -> GitIgnoreSpec:
        rules = []
        for line in lines:
            line = line.rstrip("\r\n")
            while line.endswith(" ") and not line.endswith("\\ "):
                line = line[:-1]
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            if negate or line.startswith(("\\!", "\\#")):
                line = line[1:]
            dir_only = line.endswith("/")
            line = line.rstrip("/")
            if not line:
                continue
            # A "/" before the end anchors the pattern to this folder; else it matches a
            # name at any depth. A match on a folder covers everything below it.
            lead = "" if "/" in line else "(?:.*/)?"
            body = _translate(line.lstrip("/").replace("\\ ", " "))
            tail = "/.*" if dir_only else "(?:/.*)?"
            try:
                rules.append((re.compile(lead + body + tail + "\\Z", re.DOTALL), not negate))
            except re.error:
                continue  # git ignores a pattern it cannot use
        return cls(rules)

    def check_file(self, path: str) -> _Check:
        for rx, include in reversed(self.rules):  # the last matching rule wins
            if rx.match(path):
                return _Check(include)
        return _Check(None)

    def match_file(self, path: str) -> bool:
        return bool(self.check_file(path).include)


class _PathspecModule:
    GitIgnoreSpec = GitIgnoreSpec


class GrepResult:
    """What search._grep_python fills; past RESULT_BUDGET bytes it reports itself full."""

    def __init__(self, mode: str) -> None:
        self.mode, self.matches, self.files, self.counts = mode, [], [], []
        self.over_budget, self._seen, self._used = False, [0, 0, 0], 0

    def size(self) -> int:
        for i, items in enumerate((self.matches, self.files, self.counts)):
            for item in items[self._seen[i] :]:
                self._used += _cost(item)
            self._seen[i] = len(items)
        self.over_budget = self.over_budget or self._used > RESULT_BUDGET
        return sys.maxsize if self.over_budget else len(self.matches) + len(self.files) + len(self.counts)

    def finish(self, cap: int) -> GrepResult:
        return self  # the host sorts and cuts (GrepResult.finish)


# ---------------------------------------------------------------- paths
def _realpath(candidate: str) -> str:
    """paths.Workspace.resolve's walk: strict first (a loop refuses), then lenient. Python
    3.8 and 3.9 have no `strict`: there a lenient walk whose end must exist stands in."""
    try:
        if sys.version_info >= (3, 10):  # noqa: UP036 (the container's Python may be older than crow's)
            return os.path.realpath(candidate, strict=True)
        resolved = os.path.realpath(candidate)
        os.stat(resolved)
        return resolved
    except OSError as exc:  # a file to be created, a missing or non-folder part, a loop
        if exc.errno == errno.ELOOP:
            raise _Refused("loop") from None
        lenient = os.path.realpath(candidate)
        if os.path.realpath(lenient) != lenient:  # a loop further on ("missing/../loop/..")
            raise _Refused("loop") from None
        return lenient


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def op_resolve(req: dict) -> dict:
    """paths.Workspace.resolve's rules (the host checked the string itself): the deepest
    root holding the symlink-free path, as (root index, path relative to it, kind)."""
    roots = [os.path.realpath(r) for r in req["roots"]]
    path = req["path"]
    resolved = _realpath(path if path.startswith("/") else os.path.join(roots[0], path))
    holding = [i for i, root in enumerate(roots) if _inside(resolved, root)]
    if not holding:
        raise _Refused("outside")
    best = max(holding, key=lambda i: len(roots[i]))
    size = len(os.fsencode(resolved))
    if size >= 4096:  # paths.MAX_PATH_BYTES: the OS would refuse it
        raise _Refused("joined", size)
    rel = os.path.relpath(resolved, roots[best])
    return {"root": best, "rel": "" if rel == "." else rel, "kind": _kind(resolved)}


def _real(req: dict, key: str = "path") -> tuple[str, str]:
    """(the root's real path, the request's path under it): localfs walks from the real root."""
    root, path = req["root"], req[key]
    real = _real_root(root)
    return real, real + path[len(root.rstrip("/")) :] if _inside(path, root) else path


# ---------------------------------------------------------------- file ops
def op_read(req: dict) -> tuple[dict, bytes]:
    root, path = _real(req)
    fd, _ = _open_for_read(root, path)
    return {}, _read_fd(fd, req["path"]).encode("utf-8")


def op_read_bytes(req: dict) -> tuple[dict, bytes]:
    root, path = _real(req)
    fd, size = _open_for_read(root, path)
    return {"size": size}, _read_upto(fd, min(req["limit"], MAX_READ_BYTES + 1))


def op_write(req: dict) -> dict:
    write_bytes(*_real(req), req["data"])
    return {}


def op_list(req: dict) -> dict:
    entries, truncated = _fit(_list_dir(*_real(req)))
    return {"entries": entries, "truncated": truncated}


def op_glob(req: dict) -> dict:
    root, start = _real(req)
    files, truncated = glob_files(Path(root), Path(start), req["pattern"], req["cap"])
    files, over = _fit(files)
    return {"files": files, "truncated": truncated or over}


def op_grep(req: dict) -> dict:
    root, start = _real(req)
    query = (req["pattern"], req["glob"], req["ignore_case"], req["mode"], req["cap"], frozenset())
    stop, done = SEARCHES[req["id"]] = (threading.Event(), threading.Event())
    try:
        found = _grep_python(Path(root), Path(start), query, stop)  # a cancel sets stop
    finally:
        del SEARCHES[req["id"]]
        done.set()
    matches, files, counts = (_fit(x)[0] for x in (found.matches, found.files, found.counts))
    return {"matches": matches, "files": files, "counts": counts, "truncated": found.over_budget}


def op_scan(req: dict) -> dict:
    """Every entry under `root` (nothing skipped, no symlink followed), for the copy-mode
    sync: files {rel: [size, mtime_ns, mode]}, dirs [rel], symlinks {rel: target}."""
    files: dict = {}
    dirs: list = []
    links: dict = {}
    todo, count, used, truncated = [(req["root"], "")], 0, 0, False
    while todo and not truncated:
        folder, rel = todo.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError:
            continue
        for entry in entries:
            name = rel + entry.name
            count += 1
            used += len(name) + 40
            if count > SCAN_CAP or used > SCAN_BUDGET:
                truncated = True
                break
            try:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    links[name] = os.readlink(entry.path)
                    used += len(links[name])
                elif stat.S_ISDIR(st.st_mode):
                    dirs.append(name)
                    todo.append((entry.path, name + "/"))
                elif stat.S_ISREG(st.st_mode):
                    files[name] = [st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode)]
            except OSError:
                continue  # gone meanwhile
    return {"files": files, "dirs": dirs, "symlinks": links, "truncated": truncated}


# ---------------------------------------------------------------- serving
def _error(exc: BaseException) -> dict:
    if isinstance(exc, _Refused):
        return {"kind": "path", "why": exc.why, "size": exc.size}
    if isinstance(exc, ToolError):
        return {"kind": "tool", "message": str(exc)}
    if isinstance(exc, BinaryFileError):
        return {"kind": "binary"}
    if isinstance(exc, OSError):
        kind = "os"
        if isinstance(exc, (PathChangedError, WriteError)):
            kind = "changed" if isinstance(exc, PathChangedError) else "write"
        return {"kind": kind, "errno": exc.errno or 5, "message": exc.strerror or str(exc)}
    return {"kind": "bug", "message": f"{type(exc).__name__}: {exc}"}


def _handle(req: dict) -> None:
    try:
        result = globals()["op_" + req["op"]](req)  # op_run, op_resolve… (the host is trusted)
        blob = b""
        if isinstance(result, tuple):
            result, blob = result
        _send({"id": req["id"], "ok": result}, blob)
    except BaseException as exc:
        _send({"id": req["id"], "error": _error(exc)})


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def main() -> None:
    global _OUT
    sys.modules["pathspec"] = _PathspecModule  # type: ignore[assignment]  # search.py imports it
    # The protocol keeps private copies of stdin/stdout (not inherited by commands); fds 0
    # and 1 become /dev/null and stderr, so a stray print cannot corrupt a frame.
    proto_in, _OUT = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)
    version = ".".join(map(str, sys.version_info[:3]))
    _send({"ready": True, "python": version, "shell": SHELL})
    while True:
        head = _read_exactly(proto_in, 4)
        body = None if head is None else _read_exactly(proto_in, struct.unpack(">I", head)[0])
        if body is None:
            break
        try:
            req = marshal.loads(body)
        except (ValueError, EOFError, TypeError):
            break  # not the host's writing: stop rather than guess
        try:
            threading.Thread(target=_handle, args=(req,), daemon=True).start()
        except RuntimeError as exc:  # out of threads (a fork bomb in the container): say so, go on
            _send({"id": req["id"], "error": {"kind": "os", "errno": errno.EAGAIN, "message": str(exc)}})
    end_commands()  # the host is gone: so are its commands
    os._exit(0)
