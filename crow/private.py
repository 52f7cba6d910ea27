"""crow's files are the user's alone: CROW_HOME 0700; the database, traces, exports and
stored credentials 0600 (conversations hold code, secrets pasted in prompts, tool output).

New files are created with their final mode (no moment at which they are readable by
others); ones that exist with group or other bits are tightened, and one log line says
what changed. Files of another owner and symlinks are left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # not imported: `crow sessions list` loads this module, pathlib costs ~4 ms
    from pathlib import Path

log = logging.getLogger("crow.private")

DIR_MODE = 0o700
FILE_MODE = 0o600
# What crow keeps in CROW_HOME besides the database: config.yaml may hold API keys,
# credentials.json holds the ones `crow login` stored.
HOME_FILES = ("config.yaml", "trust.json", "rules.json", "credentials.json")
DB_SUFFIXES = ("", "-wal", "-shm", "-journal")
DB_FILE = "crow.db"  # the session store, in CROW_HOME


def crow_home(env: Mapping[str, str] = os.environ) -> Path:
    """CROW_HOME (default ~/.crow): config.yaml, the database, traces."""
    from pathlib import Path

    return Path(home_dir(env))


def home_dir(env: Mapping[str, str] = os.environ) -> str:
    """`crow_home` as text. Read here, not from the config, so `crow sessions` finds the
    store without importing the config model (or pathlib)."""
    return os.path.expanduser(env.get("CROW_HOME") or "~/.crow")


def tighten(path: str | os.PathLike[str], mode: int) -> str | None:
    """Drop permission bits of `path` beyond `mode`; returns what changed, or None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    current = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid() or not current & ~mode:
        return None
    try:
        os.chmod(path, current & mode)
    except OSError as exc:
        log.warning("cannot make %s private: %s", path, exc)
        return None
    return f"{os.path.basename(path) or path} {current:04o}→{current & mode:04o}"


def tighten_fd(fd: int, path: str | os.PathLike[str], what: str) -> None:
    """Make an open file private (a trace, an export): one log line when it was not."""
    st = os.fstat(fd)
    current = stat.S_IMODE(st.st_mode)
    if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and current & ~FILE_MODE:
        os.fchmod(fd, current & FILE_MODE)
        log.warning("made %s %s private: %04o→%04o", what, path, current, current & FILE_MODE)


def secure_store(db_path: str, home: str | None) -> None:
    """Before the database opens: its folder created 0700 when missing and the file created
    0600 (SQLite gives its -wal and -shm files the database's mode). Existing files with
    looser modes are tightened, in one log line: the database's files, and with `home`
    (CROW_HOME) that folder and HOME_FILES in it."""
    folder = os.path.dirname(db_path) or "."
    os.makedirs(folder, mode=DIR_MODE, exist_ok=True)
    changed = (
        [tighten(home, DIR_MODE), *(tighten(os.path.join(home, n), FILE_MODE) for n in HOME_FILES)]
        if home
        else []
    )
    changed += [tighten(f"{db_path}{suffix}", FILE_MODE) for suffix in DB_SUFFIXES]
    if not os.path.exists(db_path):
        os.close(os.open(db_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE))
    if done := [c for c in changed if c]:
        where = home or folder
        log.warning("made crow's files in %s private (only you can read them): %s", where, ", ".join(done))


def write_private(path: Path, text: str | bytes, *, sync: bool = True) -> None:
    """Replace `path` atomically with `text`, mode 0600 from the start (temp file, fsync,
    rename): a crash leaves the old file or the new one. `sync=False` skips the fsync, for
    files whose reader checks them (a checkpoint's hash): a killed process still leaves the
    old file or the new one; a power cut may leave the new one empty."""
    import tempfile  # here: `crow sessions list` imports this module and never writes

    path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)  # created 0600
    data = text.encode("utf-8") if isinstance(text, str) else text
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on a `.NAME.lock` beside `path`, for a read-change-write of it:
    two crow processes changing the file at once both land."""
    path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    fd = os.open(path.parent / f".{path.stem}.lock", os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
