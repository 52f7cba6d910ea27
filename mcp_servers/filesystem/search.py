"""File search on the local disk: ``glob`` and ``grep``.

Both honour ``.gitignore`` files (the root's, those of the folders above the search
start, and nested ones) and always skip ``.git/``. Symlinks are listed by glob but
never followed, so a search cannot wander out of the workspace.

``grep`` runs ripgrep when it can find the binary (next to the interpreter, where
the ``ripgrep`` wheel puts it, else on PATH) and streams its output, stopping and
killing rg as soon as the cap is reached. Without rg it falls back to Python ``re``
over the same walk; the regex dialects differ only in rarely used corners.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import stat
import subprocess
import sysconfig
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import anyio
from mcp.server.mcpserver.exceptions import ToolError

if TYPE_CHECKING:  # imported where used: a session that never searches does not pay for it
    import pathspec

GrepMode = Literal["content", "files_with_matches", "count"]
MAX_LINE_CHARS = 500  # a matched line is cut here: minified files would flood the model
_FALLBACK_MAX_FILE = 20 * 1024 * 1024


def find_rg() -> str | None:
    """The ripgrep binary: the one installed with this interpreter first, then PATH."""
    candidate = Path(sysconfig.get_path("scripts")) / "rg"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which("rg")


# --- gitignore-aware walk --------------------------------------------------------


def _load_ignore(directory: Path) -> pathspec.GitIgnoreSpec | None:
    # A regular file only, as git reads it (it follows no .gitignore symlink): a FIFO there
    # would hang every search, a device never end one.
    lines = _read_text(str(directory / ".gitignore"))
    if lines is None:
        return None
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines(lines.splitlines())


def _ignored(specs: list[tuple[str, pathspec.GitIgnoreSpec]], rel: str, is_dir: bool) -> bool:
    """Deepest .gitignore with an opinion wins, as in git (a ``!`` rule re-includes)."""
    for base, spec in reversed(specs):
        sub = rel[len(base) + 1 :] if base else rel
        result = spec.check_file(sub + "/" if is_dir else sub)
        if result.include is not None:
            return bool(result.include)
    return False


def walk(
    root: Path, start: Path, stop: threading.Event | None = None, hidden: frozenset[str] = frozenset()
) -> Iterator[tuple[str, str, bool]]:
    """Yield ``(path relative to root, absolute path, is_symlink)`` for non-directories.

    Entries come in sorted depth-first order; ignored paths, ``.git`` and ``hidden``
    (root-relative paths, see paths.Workspace) are pruned.
    A ``start`` that is a file yields just that file.
    """
    if not start.is_dir():
        yield start.relative_to(root).as_posix(), str(start), start.is_symlink()
        return
    specs: list[tuple[str, pathspec.GitIgnoreSpec]] = []
    # .gitignore files above the start folder apply too.
    rel_start = start.relative_to(root).as_posix()
    parts = [] if rel_start == "." else rel_start.split("/")
    for i in range(len(parts)):
        spec = _load_ignore(root.joinpath(*parts[:i]))
        if spec is not None:
            specs.append(("/".join(parts[:i]), spec))
    yield from _walk_dir(start, "" if rel_start == "." else rel_start, specs, stop, hidden)


def _walk_dir(
    directory: Path,
    rel: str,
    specs: list[tuple[str, pathspec.GitIgnoreSpec]],
    stop: threading.Event | None,
    hidden: frozenset[str] = frozenset(),
) -> Iterator[tuple[str, str, bool]]:
    if stop is not None and stop.is_set():
        return
    spec = _load_ignore(directory)
    if spec is not None:
        specs = [*specs, (rel, spec)]
    try:
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        child = f"{rel}/{entry.name}" if rel else entry.name
        is_dir = entry.is_dir(follow_symlinks=False)
        if (is_dir and entry.name == ".git") or child in hidden:
            continue
        if _ignored(specs, child, is_dir):
            continue
        if is_dir:
            yield from _walk_dir(Path(entry.path), child, specs, stop, hidden)
        else:
            yield child, entry.path, entry.is_symlink()


# --- glob ----------------------------------------------------------------------


def _expand_braces(pattern: str) -> list[str]:
    """``*.{py,pyi}`` -> ``*.py``, ``*.pyi`` (first brace group, recursively)."""
    depth, start = 0, -1
    for i, ch in enumerate(pattern):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                body, options, level, last = pattern[start + 1 : i], [], 0, 0
                for j, c in enumerate(body):
                    level += (c == "{") - (c == "}")
                    if c == "," and level == 0:
                        options.append(body[last:j])
                        last = j + 1
                options.append(body[last:])
                if len(options) == 1:
                    continue
                head, tail = pattern[:start], pattern[i + 1 :]
                return [x for opt in options for x in _expand_braces(head + opt + tail)]
    return [pattern]


def _translate(pattern: str) -> str:
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if i < n and pattern[i] == "/":
                out.append("(?:.*/)?")
                i += 1
            else:
                out.append(".*")
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end].replace("\\", "\\\\")
            out.append("[^" + body[1:] + "]" if body.startswith("!") else "[" + body + "]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def compile_glob(pattern: str) -> re.Pattern[str]:
    """A regex for ``pattern`` matched against a POSIX path relative to the search folder."""
    pattern = pattern.strip()
    while pattern.startswith("./"):
        pattern = pattern[2:]
    if not pattern:
        raise ToolError("glob pattern is empty")
    if pattern.startswith("/"):
        raise ToolError("glob pattern must be relative; pass the folder to search as `path`")
    alternatives = "|".join(_translate(p) for p in _expand_braces(pattern))
    try:
        return re.compile(f"(?:{alternatives})\\Z", re.DOTALL)
    except re.error as exc:
        raise ToolError(f"invalid glob pattern {pattern!r}: {exc}") from None


def glob_files(
    root: Path, start: Path, pattern: str, cap: int, hidden: frozenset[str] = frozenset()
) -> tuple[list[str], bool]:
    """Paths (relative to root) of files under ``start`` matching ``pattern``, sorted."""
    rx = compile_glob(pattern)
    prefix = start.relative_to(root).as_posix()
    skip = 0 if prefix == "." else len(prefix) + 1
    found: list[str] = []
    for rel, _abs, _link in walk(root, start, hidden=hidden):
        if rx.match(rel[skip:]):
            found.append(rel)
            if len(found) > cap:
                break
    truncated = len(found) > cap
    return sorted(found[:cap]), truncated


# --- grep ----------------------------------------------------------------------


@dataclass(slots=True)
class GrepResult:
    mode: GrepMode
    matches: list[dict[str, Any]] = field(default_factory=list)  # {file, line, text}
    files: list[str] = field(default_factory=list)
    counts: list[dict[str, Any]] = field(default_factory=list)  # {file, count}
    truncated: bool = False

    def size(self) -> int:
        return len(self.matches) + len(self.files) + len(self.counts)

    def under(self, prefix: str) -> None:
        """Put ``prefix`` before every file name (a search in another root: absolute names)."""
        if prefix:
            for item in (*self.matches, *self.counts):
                item["file"] = prefix + item["file"]
            self.files = [prefix + f for f in self.files]

    def finish(self, cap: int) -> GrepResult:
        """Apply the cap and sort, so results read the same whatever order rg found them."""
        self.truncated = self.truncated or self.size() > cap
        self.matches = sorted(self.matches[:cap], key=lambda m: (m["file"], m["line"]))
        self.files = sorted(self.files[:cap])
        self.counts = sorted(self.counts[:cap], key=lambda c: c["file"])
        return self


def _cut(text: str) -> str:
    text = text.rstrip("\r\n")
    if len(text) > MAX_LINE_CHARS:
        return text[:MAX_LINE_CHARS] + f"… [line cut, {len(text)} chars]"
    return text


def _norm(path: str) -> str:
    return path[2:] if path.startswith("./") else path


class GrepQuery(NamedTuple):
    """What to look for; shared by the ripgrep and the pure-Python paths."""

    pattern: str
    glob: str | None
    ignore_case: bool
    mode: GrepMode
    cap: int
    hidden: frozenset[str] = frozenset()  # root-relative paths skipped (paths.Workspace)


async def grep(
    root: Path,
    start: Path,
    pattern: str,
    *,
    glob: str | None,
    ignore_case: bool,
    mode: GrepMode,
    cap: int,
    hidden: frozenset[str] = frozenset(),
) -> GrepResult:
    query = GrepQuery(pattern, glob, ignore_case, mode, cap, hidden)
    rg = find_rg()
    if rg is None:
        stop = threading.Event()
        try:
            return await anyio.to_thread.run_sync(
                _grep_python, root, start, query, stop, abandon_on_cancel=True
            )
        finally:
            stop.set()  # an abandoned worker thread notices and stops walking
    return await _grep_rg(rg, root, start, query)


async def _grep_rg(rg: str, root: Path, start: Path, query: GrepQuery) -> GrepResult:
    pattern, glob, ignore_case, mode, cap, hidden = query
    argv = [rg, "--no-config", "--no-messages", "--hidden", "--no-require-git", "--color=never"]
    if ignore_case:
        argv.append("--ignore-case")
    if glob:
        argv += ["--glob", glob]
    argv += ["--glob", "!.git"]  # last, so a user glob cannot re-include .git
    for rel in sorted(hidden):  # anchored at the root (rg's cwd), metacharacters escaped
        argv += ["--glob", "!/" + re.sub(r"([*?\[\]{}\\!])", r"\\\1", rel)]
    argv += {"content": ["--json"], "files_with_matches": ["-l", "--null"], "count": ["-c", "--null"]}[mode]
    argv += ["-e", pattern, "--", start.relative_to(root).as_posix()]
    result = GrepResult(mode)
    stderr = bytearray()
    process = await anyio.open_process(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=root
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_collect_stderr, process.stderr, stderr)
            await _parse_rg(process.stdout, result, cap)
            if result.size() > cap:
                process.kill()  # enough: do not wait for rg to finish the tree
            await process.wait()
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
            await process.aclose()
    if process.returncode == 2 and not result.size():
        message = stderr.decode("utf-8", errors="replace").strip()
        raise ToolError(f"grep failed: {message or 'ripgrep exited with status 2'}")
    return result.finish(cap)


async def _collect_stderr(stream: anyio.abc.ByteReceiveStream, sink: bytearray) -> None:
    async for chunk in stream:
        if len(sink) < 4096:
            sink += chunk


async def _parse_rg(stream: anyio.abc.ByteReceiveStream, result: GrepResult, cap: int) -> None:
    mode, rest = result.mode, b""
    sep = b"\0" if mode == "files_with_matches" else b"\n"
    async for chunk in stream:
        records = (rest + chunk).split(sep)
        rest = records.pop()
        for record in records:
            if mode == "content":
                # Only "match" messages matter; skip begin/end/summary without parsing them.
                if not record.startswith(b'{"type":"match"'):
                    continue
                data = json.loads(record)["data"]
                result.matches.append(
                    {
                        "file": _norm(_rg_text(data["path"])),
                        "line": data["line_number"],
                        "text": _cut(_rg_text(data["lines"])),
                    }
                )
            elif mode == "files_with_matches":
                result.files.append(_norm(os.fsdecode(record)))
            else:
                name, _, count = record.rpartition(b"\0")
                result.counts.append({"file": _norm(os.fsdecode(name)), "count": int(count)})
            if result.size() > cap:
                return


def _rg_text(obj: dict[str, str]) -> str:
    # rg sends {"text": ...} for UTF-8 and {"bytes": base64} for anything else.
    if "text" in obj:
        return obj["text"]
    return base64.b64decode(obj["bytes"]).decode("utf-8", errors="replace")


def _grep_python(root: Path, start: Path, query: GrepQuery, stop: threading.Event) -> GrepResult:
    pattern, glob, ignore_case, mode, cap, hidden = query
    flags = re.IGNORECASE if ignore_case else 0
    try:
        rx = re.compile(pattern, flags)
        # A whole-file pre-check skips most files fast; MULTILINE keeps ^ and $ per line.
        anywhere = re.compile(pattern, flags | re.MULTILINE)
    except re.error as exc:
        raise ToolError(f"invalid regex {pattern!r}: {exc}") from None
    only = None
    if glob:
        import pathspec

        # The same gitignore-style rule rg uses: a glob without "/" matches a name anywhere.
        only = pathspec.GitIgnoreSpec.from_lines(_expand_braces(glob))
    result = GrepResult(mode)
    for rel, path, is_link in walk(root, start, stop, hidden):
        if stop.is_set() or result.size() > cap:
            break
        if is_link or (only is not None and not only.match_file(rel)):
            continue
        text = _read_text(path)
        if text is None or not anywhere.search(text):
            continue
        if mode == "files_with_matches":
            result.files.append(rel)
            continue
        count = 0
        for number, line in enumerate(text.split("\n"), 1):
            if rx.search(line):
                count += 1
                if mode == "content":
                    result.matches.append({"file": rel, "line": number, "text": _cut(line)})
                    if result.size() > cap:
                        break
        if mode == "count" and count:
            result.counts.append({"file": rel, "count": count})
    return result.finish(cap)


def _read_text(path: str) -> str | None:
    """File content for searching, or None for binary, huge, unreadable or not regular
    files (opening a FIFO would block the search, reading a device might never end)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _FALLBACK_MAX_FILE:
            return None
        with open(fd, "rb", closefd=False) as f:
            data = f.read(_FALLBACK_MAX_FILE + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")
