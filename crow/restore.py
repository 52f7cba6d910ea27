"""Putting back what some turns changed, from their checkpoints (crow.checkpoints).

Each path the turns changed is planned once: its content before the OLDEST of them, and
what the NEWEST of them left. A path whose content now is not what the turn left (someone
changed it since) is left alone and named. A file `write_file`/`edit_file` changed comes
back from the turn's own copy; one only a command changed, from the shadow git tree taken
before the turn's first command. Every write is atomic and reaches the file without
following a symlink (mcp_servers.filesystem.localfs); every copy is checked against its hash
first, so a damaged checkpoint restores nothing. Those copies stay in the CROW_HOME of the
machine that ran the turn (its record, in a shared store, names it): elsewhere, the files
they would put back are named with where the copies are, and left as they are.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from crow.checkpoint_records import made_elsewhere
from crow.checkpoints import MAX_FILE_BYTES, Restored, current_state, state_of
from crow.errors import FilesNotPutBack
from crow.snapshots import GIT_MODES, ShadowGit, SnapshotError, git_blob_id

CHANGED_SINCE = "changed since the turn (its content is not what the turn left)"
NO_CLOSING_SNAPSHOT = (
    "the turn ended before its closing snapshot (crow stopped, or the snapshot failed): what its"
    " commands changed cannot be told from later changes, so none of it is restored"
)
PARALLEL = 16  # files put back at once
# Writes that fail for want of room: over once space is freed, so the undo stops and can be
# run again (the checkpoint holds the only copy of what the file held before)
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


@dataclass
class _Plan:
    root: Path
    before: Any  # None (did not exist), {"sha256", "mode"}, {"too_big"}, {"git", "mode"}
    after: str | None  # "sha256:..", "git:..", "absent"; None: not recorded (crow stopped)
    folder: Path | None = None  # where a sha256 copy lives
    elsewhere: str | None = None  # where the copies are when not here (crow.checkpoint_records)
    shadow: ShadowGit | None = None
    data: bytes | None = None  # a snapshot's content, fetched with the others in one git run


async def restore(records: list[dict[str, Any]], roots: list[Path], home: Path, cwd: Path) -> Restored:
    """`records`: the turns' checkpoints, oldest first; `roots` and `cwd` resolved."""
    plans: dict[str, _Plan] = {}
    skipped: list[tuple[str, str]] = []
    main = cwd
    for record in records:
        if record.get("damaged"):
            skipped.append((f"(turn {record['turn']})", "its checkpoint is damaged: nothing of it restored"))
            continue
        here: dict[str, _Plan] = {}
        git = record.get("git") or {}
        elsewhere = made_elsewhere(record, home)
        if git.get("before") and git.get("after"):
            shadow = ShadowGit(home, Path(git["workspace"]))
            try:
                changes = await shadow.changes(git["before"], git["after"])
            except (SnapshotError, OSError) as exc:
                why = f"the workspace snapshot cannot be read: {exc}"
                if elsewhere is not None:  # another machine's (or CROW_HOME's) shadow git
                    why = _not_here("the snapshots of its commands are", elsewhere)
                skipped.append(("(commands' changes)", why))
                changes = []
            for c in changes:
                path = str(shadow.work_tree / c.path)
                before = None if c.before is None else {"git": c.before[1], "mode": c.before[0]}
                after = "absent" if c.after is None else f"git:{c.after[1]}"
                here[path] = _Plan(shadow.work_tree, before, after, shadow=shadow)
        elif git.get("before"):  # crow stopped (or that snapshot failed) before the turn ended
            skipped.append(("(commands' changes)", NO_CLOSING_SNAPSHOT))
        folder = record.get("folder")
        for path, entry in record["files"].items():
            if path in here and git.get("at", 0) < entry.get("at", 0):
                continue  # a command changed it before the tool did: the snapshot is older
            after = entry.get("after")
            here[path] = _Plan(Path(entry["root"]), entry.get("before"), after, folder, elsewhere=elsewhere)
        for path, plan in here.items():
            first = plans.get(path)
            if first is None:
                plans[path] = plan
            else:  # keep the oldest before, take the newest after
                first.after = plan.after
    await _fetch_snapshot_blobs(plans.values())
    outcomes: dict[str, str] = {}
    # Each write waits on two fsyncs: run them side by side (distinct paths, so no order
    # matters), which lets the filesystem commit them together.
    limiter = anyio.CapacityLimiter(PARALLEL)
    no_room: list[str] = []

    async def one(path: str, plan: _Plan) -> None:
        async with limiter:
            try:
                outcomes[path] = await _put_back(Path(path), plan, roots)
            except OSError as exc:
                outcomes[path] = f"not restored: {exc.strerror or exc}"
                if exc.errno in _NO_ROOM:
                    no_room.append(_shown(Path(path), main))

    async with anyio.create_task_group() as tg:
        for path, plan in plans.items():
            tg.start_soon(one, path, plan)
    if no_room:
        raise FilesNotPutBack(
            f"Nothing undone: {', '.join(sorted(no_room))} could not be written back"
            f" ({os.strerror(errno.ENOSPC)}). The turns and their checkpoints are kept:"
            " free some space and undo again (files already put back stay so)."
        )
    restored: list[str] = []
    removed: list[str] = []
    for path, outcome in sorted(outcomes.items()):
        shown = _shown(Path(path), main)
        if outcome == "restored":
            restored.append(shown)
        elif outcome == "removed":
            removed.append(shown)
        elif outcome:
            skipped.append((shown, outcome))
    return Restored(tuple(restored), tuple(removed), tuple(skipped))


async def _fetch_snapshot_blobs(plans: Any) -> None:
    wanted: dict[ShadowGit, list[_Plan]] = {}
    for plan in plans:
        if plan.shadow is not None and isinstance(plan.before, dict) and "git" in plan.before:
            wanted.setdefault(plan.shadow, []).append(plan)
    for shadow, some in wanted.items():
        try:
            blobs = await shadow.blobs(sorted({p.before["git"] for p in some}))
        except (SnapshotError, OSError):
            continue  # each is named as missing
        for plan in some:
            plan.data = blobs.get(plan.before["git"])


def _shown(path: Path, main: Path) -> str:
    return path.relative_to(main).as_posix() if path.is_relative_to(main) else str(path)


async def _put_back(path: Path, plan: _Plan, roots: list[Path]) -> str:
    """ "restored", "removed", "" (nothing to do) or why it was left alone."""
    from mcp_servers.filesystem.localfs import remove_file, write_bytes

    if plan.root not in roots:
        return "not in the session's workspace any more"
    before = plan.before
    git = plan.after is not None and plan.after.startswith("git:")
    now = await anyio.to_thread.run_sync(current_state, plan.root, path, git)
    if now == state_of(before) and _mode_as_before(path, before):
        return ""  # as it was before the turn already (the change never landed, or undone)
    if plan.after is None:  # crow stopped between its checkpoint and recording the result
        return "crow stopped before it recorded what the turn left in it; left as it is"
    if now.startswith("other:"):
        return f"not restored: {now[6:]}"
    if now != plan.after:
        return CHANGED_SINCE
    if before is None:
        await anyio.to_thread.run_sync(remove_file, plan.root, path)
        return "removed"
    if "too_big" in before:
        return f"was larger than {MAX_FILE_BYTES // (1024 * 1024)} MB before the turn: no copy was kept"
    data, mode, why = await _content(plan, before, path)
    if data is None:
        return why
    await anyio.to_thread.run_sync(write_bytes, plan.root, path, data, mode)
    return "restored"


async def _content(plan: _Plan, before: dict[str, Any], path: Path) -> tuple[bytes | None, int | None, str]:
    if "sha256" in before:
        try:
            data = (Path(plan.folder or "") / "blobs" / before["sha256"]).read_bytes()
        except OSError:
            why = "its checkpoint copy is missing"
            if plan.elsewhere is not None:
                why = _not_here("its copy from before the turn is", plan.elsewhere)
            return None, None, why
        if hashlib.sha256(data).hexdigest() != before["sha256"]:
            return None, None, "its checkpoint copy is damaged"
        return data, before["mode"], ""
    git_mode = before["mode"]
    if git_mode not in GIT_MODES:
        return None, None, "not a regular file in the snapshot (a symlink or nested repository)"
    data = plan.data
    if data is None or git_blob_id(data) != before["git"]:
        return None, None, "its snapshot copy is missing or damaged"
    return data, _mode_for(path, git_mode), ""


def _not_here(what: str, elsewhere: str) -> str:
    return f"{what} in {elsewhere}, where the turn ran, not here"


def _mode_as_before(path: Path, before: dict[str, Any] | None) -> bool:
    if before is None or "too_big" in before:
        return True
    try:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
    except OSError:
        return False
    if "git" in before:  # git keeps only whether it is executable
        return bool(mode & 0o100) == (before["mode"] == 0o100755)
    return mode == before["mode"]


def _mode_for(path: Path, git_mode: int) -> int:
    """git keeps only "executable or not": the file's own mode with its execute bits set
    (where it is readable) or cleared to match; 0644 or 0755 for a file that is gone."""
    try:
        current = stat.S_IMODE(os.lstat(path).st_mode)
    except OSError:
        return 0o755 if git_mode == 0o100755 else 0o644
    if git_mode == 0o100755:
        return current | (current & 0o444) >> 2
    return current & ~0o111
