"""The workspace in copy mode: how a session's roots reach a container on a remote engine
(where no bind mount is possible) and how the model's changes come back.

- `copy_in`, once the container runs: every root is packed into one tar (folders, regular
  files, symlinks kept as symlinks, permission bits kept; hidden paths, sockets, FIFOs and
  devices skipped; nothing else, `.git` included) and put under its container root, owned
  by the user the container runs as (so the model can change it). An extra root inside
  another is copied once, at its own container path. Over
  100,000 files or 2 GB: refused (`WorkspaceTooLarge`), saying to use a local engine (the
  workspace mounted) or a smaller folder.
- `push`, at the start of a turn: what the user changed here since the last sync (files,
  folders, symlinks, deletions; told by size, mtime and mode) goes to the container.
- `pull`, at the end of a turn: one scan per root tells what changed in the container since
  the last sync. New and changed files come back byte for byte (from the engine's
  archive, one call when they are close together), deletions are applied here only to
  what the user left unchanged, symlinks come back only when relative and inside the root.
  A path the user changed here during the turn that the model changed too keeps the
  user's version: the model's is dropped and a notice names the file. It is not saved
  beside it: a stray copy would land in the user's tree (builds, test discovery, globs,
  git status) with nothing to tell the user what it is, and the next push puts the user's
  version in the container, so both sides agree again.

Each side keeps its own record of the last sync (the engine's archive does not keep
nanosecond mtimes, so the container's times are its own). Every name from the container is
hostile input: synchost checks it and writes through localfs.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

import anyio

from mcp_servers.filesystem.container import synchost as host
from mcp_servers.filesystem.container.engine import NotFound
from mcp_servers.filesystem.container.synchost import SyncError, Tree, WorkspaceTooLarge

__all__ = ["SyncError", "WorkspaceSync", "WorkspaceTooLarge"]

# What one more archive call costs, in bytes it could have carried instead: Podman 4.3 here
# takes ~90 ms a call plus ~55 ms a MB (bench/container_sync.py), calls one at a time.
_CALL_BYTES = 2 * 1024 * 1024
_PARALLEL = 4  # archive calls in flight (an engine that serves them side by side)
_RM_BATCH = 500


class _Engine(Protocol):
    async def put_archive(self, container_id: str, path: str, tar: bytes) -> None: ...
    async def get_archive(self, container_id: str, path: str, *, max_bytes: int | None = None) -> bytes: ...
    async def exec_run(self, container_id: str, cmd: list[str]) -> tuple[int, bytes, bytes]: ...


class _Root:
    """One (container root, host root) pair and both sides' record of the last sync."""

    def __init__(self, croot: PurePosixPath, hroot: Path, hidden: Iterable[Path]) -> None:
        self.croot = croot
        self.root = Path(os.path.realpath(hroot))
        self.hidden = host.hidden_rels(self.root, hidden)
        self.host = Tree()  # this machine at the last sync
        self.cont = Tree()  # the container at the last sync

    def cpath(self, rel: str) -> str:
        return str(self.croot / rel) if rel else str(self.croot)


class WorkspaceSync:
    """One session's roots copied into its container and kept in step, turn by turn."""

    def __init__(
        self, engine: Any, pairs: list[tuple[PurePosixPath, Path]], hidden: Iterable[Path] = ()
    ) -> None:
        hidden = list(hidden)
        self._engine: _Engine = engine
        self._roots = [_Root(c, h, hidden) for c, h in pairs]
        for r in self._roots:
            # A root inside another (an extra root in the workdir) is copied and synced once,
            # at its own container path: two copies would drift apart.
            # Left out like a hidden path (the model told when it writes there).
            r.hidden |= host.hidden_rels(r.root, [o.root for o in self._roots if o is not r])
        self._lock = anyio.Lock()
        self._owner = (0, 0)  # uid, gid of the container's user: who owns what is copied in

    # ------------------------------------------------------------------ copy in, push
    async def copy_in(self, container_id: str, client: Any) -> None:
        """Every root into its container root (WorkspaceTooLarge over the caps)."""
        async with self._lock:
            budget = [host.MAX_FILES, host.MAX_BYTES]
            for r in self._roots:
                r.host = await anyio.to_thread.run_sync(host.walk, r.root, r.hidden, budget)
            self._owner = await self._container_user(container_id)
            for r in self._roots:
                names = [*r.host.dirs, *r.host.files, *r.host.links]
                tar = await anyio.to_thread.run_sync(_pack, r, names, self._owner, True)
                await self._engine.put_archive(container_id, "/", tar)
            for r in self._roots:
                r.cont, _ = await _scan(client, r)

    async def push(self, container_id: str, client: Any) -> list[str]:
        """What the user changed here since the last sync, into the container."""
        async with self._lock:
            budget = [host.MAX_FILES, host.MAX_BYTES]
            for r in self._roots:
                now = await anyio.to_thread.run_sync(host.walk, r.root, r.hidden, budget)
                gone = _topmost(
                    [n for n in _names(r.host) if host.kind_of(now, n) != host.kind_of(r.host, n)]
                )
                changed = [n for n in _names(now) if now.kind(n) != r.host.kind(n)]
                if gone:
                    await self._remove_in_container(container_id, r, gone)
                if changed:
                    tar = await anyio.to_thread.run_sync(_pack, r, changed, self._owner, False, now)
                    await self._engine.put_archive(container_id, "/", tar)
                r.host = now
                if gone or changed:
                    # Only what was pushed takes the container's new times: anything else that
                    # changed there (a job the model left running) is still brought back at pull.
                    scan, _ = await _scan(client, r)
                    r.cont = _merge(r.cont, scan, set(changed), gone)
        return []

    async def _container_user(self, container_id: str) -> tuple[int, int]:
        """The uid and gid commands run as in the container (its `User`, a name or a number):
        the copied files are theirs, so the model can change them. Python is there (the
        helper needs it)."""
        code, out, err = await self._engine.exec_run(
            container_id, ["python3", "-c", "import os; print(os.getuid(), os.getgid())"]
        )
        ids = out.split()
        if code != 0 or len(ids) != 2 or not all(i.isdigit() for i in ids):
            raise SyncError(f"cannot tell which user the container runs as: {err[-300:]!r}")
        return int(ids[0]), int(ids[1])

    async def _remove_in_container(self, container_id: str, r: _Root, rels: list[str]) -> None:
        for i in range(0, len(rels), _RM_BATCH):
            paths = [r.cpath(n) for n in rels[i : i + _RM_BATCH]]
            code, _, err = await self._engine.exec_run(container_id, ["rm", "-rf", "--", *paths])
            if code != 0:
                raise SyncError(
                    f"cannot remove {len(paths)} deleted path(s) in the container: {err[-300:]!r}"
                )

    # ------------------------------------------------------------------ pull
    async def pull(self, container_id: str, client: Any) -> list[str]:
        """What changed in the container since the last sync, onto this machine; notices
        for the user (conflicts, what was refused)."""
        notices: list[str] = []
        async with self._lock:
            for r in self._roots:
                scan, bad = await _scan(client, r)
                if bad:
                    notices.append(f"ignored {bad} malformed entries in the container's listing of {r.croot}")
                notices += await self._pull_root(container_id, r, scan)
                r.cont = scan
        return notices

    async def _pull_root(self, container_id: str, r: _Root, scan: Tree) -> list[str]:
        base = r.cont
        notices: list[str] = []
        changed = [n for n in _names(scan) if scan.kind(n) != base.kind(n)]
        # A name that is not safe was never brought here: its removal is not news either.
        removed = [
            n
            for n in ([] if scan.truncated else _names(base))
            if host.kind_of(scan, n) != host.kind_of(base, n) and host.safe_rel(n, r.hidden) is not None
        ]
        if scan.truncated:
            notices.append(
                f"{r.croot} in the container holds too many files to list: no deletion brought back"
            )
        if not changed and not removed:
            return notices
        if (
            sum(n not in scan.dirs for n in changed) > host.MAX_FILES  # counted as at copy_in
            or sum(scan.files[n][0] for n in changed if n in scan.files) > host.MAX_BYTES
        ):
            scan.files, scan.dirs, scan.links = base.files, base.dirs, base.links  # looked at again next turn
            too_much = f"more than {host.MAX_FILES:,} files or {host.MAX_BYTES // 1024**3} GB"
            return [*notices, f"the model changed {too_much} in {r.croot}: none of it was brought back"]

        apply = host.Changes(r.root, r.hidden, r.host, base, scan)
        await anyio.to_thread.run_sync(apply.structure, removed, changed)
        wanted = [n for n in changed if n in scan.files and n not in apply.refused]
        if wanted:
            fetched = await self._fetch(container_id, r, scan, wanted)
            await anyio.to_thread.run_sync(apply.files, fetched)
            for n in set(wanted) - set(fetched):  # gone from the archive: looked at again next pull
                scan.files.pop(n, None)
        return notices + apply.notices

    async def _fetch(
        self, container_id: str, r: _Root, scan: Tree, wanted: list[str]
    ) -> dict[str, tuple[bytes, int]]:
        """The wanted files' bytes and modes, from the engine's archive (_plan: which calls)."""
        fetches = _plan(scan.files, wanted)
        got: dict[str, tuple[bytes, int]] = {}
        wanted_set = set(wanted)
        limiter = anyio.Semaphore(_PARALLEL)

        async def one(rel: str) -> None:
            async with limiter:
                try:
                    # Bounded: a file the model grew past the cap since the scan cannot
                    # fill this process's memory (tar headers: 64 MB of slack).
                    tar = await self._engine.get_archive(
                        container_id, r.cpath(rel), max_bytes=host.MAX_BYTES + (64 << 20)
                    )
                except NotFound:
                    return  # deleted since the scan: the next pull sees that
            got.update(await anyio.to_thread.run_sync(_members, tar, rel, r.croot, wanted_set))

        async with anyio.create_task_group() as tg:
            for rel in fetches:
                tg.start_soon(one, rel)
        return got


# ------------------------------------------------------------------ helpers
def _names(tree: Tree) -> list[str]:
    return [*tree.dirs, *tree.files, *tree.links]


def _plan(files: dict[str, host.FileState], wanted: list[str]) -> list[str]:
    """The folders and files to fetch so that every wanted file is in one of them, at the
    least cost (a call costs _CALL_BYTES, plus every byte under what it fetches): a folder
    in one call when its unwanted bytes cost less than the calls it saves."""
    folders = {posixpath.dirname(n) for n in wanted}
    for f in list(folders):
        while f:
            f = posixpath.dirname(f)
            folders.add(f)
    under = dict.fromkeys(folders, 0)  # bytes under each folder that matters
    for name, (size, _, _) in files.items():
        f = name
        while f:
            f = posixpath.dirname(f)
            if f in under:
                under[f] += size

    def best(folder: str, names: list[str]) -> tuple[int, list[str]]:
        groups: dict[str, list[str]] = {}
        cost, picks = 0, []
        for n in names:
            rest = n[len(folder) + 1 :] if folder else n
            if "/" in rest:
                groups.setdefault(rest.split("/", 1)[0], []).append(n)
            else:
                cost, picks = cost + _CALL_BYTES + files[n][0], [*picks, n]
        for sub, inside in groups.items():
            c, p = best(f"{folder}/{sub}" if folder else sub, inside)
            cost, picks = cost + c, picks + p
        whole = _CALL_BYTES + under[folder]
        return (whole, [folder]) if whole < cost else (cost, picks)

    return best("", wanted)[1]


def _merge(old: Tree, new: Tree, touched: set[str], gone: list[str]) -> Tree:
    """`old`, with the entries at `touched` names and under `gone` ones taken from `new`."""

    def fresh(n: str) -> bool:
        return n in touched or any(n == g or n.startswith(g + "/") for g in gone)

    merged = Tree(truncated=new.truncated)
    for src, pick in ((old, lambda n: not fresh(n)), (new, fresh)):
        merged.files.update((n, s) for n, s in src.files.items() if pick(n))
        merged.links.update((n, t) for n, t in src.links.items() if pick(n))
        merged.dirs.update(n for n in src.dirs if pick(n))
    return merged


def _topmost(rels: list[str]) -> list[str]:
    """`rels` without those under another of them (rm -rf takes the folder's content)."""
    kept: list[str] = []
    for rel in sorted(rels):
        if not kept or not (rel == kept[-1] or rel.startswith(kept[-1] + "/")):
            kept.append(rel)
    return kept


def _pack(
    r: _Root, names: Sequence[str], owner: tuple[int, int], with_root: bool, tree: Tree | None = None
) -> bytes:
    prefix = str(r.croot).lstrip("/")
    return host.pack(r.root, prefix, tree or r.host, names, with_root=with_root, owner=owner)


def _members(
    tar: bytes, fetched: str, croot: PurePosixPath, wanted: set[str]
) -> dict[str, tuple[bytes, int]]:
    """The regular files of an archive of `fetched` (relative to `croot`) that are among
    `wanted`, by their name relative to the root. Only names equal to a wanted one are
    taken, so a forged member (`../x`, `/etc/x`, a link) is never used."""
    import io
    import tarfile

    top = posixpath.basename(str(croot / fetched) if fetched else str(croot))
    found: dict[str, tuple[bytes, int]] = {}
    left = host.MAX_BYTES
    try:
        with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as archive:
            for m in archive:
                name = m.name.removeprefix("./")
                if not m.isreg() or not (name == top or name.startswith(top + "/")):
                    continue
                sub = name[len(top) + 1 :]
                rel = f"{fetched}/{sub}" if fetched and sub else fetched or sub
                if rel in wanted and rel not in found and m.size <= left:
                    f = archive.extractfile(m)
                    data = f.read() if f else b""
                    if len(data) == m.size:
                        found[rel] = (data, m.mode & 0o777)
                        left -= m.size
    except tarfile.TarError:
        pass  # a broken archive brings back what came before the break
    return found


async def _scan(client: Any, r: _Root) -> tuple[Tree, int]:
    """The container's side of a root, from the helper's scan, shape-checked: a tree and how
    many entries were malformed (dropped). Names are checked where they are used."""
    reply, _ = await client.call("scan", _is_dict, root=r.croot.as_posix())
    tree, bad = Tree(), 0
    if not isinstance(reply, dict):
        raise SyncError(f"the helper's scan of {r.croot} is malformed")
    files, dirs, links = reply.get("files"), reply.get("dirs"), reply.get("symlinks")
    if not isinstance(files, dict) or not isinstance(dirs, list) or not isinstance(links, dict):
        raise SyncError(f"the helper's scan of {r.croot} is malformed")

    for name, st in files.items():
        if isinstance(st, list) and len(st) == 3 and all(type(v) is int and v >= 0 for v in st):
            tree.files[name] = (st[0], st[1], st[2] & 0o777)
        else:
            bad += 1
    for name in dirs:
        if isinstance(name, str):
            tree.dirs.add(name)
        else:
            bad += 1
    for name, target in links.items():
        if isinstance(target, str):
            tree.links[name] = target
        else:
            bad += 1
    tree.truncated = reply.get("truncated") is not False
    return tree, bad


def _is_dict(result: Any, blob: bytes) -> bool:
    return isinstance(result, dict)  # the entries are checked one by one: a bad one is dropped
