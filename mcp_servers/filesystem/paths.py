"""Workspace confinement: every path a tool touches resolves inside one root.

This is the filesystem server's security boundary. A path is accepted when,
after resolving every symlink that exists (``os.path.realpath`` with
``strict=False``) and collapsing ``..``, it is the root or lies under it. The
root itself is resolved once, so a root reached through a symlink still works.

What is refused, always with a :class:`ToolError` the model can read:
NUL bytes, strings the OS cannot encode (lone surrogates), names longer than
255 bytes or paths longer than 4096 bytes, ``..`` that climbs out, absolute
paths outside the root (``/etc``, ``/proc/self/root/...``), symlinks whose
target lies outside, and paths inside a ``hidden`` folder within the root (crow's
home when the workspace holds it; glob and grep skip it too).

The check is made before each operation, on the path as it is then. What holds
after the check, against a process (a command the model ran) that swaps a folder
or the file for a symlink meanwhile:

- ``read_file``, ``write_file``, ``edit_file`` (on the local disk) and ``ls`` open
  through ``localfs``: from the root, one component at a time with ``O_NOFOLLOW``, the
  file created and renamed relative to its folder's descriptor. A symlink that
  appears anywhere below the root after the check makes the call fail ("changed
  while in use"); it is never followed, so the swap cannot carry a read or a write
  outside the root. The root's own path is trusted as given.
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
    """A root directory and the rules for resolving paths against it."""

    def __init__(self, root: str | os.PathLike[str], hidden: Iterable[str | os.PathLike[str]] = ()) -> None:
        resolved = Path(os.path.realpath(root))
        if not resolved.is_dir():
            raise ValueError(f"workspace root {root!s} is not a directory")
        self.root = resolved
        # Only those strictly inside the root matter: the others are outside already, and
        # a root inside a hidden folder is where the user chose to work.
        inside = (Path(os.path.realpath(h)) for h in hidden)
        self.hidden = tuple(h for h in inside if h != resolved and h.is_relative_to(resolved))

    def __repr__(self) -> str:
        return f"Workspace({str(self.root)!r})"

    def resolve(self, path: str) -> Path:
        """Return the absolute, symlink-free form of ``path``; raise if it leaves the root.

        Relative paths are taken from the root; absolute ones must already lie inside it.
        """
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
        if resolved != self.root and not resolved.is_relative_to(self.root):
            raise ToolError(f"path {path!r} is outside the workspace {self.root}")
        for hidden in self.hidden:
            if resolved.is_relative_to(hidden):
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

    def hidden_relative(self) -> frozenset[str]:
        """The hidden paths as workspace-relative POSIX paths (what the searches skip)."""
        return frozenset(self.relative(h) for h in self.hidden)

    def relative(self, path: Path) -> str:
        """Display form of a resolved path: POSIX, relative to the root, ``.`` for the root."""
        return path.relative_to(self.root).as_posix() or "."


def _loop(path: str) -> ToolError:
    return ToolError(f"cannot resolve path {path!r}: it goes through a symlink loop")
