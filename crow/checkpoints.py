"""Per-turn checkpoints of the files a turn changed, and putting them back (`/undo`, rewind).

What is kept, in CROW_HOME/checkpoints/<session id>/ (0700; files 0600):
- `<turn id>.json`, one per turn that changed files: for each file `write_file` or
  `edit_file` changed, its content (a blob id) and mode before the turn's first change to
  it, or that it did not exist, and the hash of what the turn left; and, when the turn ran
  `execute`, the shadow git trees of the workspace before and after (crow.snapshots).
- `blobs/<sha256>`: the content before, by hash (shared by the session's turns). Files
  over MAX_FILE_BYTES are not copied: named as not restorable.
The checkpoint is written before the tool changes the file (temp file + rename, no fsync:
a restore checks every blob against its hash, so a torn one is refused, never written).
A session keeps its last KEEP_TURNS turns' checkpoints; older ones, and a deleted session's,
are removed. A turn is keyed by its prompt's stored id (`HookContext.prompt_id`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crow.private import DIR_MODE, write_private

if TYPE_CHECKING:
    from crow.session import Session

log = logging.getLogger("crow.checkpoints")
MAX_FILE_BYTES = 10 * 1024 * 1024
KEEP_TURNS = 50
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class CheckpointError(OSError):
    """A checkpoint could not be saved: the change it was for is not made."""


@dataclass(frozen=True, slots=True)
class Restored:
    """What putting back some turns' files did (paths as the user knows them)."""

    restored: tuple[str, ...] = ()  # put back to their content before the turns
    removed: tuple[str, ...] = ()  # created by the turns, removed
    skipped: tuple[tuple[str, str], ...] = ()  # (path, why) left alone, e.g. changed since


def session_dir(home: Path, session_id: str) -> Path | None:
    """The session's checkpoint folder, or None for an id that is no safe folder name."""
    return home / "checkpoints" / session_id if _ID.fullmatch(session_id) else None


def _mkdir(folder: Path) -> None:
    """`folder` and its missing parents, each 0700 (a plain `parents=True` leaves the
    parents to the umask)."""
    if folder.is_dir():
        return
    missing = [folder, *(p for p in folder.parents if not p.exists())]
    for part in reversed(missing):
        with contextlib.suppress(FileExistsError):
            part.mkdir(mode=DIR_MODE)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------ recording
@dataclass
class TurnRecord:
    """One turn's checkpoint, as it is being recorded (the hook keeps it in turn_state)."""

    folder: Path
    turn: str
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # absolute path -> entry
    # the shadow snapshot: workspace, before and after (tree ids), at (when before was taken)
    git: dict[str, Any] = field(default_factory=dict)
    seq: int = field(default_factory=time.time_ns)

    def save(self) -> None:
        body = {"version": 1, "turn": self.turn, "seq": self.seq, "files": self.files, "git": self.git}
        try:
            _mkdir(self.folder)
            write_private(self.folder / f"{self.turn}.json", json.dumps(body), sync=False)
        except OSError as exc:
            raise _unsaved(exc) from exc

    def before(self, root: Path, path: Path, expected: str | None = None) -> bool:
        """Record the file's content and mode before the turn's first change to it (once
        per path and turn), and `expected`, the state the change will leave when known (a
        whole file written): then `after` has nothing to save when it does. False when
        there is nothing to record that a write could replace (a folder, a symlink, not a
        regular file): the tool refuses those itself. Raises CheckpointError when the
        checkpoint cannot be saved."""
        key = str(path)
        if key in self.files:
            if self.files[key]["after"] != expected:
                self.files[key]["after"] = expected
                self.save()
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
                            _mkdir(target.parent)
                            write_private(target, data, sync=False)
                        except OSError as exc:
                            raise _unsaved(exc) from exc
                    before = {"sha256": blob, "mode": mode}
            finally:
                os.close(fd)
            entry = {"root": str(root), "before": before, "after": expected, "at": time.time_ns()}
        self.files[key] = entry
        self.save()
        return True

    def after(self, paths: Sequence[str] | None = None) -> None:
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
            self.save()


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
    records = [r for r in (_load(folder, p) for p in prompt_ids) if r is not None]
    records.sort(key=lambda r: r.get("seq", 0))  # oldest first, whatever order they came in
    roots = [_real(r) for r in session.roots]
    done = await restore(records, roots, home, _real(session.cwd))
    await forget_turns(folder, [r["turn"] for r in records], home)
    return done


def _load(folder: Path, turn: str) -> dict[str, Any] | None:
    if not _ID.fullmatch(turn):
        return None
    try:
        text = (folder / f"{turn}.json").read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        record = json.loads(text)
        if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
            raise ValueError("not a checkpoint")
    except ValueError:
        return {"turn": turn, "damaged": True, "files": {}, "git": {}}
    record["turn"] = turn
    record["folder"] = folder
    return record


async def forget_turns(folder: Path, turns: Sequence[str], home: Path) -> None:
    """Remove these turns' checkpoints, their git refs and the blobs no other turn needs."""
    from crow.snapshots import ShadowGit

    by_workspace: dict[str, list[str]] = {}
    for turn in turns:
        record = _load(folder, turn)
        if record is None:
            continue
        git = record.get("git") or {}
        if git.get("workspace"):
            refs = [f"refs/crow/{folder.name}/{turn}/{side}" for side in ("before", "after")]
            by_workspace.setdefault(git["workspace"], []).extend(refs)
        with contextlib.suppress(FileNotFoundError):
            (folder / f"{turn}.json").unlink()
    for workspace, refs in by_workspace.items():
        with contextlib.suppress(Exception):  # a leftover ref costs disk, never correctness
            await ShadowGit(home, Path(workspace)).drop(refs)
    _drop_unused_blobs(folder)


def _drop_unused_blobs(folder: Path) -> None:
    blobs = folder / "blobs"
    if not blobs.is_dir():
        return
    used: set[str] = set()
    for manifest in folder.glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            for entry in json.loads(manifest.read_text(encoding="utf-8")).get("files", {}).values():
                if isinstance(entry.get("before"), dict) and "sha256" in entry["before"]:
                    used.add(entry["before"]["sha256"])
    for blob in blobs.iterdir():
        if blob.name not in used:
            with contextlib.suppress(OSError):
                blob.unlink()


async def prune(home: Path, session_id: str, keep: int = KEEP_TURNS) -> None:
    """Keep the session's newest `keep` turns' checkpoints; remove the older ones."""
    folder = session_dir(home, session_id)
    if folder is None or not folder.is_dir():
        return
    manifests = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
    if len(manifests) > keep:
        await forget_turns(folder, [p.stem for p in manifests[: len(manifests) - keep]], home)


async def forget_session(session_id: str, home: Path) -> None:
    """Remove a deleted session's checkpoints."""
    folder = session_dir(home, session_id)
    if folder is None or not folder.is_dir():
        return
    await forget_turns(folder, [p.stem for p in folder.glob("*.json")], home)
    shutil.rmtree(folder, ignore_errors=True)


async def fork_checkpoints(source_id: str, new_id: str, home: Path) -> None:
    """Give a fork a copy of its source's checkpoints: the source's turns are the fork's too
    (same prompt ids), so the fork's undo puts back what they changed, also once the source
    is deleted. Blobs are hard links where the filesystem allows; each snapshot tree gets a
    ref of the fork's. A copy that fails leaves the fork without it (logged), never unforked."""
    from crow.snapshots import ShadowGit

    src, dst = session_dir(home, source_id), session_dir(home, new_id)
    if src is None or dst is None or not src.is_dir():
        return
    refs: dict[str, dict[str, str]] = {}
    try:
        _mkdir(dst / "blobs")
        for blob in (src / "blobs").iterdir() if (src / "blobs").is_dir() else ():
            try:
                os.link(blob, dst / "blobs" / blob.name)
            except FileExistsError:
                pass
            except OSError:  # another filesystem, or no hard links: a copy
                shutil.copy2(blob, dst / "blobs" / blob.name)
        for manifest in src.glob("*.json"):
            record = _load(src, manifest.stem)
            if record is None:
                continue
            shutil.copy2(manifest, dst / manifest.name)  # its mtime too: prune keeps the newest
            git = record.get("git") or {}
            for side in ("before", "after"):
                if git.get("workspace") and isinstance(git.get(side), str):
                    ref = f"refs/crow/{new_id}/{manifest.stem}/{side}"
                    refs.setdefault(git["workspace"], {})[ref] = git[side]
        for workspace, trees in refs.items():
            await ShadowGit(home, Path(workspace)).keep(trees)
    except Exception as exc:  # OSError, SnapshotError, a timeout of git
        log.warning("checkpoints of %s not all copied to its fork %s: %s", source_id, new_id, exc)
