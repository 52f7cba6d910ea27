"""Workspace confinement: every path a tool touches resolves inside one of the roots.

This is the filesystem server's security boundary. A workspace has a main root (the
session's cwd: relative paths are taken from it) and may have more roots (ACP's
``additionalDirectories``), reached by absolute path. A path is accepted when,
after resolving every symlink that exists (``os.path.realpath`` with
``strict=False``) and collapsing ``..``, it is a root or lies under one. Each
root is resolved once, so a root reached through a symlink still works.

What is refused, always with a :class:`ToolError` the model can read:
NUL bytes, strings the OS cannot encode (lone surrogates), names longer than
255 bytes or paths longer than 4096 bytes, ``..`` that climbs out, absolute
paths outside every root (``/etc``, ``/proc/self/root/...``), symlinks whose
target lies outside every root (a symlink in one root to a file in another is
that file, and allowed), and paths inside a ``hidden`` folder within a root
(crow's home when the workspace holds it; glob and grep skip it too), unless a
root lies inside that folder and holds the path: as in the sandbox, the deepest
boundary wins.

The check is made before each operation, on the path as it is then. What holds
after the check, against a process (a command the model ran) that swaps a folder
or the file for a symlink meanwhile:

- ``read_file``, ``write_file``, ``edit_file`` (on the local disk) and ``ls`` open
  through ``localfs``: from the root holding the path (the deepest), one component at
  a time with ``O_NOFOLLOW``, the file created and renamed relative to its folder's
  descriptor. A symlink that appears anywhere below the root after the check makes
  the call fail ("changed while in use"); it is never followed, so the swap cannot
  carry a read or a write outside the root. Each root's own path is trusted as given.
- ``glob`` and ``grep`` open their starting folder (or grep's one file) by its
  path after the check: a swap in that window could let them list or read outside
  the root. Below the starting folder they follow no symlinks.
- A hard link inside the root to a file elsewhere is that file: reading it reads
  the other file. Writing replaces the name with a new file and never changes
  the other one. (Under bwrap a command cannot link across the mounts.)
- Through the editor's ``fs/*`` methods the editor opens the path; crow cannot
  say how it treats symlinks.
- ``hidden`` folders and files inside the root (crow's home: its config, trust.json,
  store; a trace file; the user's credential folders) are refused like paths outside
  it, and glob and grep skip them:
  the model must not rewrite the user's config or trust, nor read a key kept there,
  when the user opens a folder that holds them (their home folder, say).
- The ``execute`` tool is not confined by this module at all (the ``bwrap``
  sandbox confines it).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path

from mcp.server.mcpserver.exceptions import ToolError

# Linux limits: NAME_MAX and PATH_MAX, in bytes.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096


class Workspace:
    """The roots and the rules for resolving paths against them: ``root`` (relative paths
    are taken from it) and ``extra_roots`` (duplicates of a root dropped)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        hidden: Iterable[str | os.PathLike[str]] = (),
        extra_roots: Iterable[str | os.PathLike[str]] = (),
    ) -> None:
        roots: list[Path] = []
        for given in (root, *extra_roots):
            resolved = Path(os.path.realpath(given))
            if not resolved.is_dir():
                raise ValueError(f"workspace root {given!s} is not a directory")
            if resolved not in roots:
                roots.append(resolved)
        self.root = roots[0]
        self.roots = tuple(roots)
        # Only those strictly inside a root matter: the others are outside already, and a
        # root inside a hidden folder (or one) is where the user chose to work.
        inside = (Path(os.path.realpath(h)) for h in hidden)
        self.hidden = tuple(
            h for h in inside if h not in roots and any(h.is_relative_to(r) for r in roots)
        )

    def __repr__(self) -> str:
        extra = "".join(f", {str(r)!r}" for r in self.roots[1:])
        return f"Workspace({str(self.root)!r}{extra})"

    def resolve(self, path: str) -> Path:
        """Return the absolute, symlink-free form of ``path``; raise if it leaves every root.

        Relative paths are taken from the main root; absolute ones must already lie inside
        a root.
        """
        check_path_text(path)
        candidate = Path(path) if os.path.isabs(path) else self.root / path
        try:
            # Strict first: past a symlink loop, a lenient realpath leaves the rest of the
            # path unresolved ("loop/../out" -> "out", a symlink that may lead outside).
            resolved = Path(os.path.realpath(candidate, strict=True))
        except OSError as exc:  # a file to be created, a missing or non-folder part, a loop
            if exc.errno == errno.ELOOP:
                raise _loop(path) from None
            lenient = os.path.realpath(candidate)
            if os.path.realpath(lenient) != lenient:  # a loop further on ("missing/../loop/..")
                raise _loop(path) from None
            resolved = Path(lenient)
        except ValueError as exc:
            raise ToolError(f"cannot resolve path {path!r}: {exc}") from None
        root = containing_root(self.roots, resolved)
        if root is None:
            extra = ", ".join(map(str, self.roots[1:]))
            where = f"the workspace {self.root}" + (f" and its other roots {extra}" if extra else "")
            raise ToolError(f"path {path!r} is outside {where}")
        for hidden in self.hidden:
            if resolved.is_relative_to(hidden) and not root.is_relative_to(hidden):
                raise ToolError(
                    f"path {path!r} is in {self.relative(hidden)}, which holds the user's credentials "
                    "or crow's own config, trust and sessions: the file tools do not reach it"
                )
        size = len(os.fsencode(str(resolved)))
        if size >= MAX_PATH_BYTES:  # the OS would refuse it with ENAMETOOLONG
            raise ToolError(
                f"path is too long once joined to the workspace ({size} bytes; the limit is "
                f"{MAX_PATH_BYTES - 1})"
            )
        return resolved

    def root_of(self, resolved: Path) -> Path:
        """The root a resolved path lies in (the deepest that holds it): where the symlink-safe
        opens start, and what a search's names are relative to."""
        root = containing_root(self.roots, resolved)
        if root is None:  # resolve() refuses such a path first
            raise ToolError(f"{resolved} is outside the workspace")
        return root

    def hidden_relative(self, root: Path | None = None) -> frozenset[str]:
        """The hidden paths inside ``root`` (default the main one) as POSIX paths relative
        to it (what the searches skip)."""
        base = self.root if root is None else root
        return frozenset(h.relative_to(base).as_posix() for h in self.hidden if h.is_relative_to(base))

    def relative(self, path: Path) -> str:
        """Display form of a resolved path: POSIX, relative to the main root (``.`` for it),
        absolute when it lies in another root (the form the tools take back)."""
        try:  # (is_relative_to would compute relative_to twice)
            return path.relative_to(self.root).as_posix() or "."
        except ValueError:
            return path.as_posix()

    def prefix(self, root: Path) -> str:
        """What turns a name relative to ``root`` into its display form ("" for the main root)."""
        return "" if root == self.root else self.relative(root).rstrip("/") + "/"


def check_path_text(path: str) -> None:
    """The checks of the string itself (type, NUL, encoding, lengths) that every resolve
    makes first, this machine's or a container's (container/files.py)."""
    if not isinstance(path, str):
        raise ToolError(f"path must be a string, not {type(path).__name__}")
    if "\x00" in path:
        raise ToolError(f"path {path!r} contains a NUL byte")
    try:
        raw = os.fsencode(path)
    except UnicodeEncodeError:
        raise ToolError(f"path {path!r} contains characters that cannot be encoded") from None
    if len(raw) > MAX_PATH_BYTES:
        raise ToolError(f"path is too long ({len(raw)} bytes; the limit is {MAX_PATH_BYTES})")
    if any(len(part) > MAX_NAME_BYTES for part in raw.split(b"/")):
        raise ToolError(f"a name in path {path[:80]!r}... exceeds {MAX_NAME_BYTES} bytes")


def containing_root(roots: Iterable[Path], resolved: Path) -> Path | None:
    """The deepest of ``roots`` (resolved) that is ``resolved`` or holds it, or None."""
    # A prefix of parts: what is_relative_to checks for absolute POSIX paths, 10x faster.
    holding = [r for r in roots if resolved.parts[: len(r.parts)] == r.parts]
    return max(holding, key=lambda r: len(r.parts)) if holding else None


def _loop(path: str) -> ToolError:
    return ToolError(f"cannot resolve path {path!r}: it goes through a symlink loop")
