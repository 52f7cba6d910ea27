"""Where the turns' checkpoint records are kept: the store, or files in CROW_HOME.

A record is one turn's checkpoint as JSON text (crow.checkpoints writes and reads it). A
store that keeps side records (`SideRecords`: PostgreSQL) keeps them in the database, so
every crow on it can list, restore, fork and forget a session's turns; otherwise (SQLite,
no store) each is `<turn id>.json` in CROW_HOME/checkpoints/<session id>/ (0700; files
0600). `records_for` picks one per session. The copies of the files' content (blobs) and
the shadow git dirs stay in CROW_HOME on the machine that made them either way.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import shutil
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from crow.private import DIR_MODE, write_private
from crow.store.base import SideRecords

log = logging.getLogger("crow.checkpoints")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class CheckpointRecords(Protocol):
    """The checkpoint half of a store's `SideRecords` (same names, same meaning)."""

    async def save_checkpoint(self, session_id: str, turn_id: str, record: str) -> None: ...
    async def load_checkpoint(self, session_id: str, turn_id: str) -> str | None: ...
    async def checkpoint_turns(self, session_id: str) -> list[str]:
        """The session's turns with a record, oldest first."""

    async def forget_checkpoints(self, session_id: str, turn_ids: Sequence[str] | None = None) -> None:
        """Forget these turns' records (None: all of the session's)."""

    async def copy_checkpoints(self, source_id: str, new_id: str) -> None: ...


def records_for(store: object, home: Path) -> CheckpointRecords:
    """Where a session's records go: its store when that keeps side records, else files."""
    return store if isinstance(store, SideRecords) else CheckpointFiles(home)


@functools.cache
def _here(home: str) -> dict[str, str]:
    return {"host": socket.gethostname(), "home": os.path.realpath(home)}


def here(home: Path) -> dict[str, str]:
    """This machine and CROW_HOME: where a record made now keeps its blobs and trees."""
    return _here(str(home))


def made_elsewhere(record: dict[str, Any], home: Path) -> str | None:
    """Where a record's blobs and snapshot trees are when that is not here (another machine
    or CROW_HOME: the store is shared, those copies are not), else None."""
    made = record.get("made_in")
    if not isinstance(made, dict) or made == here(home):
        return None
    return f"CROW_HOME {made.get('home')} on {made.get('host')}"


def is_safe_id(value: str) -> bool:
    """Whether `value` can name a folder or file (a session's or turn's id): no path tricks."""
    return bool(_ID.fullmatch(value))


def session_dir(home: Path, session_id: str) -> Path | None:
    """The session's checkpoint folder, or None for an id that is no safe folder name."""
    return home / "checkpoints" / session_id if is_safe_id(session_id) else None


def make_dirs(folder: Path) -> None:
    """`folder` and its missing parents, each 0700 (a plain `parents=True` leaves the
    parents to the umask)."""
    if folder.is_dir():
        return
    missing = [folder, *(p for p in folder.parents if not p.exists())]
    for part in reversed(missing):
        with contextlib.suppress(FileExistsError):
            part.mkdir(mode=DIR_MODE)


class CheckpointFiles:
    """Records as `<turn id>.json` files beside the session's blobs. A save is a temp file
    and a rename without fsync: a restore checks every blob against its hash and refuses a
    record that does not parse, so a torn one restores nothing, never a wrong file."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def _file(self, session_id: str, turn_id: str) -> Path | None:
        folder = session_dir(self.home, session_id)
        return folder / f"{turn_id}.json" if folder is not None and is_safe_id(turn_id) else None

    async def save_checkpoint(self, session_id: str, turn_id: str, record: str) -> None:
        path = self._file(session_id, turn_id)
        if path is None:
            raise ValueError(f"not a checkpoint name: {session_id}/{turn_id}")
        make_dirs(path.parent)
        write_private(path, record, sync=False)

    async def load_checkpoint(self, session_id: str, turn_id: str) -> str | None:
        path = self._file(session_id, turn_id)
        try:
            return None if path is None else path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    async def checkpoint_turns(self, session_id: str) -> list[str]:
        folder = session_dir(self.home, session_id)
        if folder is None or not folder.is_dir():
            return []
        saved = []
        for path in folder.glob("*.json"):
            with contextlib.suppress(FileNotFoundError):  # forgotten meanwhile
                saved.append((path.stat().st_mtime_ns, path.stem))
        return [turn for _, turn in sorted(saved)]

    async def forget_checkpoints(self, session_id: str, turn_ids: Sequence[str] | None = None) -> None:
        turns = await self.checkpoint_turns(session_id) if turn_ids is None else turn_ids
        for turn in turns:
            path = self._file(session_id, turn)
            if path is not None:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    async def copy_checkpoints(self, source_id: str, new_id: str) -> None:
        src, dst = session_dir(self.home, source_id), session_dir(self.home, new_id)
        if src is None or dst is None or not src.is_dir():
            return
        make_dirs(dst)
        for manifest in src.glob("*.json"):
            shutil.copy2(manifest, dst / manifest.name)  # its mtime too: prune keeps the newest


async def copy_files_to(records: CheckpointRecords, home: Path, session_id: str) -> int:
    """Copy a session's record files into `records` (a store's), oldest first: what `crow
    sessions migrate` does for each session it copies (the blobs stay where they are, in
    this CROW_HOME). The number copied."""
    files = CheckpointFiles(home)
    copied = 0
    for turn in await files.checkpoint_turns(session_id):
        text = await files.load_checkpoint(session_id, turn)
        if text is not None:
            await records.save_checkpoint(session_id, turn, text)
            copied += 1
    return copied
