"""A real PostgreSQL server for the store tests: a throwaway cluster (Debian's PostgreSQL 15
binaries, `pg_config --bindir`) started once per test session on a private unix socket,
listening on no TCP port, with trust authentication for the `postgres` user.

`postgres_server()` runs `initdb` and `postgres` as the `postgres` user (Debian's package
makes it) when the tests run as root (PostgreSQL refuses root), as the current user otherwise. Each test gets a database
of its own (`Postgres.new_database()`, the `pg_url` fixture). `stop()`/`start()` take the
server down and bring it back on the same socket and data (the restart drills). When the
server cannot run here the tests skip with the reason, except under CROW_REQUIRE_POSTGRES=1
(CI), where that is a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REQUIRED = os.environ.get("CROW_REQUIRE_POSTGRES") == "1"


def unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"PostgreSQL is required here (CROW_REQUIRE_POSTGRES=1): {reason}")
    pytest.skip(f"no PostgreSQL server here: {reason}")


def _bindir() -> Path | None:
    """Where the server binaries are: `pg_config --bindir` (libpq-dev), else Debian's
    /usr/lib/postgresql/VERSION/bin (the `postgresql` package alone has no pg_config)."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, timeout=10)
        if (Path(out.stdout.strip()) / "postgres").is_file():
            return Path(out.stdout.strip())
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parts[-3]))
    return found[-1].parent if found else None


@dataclass
class Postgres:
    """A running cluster: `url(db)` connects over its unix socket as `postgres`."""

    bindir: Path
    data: Path
    sockdir: Path
    port: int
    user: str | None  # the cluster's owner when the tests run as root (PostgreSQL refuses root)
    log: Path
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@/{database}?host={self.sockdir}&port={self.port}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run `sql` with psql (autocommit); its output."""
        out = subprocess.run(
            [str(self.bindir / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
             "-h", str(self.sockdir), "-p", str(self.port), "-U", "postgres", "-d", database, "-c", sql],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"psql failed: {out.stderr.strip()}")
        return out.stdout

    def new_database(self) -> str:
        """A fresh empty database; its URL."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        self.psql(f"CREATE DATABASE {name}")
        return self.url(name)

    def start(self, timeout: float = 30) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        cmd = [str(self.bindir / "postgres"), "-D", str(self.data), "-k", str(self.sockdir),
               "-p", str(self.port), "-c", "listen_addresses=", "-c", "fsync=off",
               "-c", "max_connections=300"]  # fmt: skip
        log = open(self.log, "ab")  # the server keeps its own descriptor
        self._proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True, user=self.user)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"postgres exited {self._proc.returncode}: {self.log.read_text()[-2000:]}")
            ready = subprocess.run(
                [str(self.bindir / "pg_isready"), "-q", "-h", str(self.sockdir), "-p", str(self.port)],
                capture_output=True, timeout=10,
            )  # fmt: skip
            if ready.returncode == 0:
                return
            time.sleep(0.05)
        raise RuntimeError(f"postgres did not become ready: {self.log.read_text()[-2000:]}")

    def stop(self, mode: str = "fast") -> None:
        """Shut the server down ("fast": clients are disconnected; "immediate": as a crash)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal({"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}[mode])
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """The server and its backends stopped (SIGSTOP) for the block: a hung server, or one
        behind a cut network, that answers nothing and closes nothing. (Each backend leads
        its own process group, so they are found as the postmaster's children.)"""
        assert self._proc is not None
        family = [self._proc.pid, *_children(self._proc.pid)]
        for pid in family:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in family:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
    return found


@contextlib.contextmanager
def postgres_server() -> Iterator[Postgres]:
    """A throwaway cluster for this test session (skips, or fails under
    CROW_REQUIRE_POSTGRES=1, when it cannot run here)."""
    bindir = _bindir()
    if bindir is None:
        unavailable(
            "no postgres binary (pg_config --bindir, /usr/lib/postgresql/*/bin): apt-get install postgresql"
        )
    assert bindir is not None
    user = "postgres" if os.geteuid() == 0 else None
    root = Path(tempfile.mkdtemp(prefix="crow-pg-"))
    if user:
        os.chmod(root, 0o755)
        shutil.chown(root, user)
    data, sockdir = root / "data", root / "sock"
    for d in (data, sockdir):
        d.mkdir()
        if user:
            shutil.chown(d, user)
    init = subprocess.run(
        [str(bindir / "initdb"), "-A", "trust", "-U", "postgres", "-D", str(data), "--no-sync"],
        capture_output=True, text=True, timeout=120, user=user, cwd=root,
    )  # fmt: skip
    if init.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        unavailable(f"initdb failed: {init.stderr.strip()[-500:]}")
    log = root / "postgres.log"
    log.touch()
    if user:
        shutil.chown(log, user)
    server = Postgres(bindir, data, sockdir, 5432 + os.getpid() % 20000, user, log)
    try:
        server.start()
    except RuntimeError as exc:
        shutil.rmtree(root, ignore_errors=True)
        unavailable(str(exc))
    try:
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)
