"""A real container engine for the container-backend tests: Podman serving the Docker Engine
API on a private unix socket, and a small Debian image with Python built locally (no image
registry is reachable here).

`podman_engine()` starts `podman system service` once per test session (runc and a
containers.conf with ulimits this machine allows: see shared/REFERENCE.md) and makes sure
the test image exists: imported from a cached tarball, else built with debootstrap (about
a minute) and cached under ~/.cache/crow-test-images. When the engine cannot run here the
tests skip with the reason, except under CROW_REQUIRE_CONTAINERS=1 (CI), where that is a
failure: a CI that skipped them would prove nothing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.locking import file_lock

IMAGE = "localhost/crow-test:bookworm"
NO_PYTHON_IMAGE = "localhost/crow-test-nopython:bookworm"
CACHE = Path(os.environ.get("CROW_TEST_IMAGE_CACHE", "~/.cache/crow-test-images")).expanduser()
TARBALL = CACHE / "bookworm-python3-minimal.tar"
CONTAINERS_CONF = """\
[engine]
runtime = "runc"
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
"""
LABEL = "crow.test"  # every container a test creates carries it (`Engine.labels`)


@dataclass(frozen=True)
class Engine:
    socket: Path
    docker_host: str  # unix://SOCKET
    image: str
    no_python_image: str
    env: dict[str, str]  # what `podman` CLI calls need (CONTAINERS_CONF)
    token: str = ""  # this test session's value of the crow.test label

    @property
    def labels(self) -> dict[str, str]:
        """Labels for a container a test creates: removed at the end of this test session
        (only this session's: other test runs may share the engine's storage)."""
        return {LABEL: self.token}

    def podman(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """The podman CLI on the same storage as the service (for checks a test makes)."""
        return subprocess.run(
            ["podman", *args], env={**os.environ, **self.env}, capture_output=True, text=True,
            check=check, timeout=timeout,
        )  # fmt: skip

    def containers(self, *filters: str) -> list[str]:
        """Ids of containers (running or not) matching `label=...` filters."""
        args = ["ps", "-a", "-q", "--no-trunc"] + [f"--filter={f}" for f in filters]
        return self.podman(*args).stdout.split()


def _unavailable(why: str) -> None:
    if os.environ.get("CROW_REQUIRE_CONTAINERS") == "1":
        pytest.fail(f"the container engine is required here (CROW_REQUIRE_CONTAINERS=1) but {why}")
    pytest.skip(f"no container engine: {why}")


def _run(argv: list[str], env: dict[str, str], timeout: float, stdin: bytes | None = None) -> str | None:
    """None when it worked, else why not (its last lines of output)."""
    try:
        done = subprocess.run(
            argv, env={**os.environ, **env}, input=stdin, capture_output=True, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{argv[0]} {argv[1]}: {exc}"
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()[-3:]
        return f"{' '.join(argv[:3])} failed: {' / '.join(tail)}"
    return None


def _ensure_image(env: dict[str, str]) -> str | None:
    """The test image in podman's storage (and a copy without Python); None, or why not."""
    if _run(["podman", "image", "exists", IMAGE], env, 30) is None:
        if _run(["podman", "image", "exists", NO_PYTHON_IMAGE], env, 30) is not None:
            return _no_python_image(env)
        return None
    if not TARBALL.is_file():
        if shutil.which("debootstrap") is None:
            return "debootstrap is not installed (apt-get install debootstrap) to build the test image"
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            root = Path(tmp) / "root"
            why = _run(
                ["debootstrap", "--variant=minbase", "--include=python3-minimal", "bookworm", str(root)],
                {},
                600,
            )
            if why is not None:
                return why
            partial = TARBALL.with_suffix(".part")
            why = _run(["tar", "-C", str(root), "-cf", str(partial), "."], {}, 300)
            if why is not None:
                return why
            partial.replace(TARBALL)
    why = _run(["podman", "import", str(TARBALL), IMAGE], env, 300)
    return why or _no_python_image(env)


def _no_python_image(env: dict[str, str]) -> str | None:
    """The same image with python3 removed: what a user's image without Python looks like."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "Containerfile").write_text(
            f"FROM {IMAGE}\nRUN rm -f /usr/bin/python3 /usr/bin/python3.*\n", encoding="utf-8"
        )
        return _run(["podman", "build", "-q", "-t", NO_PYTHON_IMAGE, tmp], env, 300)


def _ping(path: Path) -> bool:
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
        s.settimeout(2)
        s.connect(str(path))
        s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
        return s.recv(64).startswith(b"HTTP/1.")
    return False


@contextlib.contextmanager
def podman_service(base: Path) -> Iterator[Engine]:
    """Podman serving the Docker API on `base`/podman.sock until the block ends; skips (or
    fails, under CROW_REQUIRE_CONTAINERS=1) when it cannot."""
    for tool in ("podman", "runc"):
        if shutil.which(tool) is None:
            _unavailable(f"{tool} is not installed (apt-get install podman runc)")
    conf = base / "containers.conf"
    conf.write_text(CONTAINERS_CONF, encoding="utf-8")
    env = {"CONTAINERS_CONF": str(conf)}
    with file_lock(CACHE / "image.lock"):  # one test session at a time builds or imports it
        why = _ensure_image(env)
    if why is not None:
        _unavailable(why)
    sock = base / "podman.sock"
    log = open(base / "service.log", "wb")
    engine: Engine | None = None
    proc = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{sock}"],
        env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not _ping(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                tail = (base / "service.log").read_text(errors="replace")[-400:]
                _unavailable(f"podman system service did not start: {tail}")
            time.sleep(0.05)
        engine = Engine(
            sock, f"unix://{sock}", IMAGE, NO_PYTHON_IMAGE, env, f"{os.getpid()}-{time.time_ns()}"
        )
        why = _run(
            ["podman", "run", "--rm", f"--label={LABEL}={engine.token}", IMAGE, "python3", "-c", "0"], env, 60
        )
        if why is not None:
            _unavailable(f"a container cannot run here: {why}")
        yield engine
    finally:
        for cid in _leftovers(env, engine.token) if engine is not None else ():
            _run(["podman", "rm", "-f", "-t", "0", cid], env, 60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _leftovers(env: dict[str, str], token: str) -> list[str]:
    """This session's test containers, and crow's whose owner process has ended (crow.pid on
    this machine): never another live test run's or crow's, nor another machine's (a test's
    decoy names one: removing it failed that test in a run in parallel)."""
    fmt = '{{.ID}}|{{index .Labels "crow.host"}}|{{index .Labels "crow.pid"}}'
    ids: list[str] = []
    for label in (f"{LABEL}={token}", "crow.session"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                ["podman", "ps", "-a", f"--filter=label={label}", f"--format={fmt}"],
                env={**os.environ, **env}, capture_output=True, text=True, timeout=30,
            ).stdout  # fmt: skip
            for line in out.splitlines():
                cid, host, pid = [*line.split("|"), "", ""][:3]
                pid = pid.strip()
                if label != "crow.session":
                    ids.append(cid)
                elif host.strip() == socket.gethostname() and not (
                    pid.isdigit() and Path(f"/proc/{pid}").exists()
                ):
                    ids.append(cid)
    return ids
