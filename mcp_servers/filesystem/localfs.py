"""Local file I/O for the file tools: opens a swapped symlink cannot redirect, writes that
cannot tear.

Opening. ``Workspace.resolve`` checks a path once; a command running beside the tools can
swap a folder for a symlink after that check. So every open here starts from the root
and walks one component at a time with ``O_NOFOLLOW`` (``O_DIRECTORY`` for folders),
relative to the previous folder's descriptor; missing parent folders are made with
``mkdir(dir_fd=...)``. A symlink met on the way (or as the file itself) is refused with
:class:`PathChangedError`. The root's own path is trusted: it is opened as given.

Writing. Content goes to a temp file in the same folder, is fsynced, then renamed over
the target (``rename`` with both descriptors), and the folder is fsynced. A kill at any
moment leaves the old file or the new one. The temp file is unnamed (``O_TMPFILE``) until
just before the rename, so a kill leaves nothing behind; where the filesystem lacks
``O_TMPFILE`` it is a named ``.crow-write-*.tmp`` that a kill mid-write leaves behind.
Any error before the rename removes the temp file and raises :class:`WriteError`: the
original is intact. The existing file's mode, owner, group and extended attributes (ACLs)
are kept. A file with other
hard links is split from them (they keep the old content): a link into the workspace
never carries a write to a file elsewhere, such as a package manager's shared store.
Where the owner cannot be kept (crow is not root), the folder is not writable or the file
is a mount point (a bind-mounted file), the file is overwritten in place instead, after
reserving the space (``posix_fallocate``): a full disk still leaves it intact, but a kill
mid-write can tear it.

Locking. :func:`file_lock` takes an advisory ``flock`` on an existing file (following it
to the new file when a rename replaced it meanwhile), so the read-modify-writes of two
crow processes on one file take turns. Other programs do not take it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import lru_cache
from pathlib import Path

import anyio
from mcp.server.mcpserver.exceptions import ToolError

__all__ = [
    "INLINE_BYTES",
    "MAX_READ_BYTES",
    "BinaryFileError",
    "PathChangedError",
    "WriteError",
    "file_lock",
    "open_dir",
    "open_regular",
    "read_bytes",
    "read_text",
    "remove_file",
    "write_bytes",
    "write_text",
]

MAX_READ_BYTES = 20 * 1024 * 1024  # whole-file reads beyond this are refused, not paged
INLINE_BYTES = 256 * 1024  # files up to this size are read without a thread hop
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


class BinaryFileError(ValueError):
    """The file holds NUL bytes or is not valid UTF-8."""


class PathChangedError(OSError):
    """A symlink appeared in a path that was symlink-free when it was checked."""


class WriteError(OSError):
    """The write failed before the file was replaced: the original is intact."""


@lru_cache(maxsize=256)
def _real_root(root: str) -> str:
    return os.path.realpath(root)


def _relative(root: Path, path: Path) -> list[str]:
    real = _real_root(str(root))
    rel = os.path.relpath(path, real)
    if rel == "." or rel == ".." or rel.startswith("../") or os.path.isabs(rel):
        raise PermissionError(errno.EACCES, f"not a file inside the workspace {real}", str(path))
    return rel.split("/")


def _changed(path: Path) -> PathChangedError:
    return PathChangedError(
        errno.ELOOP, "a symlink appeared in the path while it was in use; not followed", str(path)
    )


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _open_parent(root: Path, path: Path, *, create: bool) -> tuple[int, str]:
    """A descriptor for the folder holding ``path`` (walked without following symlinks)
    and the file's name in it."""
    parts = _relative(root, path)
    fd = os.open(_real_root(str(root)), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            try:
                try:
                    child = os.open(part, _DIR, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(part, 0o777, dir_fd=fd)
                    except FileExistsError:
                        pass  # made by someone else meanwhile: open it (checked below)
                    child = os.open(part, _DIR, dir_fd=fd)
            except OSError as exc:
                # O_NOFOLLOW|O_DIRECTORY on a symlink fails with ENOTDIR (or ELOOP)
                if exc.errno in (errno.ENOTDIR, errno.ELOOP) and _is_link(part, fd):
                    raise _changed(path) from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1]


def _open_file(parent: int, name: str, flags: int, path: Path, mode: int = 0o666) -> int:
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=parent)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _changed(path) from None
        raise


# ------------------------------------------------------------------ reading
def open_dir(root: Path, path: Path) -> int:
    """An fd on the folder at ``path`` (the root itself, or a folder inside it), reached
    without following symlinks; the caller closes it."""
    if os.path.realpath(path) == _real_root(str(root)):
        return os.open(_real_root(str(root)), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    parent, name = _open_parent(root, path, create=False)
    try:
        return os.open(name, _DIR, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP) and _is_link(name, parent):
            raise _changed(path) from None
        raise
    finally:
        os.close(parent)


def open_regular(root: Path, path: Path) -> tuple[int, int]:
    """An fd on the regular file at ``path`` (absolute, inside ``root``), opened without
    following a symlink anywhere below the root, and its size; the caller closes it."""
    return _open_for_read(root, path)


def _open_for_read(root: Path, path: Path) -> tuple[int, int]:
    """An fd on the regular file at ``path`` and its size."""
    parent, name = _open_parent(root, path, create=False)
    try:
        # O_NONBLOCK: opening a FIFO must not hang the tool; it is refused below.
        fd = _open_file(parent, name, os.O_RDONLY | os.O_NONBLOCK, path)
    finally:
        os.close(parent)
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode):
        return fd, st.st_size
    os.close(fd)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
    raise OSError(errno.EINVAL, "not a regular file", str(path))


def _read_upto(fd: int, limit: int) -> bytes:
    """At most `limit` bytes from `fd`, which it closes."""
    try:
        chunks: list[bytes] = []
        left = limit
        while left > 0 and (chunk := os.read(fd, min(left, _CHUNK))):
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _read_fd(fd: int, path: Path) -> str:
    data = _read_upto(fd, MAX_READ_BYTES + 1)
    if len(data) > MAX_READ_BYTES:
        raise ToolError(
            f"{path} is larger than {MAX_READ_BYTES // (1024 * 1024)} MB; "
            "use grep or execute (head/tail/sed) to look at parts of it"
        )
    if b"\x00" in data[:8192]:
        raise BinaryFileError(str(path))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise BinaryFileError(str(path)) from None


async def read_text(root: Path, path: Path) -> str:
    """The file at ``path`` (absolute, inside ``root``) as text."""
    fd, size = _open_for_read(root, path)
    # Most source files are small: reading one inline takes less time than the hop to a
    # worker thread and back. Large ones go to a thread so the loop keeps moving.
    if size <= INLINE_BYTES:
        return _read_fd(fd, path)
    return await anyio.to_thread.run_sync(_read_fd, fd, path, abandon_on_cancel=True)


async def read_bytes(root: Path, path: Path, limit: int) -> tuple[bytes, int]:
    """The first `limit` bytes of the file at ``path`` (absolute, inside ``root``), or all
    of a shorter one, and the file's size."""
    fd, size = _open_for_read(root, path)
    if min(size, limit) <= INLINE_BYTES:
        return _read_upto(fd, limit), size
    return await anyio.to_thread.run_sync(_read_upto, fd, limit, abandon_on_cancel=True), size


# ------------------------------------------------------------------ locking
async def _acquire(root: Path, path: Path) -> int | None:
    while True:
        try:
            fd, _ = _open_for_read(root, path)
        except OSError:
            return None  # nothing to lock yet (or the operation itself will say why)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await anyio.sleep(0.005)
            try:
                now = os.stat(path, follow_symlinks=False)
            except OSError:
                now = None
            held = os.fstat(fd)
            if now is not None and (now.st_ino, now.st_dev) == (held.st_ino, held.st_dev):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # replaced while we waited: lock the file that is there now


@asynccontextmanager
async def file_lock(root: Path, path: Path) -> AsyncIterator[None]:
    """An advisory lock (``flock``) on the file at ``path``, so read-modify-writes of it by
    other crow processes take turns with ours. None when the file does not exist yet."""
    fd = await _acquire(root, path)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)


# ------------------------------------------------------------------ writing
def _write_all(fd: int, data: bytes, offset: int = 0) -> None:
    view = memoryview(data)
    while offset < len(view):
        offset += os.pwrite(fd, view[offset : offset + _CHUNK], offset)


def _unchanged(exc: OSError, path: Path) -> WriteError:
    return WriteError(exc.errno or errno.EIO, exc.strerror or str(exc), str(path))


def _overwrite_in_place(parent: int, name: str, data: bytes, path: Path, mode: int | None) -> None:
    fd = _open_file(parent, name, os.O_WRONLY, path)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        try:
            if data:
                os.posix_fallocate(fd, 0, len(data))  # a full disk fails here, before any change
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise _unchanged(exc, path) from None
        _write_all(fd, data)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)


def _keep_owner_and_mode(fd: int, old: os.stat_result) -> bool:
    """Give the temp file the old file's owner, group and mode; False if the owner cannot
    be kept (crow is not root)."""
    mine = os.fstat(fd)
    if (mine.st_uid, mine.st_gid) != (old.st_uid, old.st_gid):
        try:
            os.fchown(fd, old.st_uid, old.st_gid)
        except PermissionError:
            return False
    os.fchmod(fd, stat.S_IMODE(old.st_mode))  # after chown, which clears set-id bits
    return True


def _copy_xattrs(parent: int, name: str, fd: int) -> bool:
    """Give the temp file the old file's extended attributes (POSIX ACLs, security labels,
    user tags); False if one cannot be copied (then the file is written in place)."""
    try:
        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        return False
    try:
        for attr in os.listxattr(src):
            os.setxattr(fd, attr, os.getxattr(src, attr))
    except OSError as exc:
        return exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP) and not _has_xattrs(src)
    finally:
        os.close(src)
    return True


def _has_xattrs(fd: int) -> bool:
    try:
        return bool(os.listxattr(fd))
    except OSError:
        return False


def _discard(tmp: str | None, parent: int) -> None:
    if tmp is None:
        return
    try:
        os.unlink(tmp, dir_fd=parent)
    except FileNotFoundError:
        pass


@lru_cache(maxsize=1)
def _proc_fds() -> bool:
    return os.path.isdir("/proc/self/fd")


def _create_temp(parent: int, path: Path, mode: int) -> tuple[int, str | None]:
    """A new file in the folder: unnamed (``O_TMPFILE``) where the filesystem allows, so a
    kill before the rename leaves nothing behind; else a named ``.crow-write-*.tmp``."""
    if _proc_fds():
        try:
            return os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, mode, dir_fd=parent), None
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
    tmp = f".crow-write-{secrets.token_hex(6)}.tmp"
    return _open_file(parent, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, path, mode), tmp


def _replace(parent: int, name: str, data: bytes, path: Path, mode: int | None = None) -> None:
    try:
        old: os.stat_result | None = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        old = None
    if old is not None:
        if stat.S_ISLNK(old.st_mode):
            raise _changed(path)
        if stat.S_ISDIR(old.st_mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
        if not stat.S_ISREG(old.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        # The rename needs only the folder writable: without this a file its owner made
        # read-only would be replaced, where a plain write is refused.
        if not os.access(name, os.W_OK, dir_fd=parent, effective_ids=True, follow_symlinks=False):
            raise PermissionError(errno.EACCES, "Permission denied (the file is read-only)", str(path))
    try:
        # A new file gets the usual 0o666 & ~umask; a replacement starts private and then
        # takes the old file's mode.
        fd, tmp = _create_temp(parent, path, 0o600 if old else 0o666)
    except PermissionError:
        if old is None:
            raise
        return _overwrite_in_place(parent, name, data, path, mode)  # the file is writable, its folder not
    except OSError as exc:
        raise _unchanged(exc, path) from None
    try:
        try:
            kept = old is None or (_keep_owner_and_mode(fd, old) and _copy_xattrs(parent, name, fd))
            if kept and mode is not None:
                os.fchmod(fd, mode)
            if kept:
                _write_all(fd, data)
                os.fsync(fd)
                if tmp is None:  # name the unnamed file, just long enough to rename it
                    tmp = f".crow-write-{secrets.token_hex(6)}.tmp"
                    os.link(f"/proc/self/fd/{fd}", tmp, dst_dir_fd=parent, follow_symlinks=True)
        finally:
            os.close(fd)
        if kept:
            try:
                os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                kept = False  # a mount point (a bind-mounted file) cannot be replaced: write into it
    except BaseException as exc:
        _discard(tmp, parent)
        if isinstance(exc, OSError):
            raise _unchanged(exc, path) from None
        raise
    if not kept:
        _discard(tmp, parent)
        return _overwrite_in_place(parent, name, data, path, mode)
    os.fsync(parent)  # the rename itself survives a crash


def write_bytes(root: Path, path: Path, data: bytes, mode: int | None = None) -> None:
    """Replace (or create) the file at ``path`` (absolute, inside ``root``) atomically;
    with ``mode``, the file has that mode (else a replaced file keeps its own)."""
    parent, name = _open_parent(root, path, create=True)
    try:
        _replace(parent, name, data, path, mode)
    finally:
        os.close(parent)


def remove_file(root: Path, path: Path) -> bool:
    """Remove the regular file at ``path`` (absolute, inside ``root``), reached without
    following symlinks; False when it is already gone. A symlink, folder or other kind
    of file in its place is refused (an OSError), never removed."""
    try:
        parent, name = _open_parent(root, path, create=False)
    except FileNotFoundError:
        return False
    try:
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if stat.S_ISLNK(st.st_mode):
            raise _changed(path)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.unlink(name, dir_fd=parent)
        os.fsync(parent)
        return True
    finally:
        os.close(parent)


async def write_text(root: Path, path: Path, text: str) -> None:
    """Write ``text`` as UTF-8 exactly as given ("\\r\\n" stays), atomically."""
    # Not abandoned on cancel: a half-finished write must not race the next call. Always in
    # a thread: the fsyncs can take milliseconds on a real disk.
    await anyio.to_thread.run_sync(write_bytes, root, path, text.encode("utf-8"))
