"""Prompt files: `.crow/commands/*.md`, `.claude/commands/*.md` (the project's, under the
session's cwd) and `$CROW_HOME/commands/*.md` (the user's) as slash commands.

    ---
    description: Review a file for bugs
    argument-hint: <file> [focus]
    ---
    Review $1 for bugs, looking hardest at $2.

`review.md` is `/review`; `git/commit.md` is `/git:commit`. Without a description the
body's first line is shown. A repository may be hostile, so every file is read with care:
only regular `.md` files, at most `MAX_BYTES`, valid UTF-8 without NUL bytes; a symlink
that leads out of its folder, a folder past `MAX_DEPTH` and files past `MAX_FILES` are
skipped. Each skipped file is a problem the user is told about (once); the others are
still offered. A scan is a listing and a stat per file: a file is read again only when
its size, mtime or inode changed. `walk`, `read` and `StatCache` are the one place for this
care: agent definitions (`crow.agent_definitions`) are read through them too.
"""

from __future__ import annotations

import itertools
import logging
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Generic, TypeVar

from crow.commands import NAME, PromptCommand, Scope, expand_arguments, one_line
from crow.errors import CommandError
from crow.frontmatter import split_frontmatter

log = logging.getLogger("crow.commands")

MAX_BYTES = 256 * 1024
MAX_FILES = 1000  # per folder
MAX_DEPTH = 4  # folders below the commands folder
# Entries (files and folders of any kind) listed per commands folder: the folder is listed
# before every prompt, so a repository's 100,000 empty folders must not cost seconds each.
MAX_ENTRIES = 10 * MAX_FILES
FOLDERS: tuple[tuple[str, Scope], ...] = ((".crow/commands", "project"), (".claude/commands", "project"))
USER_FOLDER = "commands"  # in CROW_HOME

T = TypeVar("T")


class StatCache(Generic[T]):
    """What each file parsed to, by (real path, *more), parsed again only when the file's
    size, mtime or inode changed: a scan costs a stat per unchanged file, not a read."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, ...], tuple[tuple[int, int, int], T]] = {}

    def get(self, key: tuple[str, ...], parse: Callable[[], T]) -> T | None:
        """The parse of the file at `key[0]` (None when it is gone since the listing)."""
        try:
            info = os.stat(key[0])
        except OSError:
            return None
        stamp = (info.st_size, info.st_mtime_ns, info.st_ino)
        cached = self._entries.get(key)
        if cached is None or cached[0] != stamp:
            cached = self._entries[key] = (stamp, parse())
        return cached[1]

    def trim(self) -> None:
        """Files come and go over a long life: past a bound, forget them all."""
        if len(self._entries) > 20 * MAX_FILES:
            self._entries.clear()


# (real path, name, scope) -> the file's command, or why it is skipped
_cache: StatCache[PromptCommand | str] = StatCache()


def folders(cwd: Path, home: Path) -> list[tuple[Path, Scope]]:
    """Where prompt files are looked for, in precedence order."""
    return [*((cwd / f, scope) for f, scope in FOLDERS), (home / USER_FOLDER, "user")]


def existing(places: Sequence[tuple[Path, str]], cwd: Path) -> Iterator[tuple[Path, str, Path | None]]:
    """`places` with what a walk of each stays within: the resolved project for a project
    folder (resolved, with its lstats, only once one exists; a missing one is skipped for
    one stat), None for the user's."""
    project: Path | None = None
    for folder, scope in places:
        if scope == "project":
            if not os.path.isdir(folder):
                continue
            project = project or cwd.resolve()
        yield folder, scope, project if scope == "project" else None


def scan(cwd: Path, home: Path) -> tuple[list[PromptCommand], list[str]]:
    """Every usable prompt file (first of each name per folder order) and the problems
    met (one line each, naming the file)."""
    found: list[PromptCommand] = []
    problems: list[str] = []
    for folder, scope, within in existing(folders(cwd, home), cwd):
        for path, name in walk(folder, problems, within):
            outcome = _cache.get((path, name, scope), partial(_parse, path, name, scope))
            if isinstance(outcome, str):
                problems.append(outcome)
            elif outcome is not None:
                found.append(outcome)
    _cache.trim()
    return found, problems


def walk(
    folder: Path, problems: list[str], within: Path | None, what: str = "prompt files"
) -> list[tuple[str, str]]:
    """(real path, name) of each `.md` file under `folder` (which must lie in `within`,
    when given: a project's folder symlinked elsewhere is refused), by name; a file's name
    is its path below `folder` without `.md`, folders joined by `:`."""
    if not os.path.isdir(folder):  # one stat: most folders looked for do not exist
        return []
    try:
        top = folder.resolve(strict=True)
    except (OSError, RuntimeError):
        return []  # gone meanwhile: nothing to offer
    if not top.is_dir():
        return []
    if within is not None and not top.is_relative_to(within):
        problems.append(f"{folder}: a symlink out of the project; skipped")
        return []
    out: list[tuple[str, str]] = []
    seen = {str(top)}
    pending: list[tuple[str, tuple[str, ...]]] = [(str(top), ())]
    budget = MAX_ENTRIES
    while pending:
        where, parts = pending.pop()
        try:
            with os.scandir(where) as listing:
                entries = list(itertools.islice(listing, budget + 1))
        except OSError as exc:
            problems.append(f"{where}: cannot be listed ({exc.strerror or exc}); skipped")
            continue
        full = len(entries) > budget
        if full:
            problems.append(f"{folder}: over {MAX_ENTRIES} files and folders; the rest are skipped")
            pending.clear()
            entries.pop()
        budget -= len(entries)
        entries.sort(key=lambda e: e.name)
        for entry in entries:
            if entry.name.startswith("."):
                continue
            real = entry.path
            try:
                if entry.is_symlink():
                    real = os.path.realpath(entry.path)
                    if not Path(real).is_relative_to(top):
                        problems.append(f"{entry.path}: a symlink out of {folder}; skipped")
                        continue
                is_dir = entry.is_dir()  # from the listing: no stat per entry
            except OSError:
                continue
            if is_dir:
                if len(parts) >= MAX_DEPTH:
                    problems.append(f"{entry.path}: folders deeper than {MAX_DEPTH} are not read")
                elif real not in seen:
                    seen.add(real)
                    pending.append((real, (*parts, entry.name)))
            elif entry.name.endswith(".md"):
                if len(out) == MAX_FILES:
                    problems.append(f"{folder}: over {MAX_FILES} {what}; the rest are skipped")
                    return sorted(out, key=lambda pair: pair[1])
                out.append((real, ":".join((*parts, entry.name[:-3]))))
        if full:  # the folders of this listing are not read
            break
    return sorted(out, key=lambda pair: pair[1])


def _parse(path: str, name: str, scope: Scope) -> PromptCommand | str:
    """The command a file defines, or why it is skipped."""
    if not NAME.fullmatch(name):
        return f"{path}: {name!r} is not a command name (letters, digits, _ . : -); skipped"
    try:
        meta, body = split_frontmatter(read_text_file(path))
        description, hint = _fields(meta or {}, body)
    except (OSError, ValueError) as exc:
        return f"{path}: {exc}; skipped"
    origin = "project" if scope == "project" else "user"

    async def expand(arguments: str) -> str:
        import anyio

        try:  # read again: the file may have changed since it was listed
            _, text = split_frontmatter(await anyio.to_thread.run_sync(read_text_file, path))
        except (OSError, ValueError) as exc:
            raise CommandError(f"{path}: {exc}") from exc
        return expand_arguments(text.strip(), arguments)

    return PromptCommand(name, description, expand, hint, scope, origin)


def _fields(meta: dict[str, object], body: str) -> tuple[str, str]:
    description = meta.get("description")
    hint = meta.get("argument-hint", "")
    if isinstance(hint, list):  # `argument-hint: [file, focus]` is a YAML list
        # of words only: nested lists may be aliases of aliases (billions of words in 1 KB)
        if not all(isinstance(h, str | int | float) for h in hint):
            raise ValueError("'argument-hint' must be text or a list of words")
        hint = " ".join(f"[{h}]" for h in hint)
    if description is not None and not isinstance(description, str):
        raise ValueError("'description' must be text")
    if not isinstance(hint, str):
        raise ValueError("'argument-hint' must be text")
    if not description:
        first = next((ln for ln in body.splitlines() if ln.strip()), "")
        description = first.strip().lstrip("#").strip() or "(no description)"
    return one_line(description), one_line(hint)


def read_text_file(path: str | os.PathLike[str], *, errors: str = "strict") -> str:
    """A text file of a place a repository may have prepared (a prompt file, an agent
    definition, AGENTS.md, a skill): a regular file (a FIFO or a device must not block or
    stream forever), at most `MAX_BYTES`, UTF-8 without NUL bytes (`errors="replace"`: any
    bytes but NUL), its line ends as "\\n"; else OSError or ValueError saying why."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_size > MAX_BYTES:
            raise ValueError(f"over {MAX_BYTES // 1024} KB")
        data = b""
        while len(data) <= MAX_BYTES and (more := os.read(fd, MAX_BYTES + 1 - len(data))):
            data += more  # a read may return less than asked (FUSE, network file systems)
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise ValueError(f"over {MAX_BYTES // 1024} KB")
    if b"\0" in data:
        raise ValueError("binary content, not text")
    try:
        text = data.decode("utf-8", errors)
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text  # as open() reads text
