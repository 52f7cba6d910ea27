"""Per-turn checkpoints of the files a turn changed, and putting them back (`/undo`, rewind).

What is kept, per session:
- one record per turn that changed files: for each file `write_file` or `edit_file`
  changed, its content (a blob id) and mode before the turn's first change to it, or that
  it did not exist, and the hash of what the turn left; and, when the turn ran `execute`,
  the shadow git trees of the workspace before and after (crow.snapshots). Records are kept
  where crow.checkpoint_records says: in the store when it keeps side records (PostgreSQL),
  else `<turn id>.json` in CROW_HOME/checkpoints/<session id>/.
- `blobs/<sha256>` in CROW_HOME/checkpoints/<session id>/ (0700; files 0600), whatever the
  store: the content before, by hash (shared by the session's turns), on the machine that
  ran the turn (a record names it). Files over MAX_FILE_BYTES are not copied: named as not
  restorable.
The record is saved (awaited) before the tool changes the file; one that cannot be is a
CheckpointError, and the change is not made. A restore checks every blob against its hash,
so a torn one is refused, never written. A session keeps its last KEEP_TURNS turns'
checkpoints; older ones, and a deleted session's, are removed. A turn is keyed by its
prompt's stored id (`HookContext.prompt_id`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from crow.checkpoint_records import (
    CheckpointFiles,
    CheckpointRecords,
    here,
    is_safe_id,
    make_dirs,
    records_for,
    session_dir,
)
from crow.errors import StoreError
from crow.private import write_private

if TYPE_CHECKING:
    from crow.session import Session

log = logging.getLogger("crow.checkpoints")
MAX_FILE_BYTES = 10 * 1024 * 1024
KEEP_TURNS = 50


class CheckpointError(OSError):
    """A checkpoint could not be saved: the change it was for is not made."""


@dataclass(frozen=True, slots=True)
class Restored:
    """What putting back some turns' files did (paths as the user knows them)."""

    restored: tuple[str, ...] = ()  # put back to their content before the turns
    removed: tuple[str, ...] = ()  # created by the turns, removed
    skipped: tuple[tuple[str, str], ...] = ()  # (path, why) left alone, e.g. changed since


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------ recording
@dataclass
class TurnRecord:
    """One turn's checkpoint, as it is being recorded (the hook keeps it in turn_state).
    `folder`: the session's checkpoint folder (CROW_HOME/checkpoints/<session id>), where
    the blobs go; `records`: where the record goes (its files there by default)."""

    folder: Path
    turn: str
    records: CheckpointRecords | None = None
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # absolute path -> entry
    # the shadow snapshot: workspace, before and after (tree ids), at (when before was taken)
    git: dict[str, Any] = field(default_factory=dict)
    seq: int = field(default_factory=time.time_ns)
    # saves one at a time, each of the record as it is then: the last one saved is the newest
    _saving: anyio.Lock = field(default_factory=anyio.Lock, repr=False)

    async def save(self) -> None:
        home = self.folder.parent.parent
        records = self.records if self.records is not None else CheckpointFiles(home)
        async with self._saving:
            body = {
                "version": 1,
                "turn": self.turn,
                "seq": self.seq,
                "files": self.files,
                "git": self.git,
                "made_in": here(home),  # where its blobs and snapshot trees are
            }
            try:
                await records.save_checkpoint(self.folder.name, self.turn, json.dumps(body))
            except OSError as exc:
                raise _unsaved(exc) from exc
            except StoreError as exc:
                raise CheckpointError(0, f"crow could not save its checkpoint: {exc}") from exc

    async def before(self, root: Path, path: Path, expected: str | None = None) -> bool:
        """Record the file's content and mode before the turn's first change to it (once
        per path and turn), and `expected`, the state the change will leave when known (a
        whole file written): then `after` has nothing to save when it does. False when
        there is nothing to record that a write could replace (a folder, a symlink, not a
        regular file): the tool refuses those itself. Raises CheckpointError when the
        checkpoint cannot be saved."""
        key = str(path)
        if key in self.files:
            known = self.files[key]
            if known["after"] != expected:
                known["after"], was = expected, known["after"]
                try:
                    await self.save()
                except CheckpointError:  # refused: the file keeps what the record says
                    known["after"] = was
                    raise
            return True
        from mcp_servers.filesystem.localfs import open_regular

        try:
            fd, size = open_regular(root, path)
        except FileNotFoundError:
            entry: dict[str, Any] = {
                "root": str(root),
                "before": None,
                "after": expected,
                "at": time.time_ns(),
            }
        except OSError:
            return False
        else:
            try:
                st = os.fstat(fd)
                mode = stat.S_IMODE(st.st_mode)
                if size > MAX_FILE_BYTES:
                    before: dict[str, Any] = {"too_big": _stamp(st), "mode": mode}
                else:
                    data = _read_all(fd)
                    blob = sha256(data)
                    target = self.folder / "blobs" / blob
                    if not target.exists():
                        try:
                            make_dirs(target.parent)
                            write_private(target, data, sync=False)
                        except OSError as exc:
                            raise _unsaved(exc) from exc
                    before = {"sha256": blob, "mode": mode}
            finally:
                os.close(fd)
            entry = {"root": str(root), "before": before, "after": expected, "at": time.time_ns()}
        self.files[key] = entry
        try:
            await self.save()
        except CheckpointError:  # refused, so not recorded: the next call on it tries again
            del self.files[key]
            raise
        return True

    async def after(self, paths: Sequence[str] | None = None) -> None:
        """Record what the turn left in each file (all recorded ones by default); a file the
        turn left as it found it (the call failed) is dropped: nothing to put back."""
        changed = paths is None
        for key in list(self.files) if paths is None else paths:
            entry = self.files.get(key)
            if entry is None:
                continue
            now = current_state(Path(entry["root"]), Path(key))
            if now == state_of(entry["before"]):
                del self.files[key]
            elif now == entry["after"]:
                continue  # as expected, and saved so already
            entry["after"] = now
            changed = True
        if changed:
            await self.save()


def _stamp(st: os.stat_result) -> str:
    """What stands for a file too large to copy or hash: its size and change time."""
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


def state_of(before: dict[str, Any] | None) -> str:
    """The `current_state` a file had before the turn."""
    if before is None:
        return "absent"
    if "too_big" in before:
        return f"big:{before['too_big']}"
    if "git" in before:
        return f"git:{before['git']}"
    return f"sha256:{before['sha256']}"


def _unsaved(exc: OSError) -> CheckpointError:
    return CheckpointError(exc.errno or 0, f"crow could not save its checkpoint: {exc.strerror or exc}")


def _real(path: Path | str) -> Path:
    return Path(os.path.realpath(path))


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def current_state(root: Path, path: Path, git: bool = False) -> str:
    """What the file holds now: "sha256:<hex>" (or "git:<blob id>"), "absent", "big:<stamp>"
    (too large to hash: size, mtime, inode) or "other:<why>" (a symlink, a folder)."""
    from mcp_servers.filesystem.localfs import PathChangedError, open_regular

    try:
        fd, size = open_regular(root, path)
    except FileNotFoundError:
        return "absent"
    except PathChangedError:
        return "other:it is now a symlink"
    except IsADirectoryError:
        return "other:it is now a folder"
    except OSError as exc:
        return f"other:{exc.strerror or exc}"
    try:
        if size > MAX_FILE_BYTES:
            return f"big:{_stamp(os.fstat(fd))}"
        data = _read_all(fd)
    finally:
        os.close(fd)
    if git:
        from crow.snapshots import git_blob_id

        return f"git:{git_blob_id(data)}"
    return f"sha256:{sha256(data)}"


# ------------------------------------------------------------------ restoring
async def restore_turns(session: Session, prompt_ids: Sequence[str], home: Path) -> Restored:
    """Put back the files the turns named by `prompt_ids` (their prompts' ids, newest first)
    changed, to their content before the oldest of them; then forget those checkpoints.
    A turn without a checkpoint changed no file crow could see."""
    from crow.restore import restore

    folder = session_dir(home, session.id)
    if folder is None or not prompt_ids:
        return Restored()
    records = records_for(session.store, home)
    found = [r for r in [await _load(records, folder, p) for p in prompt_ids] if r is not None]
    found.sort(key=lambda r: r.get("seq", 0))  # oldest first, whatever order they came in
    roots = [_real(r) for r in session.roots]
    done = await restore(found, roots, home, _real(session.cwd))
    try:
        await _forget(records, folder, found, home)
    except StoreError as exc:  # the files are back: a record left over is pruned later
        log.warning("checkpoints of %s not forgotten after the undo: %s", session.id, exc)
    return done


async def _load(records: CheckpointRecords, folder: Path, turn: str) -> dict[str, Any] | None:
    if not is_safe_id(turn):
        return None
    text = await records.load_checkpoint(folder.name, turn)
    if text is None:
        return None
    try:
        record = json.loads(text)
        if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
            raise ValueError("not a checkpoint")
    except ValueError:
        return {"turn": turn, "damaged": True, "files": {}, "git": {}}
    record["turn"] = turn
    record["folder"] = folder  # where its blobs are, on this machine
    return record


async def _forget(
    records: CheckpointRecords,
    folder: Path,
    found: Sequence[dict[str, Any]],
    home: Path,
    turns: Sequence[str] = (),
) -> None:
    """Forget the turns of these loaded records (and `turns`, also named), their git refs,
    and the blobs they kept that no other turn of the session needs."""
    from crow.snapshots import ShadowGit

    by_workspace: dict[str, list[str]] = {}
    for record in found:
        git = record.get("git") or {}
        if git.get("workspace"):
            refs = [f"refs/crow/{folder.name}/{record['turn']}/{side}" for side in ("before", "after")]
            by_workspace.setdefault(git["workspace"], []).extend(refs)
    await records.forget_checkpoints(folder.name, list(dict.fromkeys([*turns, *(r["turn"] for r in found)])))
    for workspace, refs in by_workspace.items():
        with contextlib.suppress(Exception):  # a leftover ref costs disk, never correctness
            await ShadowGit(home, Path(workspace)).drop(refs)
    if any(_blobs(r) for r in found):
        await _drop_unused_blobs(records, folder)


def _blobs(record: dict[str, Any]) -> set[str]:
    """The blobs a (loaded, so well-formed) record's files come back from."""
    befores = (e.get("before") for e in record["files"].values() if isinstance(e, dict))
    return {b["sha256"] for b in befores if isinstance(b, dict) and isinstance(b.get("sha256"), str)}


async def _drop_unused_blobs(records: CheckpointRecords, folder: Path) -> None:
    blobs = folder / "blobs"
    if not blobs.is_dir():
        return
    used: set[str] = set()
    for turn in await records.checkpoint_turns(folder.name):
        record = await _load(records, folder, turn)
        if record is not None:
            used |= _blobs(record)
    for blob in blobs.iterdir():
        if blob.name not in used:
            with contextlib.suppress(OSError):
                blob.unlink()


async def prune(home: Path, session_id: str, keep: int = KEEP_TURNS, store: object = None) -> None:
    """Keep the session's newest `keep` turns' checkpoints; remove the older ones. `store`:
    the session's (where the records are, crow.checkpoint_records)."""
    folder = session_dir(home, session_id)
    if folder is None:
        return
    records = records_for(store, home)
    try:
        turns = await records.checkpoint_turns(session_id)
        if len(turns) > keep:
            old = turns[: len(turns) - keep]
            found = [r for r in [await _load(records, folder, t) for t in old] if r is not None]
            await _forget(records, folder, found, home, old)
    except StoreError as exc:  # kept until the next turn's prune: room, never correctness
        log.warning("old checkpoints of %s not pruned: %s", session_id, exc)


async def forget_session(session_id: str, home: Path, store: object = None) -> None:
    """Remove a deleted session's checkpoints (`store`: where its records are)."""
    folder = session_dir(home, session_id)
    if folder is None:
        return
    records = records_for(store, home)
    try:
        turns = await records.checkpoint_turns(session_id)
        found = [r for r in [await _load(records, folder, t) for t in turns] if r is not None]
        await _forget(records, folder, found, home, turns)
        await records.forget_checkpoints(session_id)  # any saved since the listing
    except StoreError as exc:  # the session is gone: its records only cost room
        log.warning("checkpoint records of the deleted session %s not removed: %s", session_id, exc)
    shutil.rmtree(folder, ignore_errors=True)


async def fork_checkpoints(source_id: str, new_id: str, home: Path, store: object = None) -> None:
    """Give a fork a copy of its source's checkpoints: the source's turns are the fork's too
    (same prompt ids), so the fork's undo puts back what they changed, also once the source
    is deleted. Blobs are hard links where the filesystem allows; each snapshot tree gets a
    ref of the fork's. A copy that fails leaves the fork without it (logged), never unforked."""
    from crow.snapshots import ShadowGit

    src, dst = session_dir(home, source_id), session_dir(home, new_id)
    if src is None or dst is None:
        return
    records = records_for(store, home)
    refs: dict[str, dict[str, str]] = {}
    try:
        await records.copy_checkpoints(source_id, new_id)
        if (src / "blobs").is_dir():
            make_dirs(dst / "blobs")
            for blob in (src / "blobs").iterdir():
                try:
                    os.link(blob, dst / "blobs" / blob.name)
                except FileExistsError:
                    pass
                except OSError:  # another filesystem, or no hard links: a copy
                    shutil.copy2(blob, dst / "blobs" / blob.name)
        for turn in await records.checkpoint_turns(new_id):
            git = ((await _load(records, dst, turn)) or {}).get("git") or {}
            for side in ("before", "after"):
                if git.get("workspace") and isinstance(git.get(side), str):
                    ref = f"refs/crow/{new_id}/{turn}/{side}"
                    refs.setdefault(git["workspace"], {})[ref] = git[side]
    except Exception as exc:  # OSError, StoreError
        log.warning("checkpoints of %s not all copied to its fork %s: %s", source_id, new_id, exc)
    for workspace, trees in refs.items():
        try:  # trees another CROW_HOME took are not in this one's shadow git: refused
            await ShadowGit(home, Path(workspace)).keep(trees)
        except Exception as exc:  # SnapshotError, OSError, a timeout of git
            log.warning("snapshots of %s not all kept for its fork %s: %s", source_id, new_id, exc)
