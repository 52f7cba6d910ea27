"""Shadow git snapshots of a workspace: what `execute` changed, as gemini-cli's checkpoints
find it (a git dir of crow's own, the workspace as its work tree).

One git dir per workspace (its main root), in CROW_HOME/checkpoints/git/<hash of the
path>, 0700. Every git run gets GIT_DIR and GIT_WORK_TREE in the child's environment only,
no global or system config (so no user hooks, signing or fsmonitor), and never sees the
user's own `.git` (git skips `.git` in a work tree; a nested repository is a gitlink, not
content). The project's `.gitignore` files apply, as they would to the user's repository;
its `.gitattributes` do not convert or filter anything (files are kept byte for byte).
A snapshot is `git add -A` then `git write-tree`: a tree id, kept alive by a ref per turn
(`refs/crow/<session>/<turn>/before|after`); automatic gc is off.

Workspaces over MAX_FILES files (not ignored) or MAX_BYTES bytes are not snapshotted, and
neither is anything when git is missing: `unavailable` says why.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio

MAX_FILES = 20_000
MAX_BYTES = 200 * 1024 * 1024
GIT_TIMEOUT = 120.0
GIT_MODES = (0o100644, 0o100755)  # regular files; not symlinks (120000) or gitlinks (160000)


class SnapshotError(Exception):
    """A git run failed; the message says how (`stderr`: all git said)."""

    def __init__(self, message: str, stderr: str = "") -> None:
        super().__init__(message)
        self.stderr = stderr


# git refuses a whole `git add` over one nested repository that has no commit yet
_NO_COMMIT = re.compile(r"^error: '(.+)/' does not have a commit checked out$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Change:
    """One path two trees hold differently: its mode and blob id in each (None: absent)."""

    path: str  # relative to the work tree
    before: tuple[int, str] | None
    after: tuple[int, str] | None


def git_dir_for(home: Path, workspace: Path) -> Path:
    digest = hashlib.sha256(os.fsencode(os.path.realpath(workspace))).hexdigest()[:24]
    return home / "checkpoints" / "git" / digest


class ShadowGit:
    def __init__(self, home: Path, workspace: Path) -> None:
        self.work_tree = Path(os.path.realpath(workspace))
        self.git_dir = git_dir_for(home, self.work_tree)
        self.home = home

    def _env(self) -> dict[str, str]:
        """The child's environment, built from nothing but PATH: no GIT_* of the user's
        leaks in, and crow's own environment is never changed."""
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_DIR": str(self.git_dir),
            "GIT_WORK_TREE": str(self.work_tree),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "HOME": str(self.git_dir),
            "GIT_AUTHOR_NAME": "crow",
            "GIT_AUTHOR_EMAIL": "crow@localhost",
            "GIT_COMMITTER_NAME": "crow",
            "GIT_COMMITTER_EMAIL": "crow@localhost",
            "LC_ALL": "C",
        }

    async def git(self, *args: str, stdin: bytes | None = None) -> bytes:
        with anyio.fail_after(GIT_TIMEOUT):
            done = await anyio.run_process(
                ["git", *args], input=stdin, env=self._env(), cwd=self.work_tree, check=False
            )
        if done.returncode != 0:
            said = done.stderr.decode("utf-8", "replace").strip()
            why = said.splitlines()
            raise SnapshotError(f"git {args[0]} failed: {why[-1] if why else done.returncode}", said)
        return done.stdout

    @staticmethod
    def missing() -> bool:
        return shutil.which("git") is None

    async def _init(self) -> None:
        if (self.git_dir / "HEAD").exists():
            return
        for folder in (self.home / "checkpoints", self.git_dir.parent):
            folder.mkdir(mode=0o700, exist_ok=True)
        await self.git("init", "--quiet", str(self.git_dir))
        os.chmod(self.git_dir, 0o700)
        for key, value in (("gc.auto", "0"), ("core.autocrlf", "false"), ("core.symlinks", "true")):
            await self.git("config", key, value)
        self._write_info()

    def _write_info(self) -> None:
        """Files are stored byte for byte, whatever the project's .gitattributes say (no
        line-ending conversion or filter: a restore must write back exactly what was there,
        and a filter would run a command the repository names); crow's home inside the
        workspace is never snapshotted (it holds every session)."""
        info = self.git_dir / "info"
        info.mkdir(exist_ok=True)
        (info / "attributes").write_text("* -text -filter -ident -working-tree-encoding\n")
        home = os.path.realpath(self.home)
        if home.startswith(str(self.work_tree) + os.sep):
            rel = os.path.relpath(home, self.work_tree)
            (info / "exclude").write_text(f"/{rel}/\n")

    async def unavailable(self) -> str | None:
        """Why the workspace cannot be snapshotted (git missing, too large), or None. Counts
        the files git would take (ignored ones left out) and stops at the limit."""
        if self.missing():
            return "git is not installed"
        async with self._exclusive():  # two first uses at once: one `git init`, one config
            await self._init()
        count = size = 0
        env = self._env()
        args = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
        async with await anyio.open_process(args, env=env, cwd=self.work_tree) as proc:
            assert proc.stdout is not None
            tail = b""
            async for chunk in proc.stdout:
                names = (tail + chunk).split(b"\0")
                tail = names.pop()
                for name in names:
                    count += 1
                    try:
                        st = os.lstat(os.path.join(self.work_tree, os.fsdecode(name)))
                    except OSError:
                        continue
                    size += st.st_size if stat.S_ISREG(st.st_mode) else 0
                if count > MAX_FILES or size > MAX_BYTES:
                    proc.kill()
                    break
        if count > MAX_FILES:
            return f"the workspace has more than {MAX_FILES:,} files"
        if size > MAX_BYTES:
            return f"the workspace holds more than {MAX_BYTES // (1024 * 1024)} MB"
        return None

    @contextlib.asynccontextmanager
    async def _exclusive(self) -> AsyncIterator[None]:
        """One snapshot or drop at a time in this git dir, across sessions and processes:
        two sessions share a workspace's git dir, git refuses a second `git add` while one
        holds its index.lock, and a drop must not remove the dir under a snapshot."""
        from crow.private import locked

        hold = locked(self.git_dir)  # a lock file beside the git dir: it outlives a drop
        with anyio.CancelScope(shield=True):  # taken, then released below, even on a cancel
            await anyio.to_thread.run_sync(hold.__enter__)
        try:
            yield
        finally:
            hold.__exit__(None, None, None)

    async def _add(self) -> None:
        """`git add` the work tree. A nested repository with no commit yet (a command's `git
        init` in a subfolder) makes git refuse the whole add, every time: it is excluded
        (a nested repository is never content, only a gitlink) and the add tried again."""
        for _ in range(3):
            try:
                await self.git("add", "--all", "--ignore-errors", ".")
                return
            except SnapshotError as exc:
                nested = _NO_COMMIT.findall(exc.stderr)
                if not nested:
                    raise
                with (self.git_dir / "info" / "exclude").open("a", encoding="utf-8") as f:
                    f.writelines(f"/{_literal(path)}/\n" for path in nested)
        await self.git("add", "--all", "--ignore-errors", ".")

    async def snapshot(self, ref: str) -> str:
        """The work tree now, as a tree id kept alive by `ref`."""
        async with self._exclusive():
            await self._init()
            # No other git runs here while crow's lock is held: an index.lock found is what
            # a git killed mid-snapshot left, and git would refuse every snapshot after it.
            (self.git_dir / "index.lock").unlink(missing_ok=True)
            await self._add()
            tree = (await self.git("write-tree")).decode().strip()
            await self.git("update-ref", ref, tree)
        return tree

    async def changes(self, before: str, after: str) -> list[Change]:
        out = await self.git("diff-tree", "-r", "-z", "--no-renames", before, after)
        fields = out.split(b"\0")
        found: list[Change] = []
        for meta, name in zip(fields[0::2], fields[1::2], strict=False):
            if not meta.startswith(b":"):
                continue
            old_mode, new_mode, old_id, new_id, _ = meta[1:].decode().split(" ")
            path = os.fsdecode(name)
            found.append(Change(path, _side(old_mode, old_id), _side(new_mode, new_id)))
        return found

    async def blobs(self, ids: list[str]) -> dict[str, bytes]:
        """The content of each blob id, in one `git cat-file --batch` run."""
        if not ids:
            return {}
        out = await self.git("cat-file", "--batch", stdin="".join(f"{i}\n" for i in ids).encode())
        found: dict[str, bytes] = {}
        at = 0
        for oid in ids:
            end = out.index(b"\n", at)
            header = out[at:end].split(b" ")
            at = end + 1
            if len(header) < 3:  # "<id> missing"
                continue
            length = int(header[2])
            found[oid] = out[at : at + length]
            at += length + 1
        return found

    async def keep(self, trees: dict[str, str]) -> None:
        """Point each ref at its tree (a fork's own refs to its source's snapshots)."""
        async with self._exclusive():
            if trees and (self.git_dir / "HEAD").exists():
                lines = "".join(f"update {ref} {tree}\n" for ref, tree in trees.items())
                await self.git("update-ref", "--stdin", stdin=lines.encode())

    async def drop(self, refs: list[str]) -> None:
        """Delete refs; the git dir goes when none is left."""
        if not (self.git_dir / "HEAD").exists():
            return
        async with self._exclusive():
            if not (self.git_dir / "HEAD").exists():
                return
            if refs:
                await self.git("update-ref", "--stdin", stdin="".join(f"delete {r}\n" for r in refs).encode())
            left = await self.git("for-each-ref", "--count=1", "refs/crow/")
            if not left.strip():
                shutil.rmtree(self.git_dir, ignore_errors=True)


def _side(mode: str, oid: str) -> tuple[int, str] | None:
    return None if int(mode, 8) == 0 else (int(mode, 8), oid)


def _literal(path: str) -> str:
    """`path` as a .gitignore pattern that matches just it (wildcards and specials escaped)."""
    return re.sub(r"([][*?!#\\ ])", r"\\\1", path)


def git_blob_id(data: bytes) -> str:
    """git's id of a blob holding `data` (what `git hash-object` says)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
