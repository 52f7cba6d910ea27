"""This machine's side of the workspace sync (copy mode): walking a root into a `Tree`,
packing entries into a tar for the engine, and applying the container's changes safely.

What the container sends is hostile input: a command the model ran can forge the helper's
scan and the engine's archive. So a name from the container is used only after
`safe_rel` accepted it (relative, no `.`/`..`/empty parts, not hidden), every write goes
through localfs (from the root, one component at a time, no symlink followed, the file
replaced atomically), and a symlink comes back only when its target is relative and,
both as written and as it resolves here, stays inside the root and out of hidden paths.
"""

from __future__ import annotations

import errno
import io
import os
import posixpath
import secrets
import stat
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mcp_servers.filesystem import localfs

MAX_FILES = 100_000
MAX_BYTES = 2 * 1024**3
_MAX_NAME = 255
_MAX_PATH = 4095

FileState = tuple[int, int, int]  # size, mtime_ns, permission bits


class SyncError(Exception):
    """The workspace cannot be synced (its message says why and what to do)."""


class WorkspaceTooLarge(SyncError):
    """Over MAX_FILES files or MAX_BYTES bytes: copy mode refuses it."""


@dataclass
class Tree:
    """One side of one root: names relative to it (POSIX)."""

    files: dict[str, FileState] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    links: dict[str, str] = field(default_factory=dict)
    truncated: bool = False  # the container's scan stopped early: absences mean nothing

    def kind(self, rel: str) -> tuple[object, ...] | None:
        """What is at `rel` as this tree saw it (compared to tell a change)."""
        if rel in self.files:
            return ("file", *self.files[rel])
        if rel in self.links:
            return ("link", self.links[rel])
        return ("dir",) if rel in self.dirs else None


def too_large(what: str) -> WorkspaceTooLarge:
    return WorkspaceTooLarge(
        f"the workspace is too large to copy into a container ({what}; copy mode takes at most "
        f"{MAX_FILES:,} files and {MAX_BYTES // 1024**3} GB): use a local engine, where the "
        "workspace is mounted instead of copied, or open a smaller folder"
    )


def hidden_rels(root: Path, hidden: Iterable[Path]) -> frozenset[str]:
    """The hidden paths strictly inside `root`, relative to it (as paths.Workspace keeps
    them: a root inside a hidden folder is where the user chose to work)."""
    real = Path(os.path.realpath(root))
    rels = set()
    for h in hidden:
        resolved = Path(os.path.realpath(h))
        if resolved != real and resolved.is_relative_to(real):
            rels.add(resolved.relative_to(real).as_posix())
    return frozenset(rels)


def is_hidden(rel: str, hidden: frozenset[str]) -> bool:
    return any(rel == h or rel.startswith(h + "/") for h in hidden)


def walk(root: Path, hidden: frozenset[str], budget: list[int] | None = None) -> Tree:
    """Every folder, regular file and symlink under `root` (symlinks not followed), except
    hidden paths and sockets, FIFOs and devices. `budget` ([files, bytes] left, shared by
    the roots of one sync) is spent; WorkspaceTooLarge once it runs out."""
    budget = budget if budget is not None else [MAX_FILES, MAX_BYTES]
    tree = Tree()
    stack = [""]
    while stack:
        base = stack.pop()
        with os.scandir(os.path.join(root, base) if base else root) as entries:
            for entry in entries:
                rel = f"{base}/{entry.name}" if base else entry.name
                if is_hidden(rel, hidden):
                    continue
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    tree.dirs.add(rel)
                    stack.append(rel)
                    continue
                if stat.S_ISLNK(st.st_mode):
                    tree.links[rel] = os.readlink(entry.path)
                elif stat.S_ISREG(st.st_mode):
                    tree.files[rel] = (st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode) & 0o777)
                    budget[1] -= st.st_size
                else:
                    continue
                budget[0] -= 1
                if budget[0] < 0:
                    raise too_large(f"more than {MAX_FILES:,} files")
                if budget[1] < 0:
                    raise too_large(f"more than {MAX_BYTES // 1024**3} GB")
    return tree


def pack(
    root: Path,
    prefix: str,
    tree: Tree,
    names: Iterable[str],
    *,
    with_root: bool,
    owner: tuple[int, int] = (0, 0),
) -> bytes:
    """A tar of `names` (in `tree`) read from `root`, each named `prefix/name` (prefix: the
    container root without its leading "/"), folders first; with `with_root`, the root's
    own folder too (so a container root that does not exist yet is made: readable by all,
    whatever this machine's mode). Everything is owned by `owner` (uid, gid) there."""
    buf = io.BytesIO()
    # GNU, not PAX: a third smaller and twice as fast to build; whole-second mtimes are
    # fine, as the container's times are only compared with its own.
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        if with_root:
            tar.addfile(_info(prefix, tarfile.DIRTYPE, stat.S_IMODE(os.stat(root).st_mode) | 0o755, owner))
        ordered = sorted(names, key=lambda n: (n not in tree.dirs, n))
        for name in ordered:
            arcname = f"{prefix}/{name}"
            if name in tree.dirs:
                mode = stat.S_IMODE(os.lstat(root / name).st_mode)
                tar.addfile(_info(arcname, tarfile.DIRTYPE, mode, owner))
            elif name in tree.links:
                info = _info(arcname, tarfile.SYMTYPE, 0o777, owner)
                info.linkname = tree.links[name]
                tar.addfile(info)
            elif name in tree.files:
                try:
                    fd, _ = localfs.open_regular(root, root / name)
                except OSError:
                    continue  # gone or replaced since the walk: the next sync sees what is there
                with os.fdopen(fd, "rb") as f:
                    st = os.fstat(f.fileno())
                    info = _info(arcname, tarfile.REGTYPE, stat.S_IMODE(st.st_mode) & 0o777, owner)
                    info.size, info.mtime = st.st_size, int(st.st_mtime)
                    tar.addfile(info, _Exactly(f, st.st_size))
    return buf.getvalue()


def _info(name: str, kind: bytes, mode: int, owner: tuple[int, int]) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, (info.uid, info.gid), info.uname, info.gname = kind, mode, owner, "", ""
    return info


class _Exactly(io.RawIOBase):
    """`size` bytes of a file that may grow or shrink while it is read (padded with NULs):
    the tar header already promised that size."""

    def __init__(self, f: io.BufferedReader, size: int) -> None:
        self._f, self._left = f, size

    def read(self, n: int = -1) -> bytes:
        n = self._left if n < 0 else min(n, self._left)
        data = self._f.read(n)
        data += b"\0" * (n - len(data))
        self._left -= n
        return data


# ------------------------------------------------------------------ the container's side, checked
def safe_rel(rel: object, hidden: frozenset[str]) -> str | None:
    """`rel` when it can name a path inside a root: a string, relative, no NUL, no empty,
    `.` or `..` part, within the OS's limits, not hidden; else None."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or rel.startswith("/"):
        return None
    try:
        raw = os.fsencode(rel)
    except UnicodeEncodeError:
        return None
    parts = rel.split("/")
    if len(raw) > _MAX_PATH or any(p in ("", ".", "..") or len(os.fsencode(p)) > _MAX_NAME for p in parts):
        return None
    return None if is_hidden(rel, hidden) else rel


def safe_link_target(root: Path, rel: str, target: str, hidden: frozenset[str]) -> bool:
    """Whether a symlink at `rel` to `target` stays inside `root`: relative, inside as
    written, and inside where it resolves on this machine now (a symlink of the user's on
    the way may lead out), never into a hidden path."""
    if not target or "\x00" in target or target.startswith("/"):
        return False
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
    if joined == ".." or joined.startswith("../") or (joined != "." and is_hidden(joined, hidden)):
        return False
    real_root = os.path.realpath(root)
    resolved = os.path.realpath(os.path.join(real_root, joined))
    if resolved != real_root and not resolved.startswith(real_root + "/"):
        return False
    inside = os.path.relpath(resolved, real_root)
    return inside == "." or not is_hidden(inside, hidden)


def host_state(root: Path, rel: str) -> tuple[object, ...] | None:
    """What is at `rel` on this machine now, in `Tree.kind`'s form (its folder reached
    without following a symlink: `("symlinked",)` when one is on the way)."""
    parent, _, name = rel.rpartition("/")
    try:
        fd = localfs.open_dir(root, root / parent if parent else root)
    except localfs.PathChangedError:
        return ("symlinked",)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode):
            return ("file", st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode) & 0o777)
        if stat.S_ISLNK(st.st_mode):
            return ("link", os.readlink(name, dir_fd=fd))
        return ("dir",) if stat.S_ISDIR(st.st_mode) else ("other",)
    except FileNotFoundError:
        return None
    finally:
        os.close(fd)


def _parent_fd(root: Path, rel: str) -> tuple[int, str]:
    """An fd on the folder holding `rel` (made when missing, reached without following a
    symlink: localfs.open_dir) and the last name."""
    parent, _, name = rel.rpartition("/")
    if parent:
        make_dirs(root, parent)
    return localfs.open_dir(root, root / parent if parent else root), name


def make_dirs(root: Path, rel: str) -> None:
    """Make folder `rel` and the missing ones above it, each reached without following a
    symlink (a symlink on the way: localfs.PathChangedError)."""
    done = ""
    for part in rel.split("/"):
        path = f"{done}/{part}" if done else part
        try:
            os.close(localfs.open_dir(root, root / path))
        except FileNotFoundError:
            fd = localfs.open_dir(root, root / done if done else root)
            try:
                os.mkdir(part, 0o777, dir_fd=fd)
            except FileExistsError:
                pass
            finally:
                os.close(fd)
            os.close(localfs.open_dir(root, root / path))  # refuses a symlink made meanwhile
        done = path


def write_file(root: Path, rel: str, data: bytes, mode: int) -> None:
    """Replace (or create) `rel` atomically, unless it already holds `data` with `mode`
    (a file the model only touched: the user's editor sees no change)."""
    try:
        fd, size = localfs.open_regular(root, root / rel)
    except OSError:
        fd, size = -1, -1  # not there, or not a plain file: write_bytes says why
    if fd >= 0:
        with os.fdopen(fd, "rb") as f:
            same = size == len(data) and stat.S_IMODE(os.fstat(f.fileno()).st_mode) == mode & 0o777
            if same and f.read(len(data) + 1) == data:
                return
    localfs.write_bytes(root, root / rel, data, mode & 0o777)


def write_link(root: Path, rel: str, target: str) -> None:
    """Make (or replace) the symlink `rel` -> `target` atomically: made under a temporary
    name in its folder, then renamed over the old entry (never over a folder)."""
    fd, name = _parent_fd(root, rel)
    try:
        try:
            if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                raise IsADirectoryError(errno.EISDIR, "a folder is in the way", str(root / rel))
        except FileNotFoundError:
            pass
        tmp = f".crow-link-{secrets.token_hex(6)}.tmp"
        os.symlink(target, tmp, dir_fd=fd)
        try:
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except OSError:
            os.unlink(tmp, dir_fd=fd)
            raise
    finally:
        os.close(fd)


def remove_link(root: Path, rel: str) -> None:
    """Remove the symlink `rel` (and only a symlink: anything else is left, OSError)."""
    parent, _, name = rel.rpartition("/")
    fd = localfs.open_dir(root, root / parent if parent else root)
    try:
        if not stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
            raise OSError(errno.EINVAL, "not a symlink", str(root / rel))
        os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)


def remove_dir(root: Path, rel: str) -> None:
    """Remove the folder `rel` if it is empty (OSError ENOTEMPTY when the user put files
    in it, which stay)."""
    parent, _, name = rel.rpartition("/")
    fd = localfs.open_dir(root, root / parent if parent else root)
    try:
        os.rmdir(name, dir_fd=fd)
    finally:
        os.close(fd)


def kind_of(tree: Tree, rel: str) -> str:
    return "file" if rel in tree.files else "link" if rel in tree.links else "dir" if rel in tree.dirs else ""


class Changes:
    """The container's changes to one root, applied on this machine (blocking: run it in a
    thread). Each name is checked just before it is used: safe (`safe_rel`) and unchanged
    here since the last sync (`record`), else refused with a notice; what happened is
    written into `record`. `base` and `scan`: the container at the last sync and now."""

    def __init__(self, root: Path, hidden: frozenset[str], record: Tree, base: Tree, scan: Tree) -> None:
        self.root, self.hidden, self.record, self.base, self.scan = root, hidden, record, base, scan
        self.notices: list[str] = []
        self.refused: set[str] = set()

    def structure(self, removed: list[str], changed: list[str]) -> None:
        """Deletions (files and symlinks, then folders deepest first), new folders and
        symlinks; the changed files are judged here too, before they are fetched."""
        for n in sorted(removed, key=lambda n: (n in self.base.dirs, -n.count("/"))):
            self._do(n, "remove")
        for n in sorted(changed, key=lambda n: (n not in self.scan.dirs, n)):
            if n in self.scan.dirs:
                self._do(n, "mkdir")
            elif n in self.scan.links:
                self._do(n, "link")
            else:
                self._usable(n)

    def files(self, fetched: dict[str, tuple[bytes, int]]) -> None:
        for n in sorted(fetched):
            self._do(n, "write", *fetched[n])

    def _usable(self, n: str) -> bool:
        if n in self.refused:
            return False
        here = host_state(self.root, n) if safe_rel(n, self.hidden) else ("refused",)
        if here == ("refused",):
            self.notices.append(f"skipped {n!r} from the container: outside the workspace, or hidden")
        elif here == ("symlinked",):
            self.notices.append(f"skipped {n!r} from the container: a symlink here is on its way")
        elif here != self.record.kind(n) and not (here == ("dir",) and n in self.scan.dirs):
            what = "deleted" if self.scan.kind(n) is None else "changed"
            self.notices.append(
                f"{self.root / n}: changed here during the turn and {what} in the container; "
                "kept yours, the model's version was dropped"
            )
        else:
            return True
        self.refused.add(n)
        return False

    def _do(self, n: str, op: str, data: bytes = b"", mode: int = 0) -> None:
        if op == "remove" and safe_rel(n, self.hidden) and host_state(self.root, n) is None:
            return self._record(n)  # deleted on both sides: they agree
        if not self._usable(n):
            return
        if op == "link" and not safe_link_target(self.root, n, self.scan.links[n], self.hidden):
            self.notices.append(
                f"skipped the symlink {n} -> {self.scan.links[n]} from the container: it leads outside"
            )
            return
        try:
            if op == "remove":
                kind = kind_of(self.base, n)
                if kind == "file":
                    localfs.remove_file(self.root, self.root / n)
                elif kind == "link":
                    remove_link(self.root, n)
                else:
                    remove_dir(self.root, n)
            elif op == "mkdir":
                make_dirs(self.root, n)
            elif op == "link":
                write_link(self.root, n, self.scan.links[n])
            else:
                write_file(self.root, n, data, mode)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if op == "remove" and exc.errno == errno.ENOTEMPTY:
                self.notices.append(
                    f"kept the folder {self.root / n}: the model removed it, but it holds files of yours"
                )
            else:
                self.notices.append(
                    f"could not apply the model's change to {self.root / n}: {exc.strerror or exc}"
                )
        finally:
            self._record(n)

    def _record(self, n: str) -> None:
        """Put what is at `n` here now into the record."""
        h = self.record
        h.files.pop(n, None)
        h.links.pop(n, None)
        h.dirs.discard(n)
        state = host_state(self.root, n)
        if state is None:
            return
        if state[0] == "file":
            h.files[n] = state[1:]  # type: ignore[assignment]
        elif state[0] == "link":
            h.links[n] = state[1]  # type: ignore[assignment]
        elif state[0] == "dir":
            h.dirs.add(n)
