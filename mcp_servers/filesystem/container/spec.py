"""What one session's container is made from: where each workspace root appears inside it,
and the Docker create body (image, PID 1, labels, limits, mounts). Pure: no engine here.

PID 1 is a tiny Python reaper: commands the model starts in the background outlive the
shell that started them and are re-parented to PID 1, which must reap them (else zombies
pile up) and must stop at SIGTERM (a PID 1 without a handler ignores it). Waiting
in `signal.pause()` costs nothing.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crow.config import BackendConfig

REAPER = """\
import os, signal, sys
def reap(*_):
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
signal.signal(signal.SIGCHLD, reap)
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
signal.signal(signal.SIGINT, lambda *_: os._exit(0))
reap()
while True:
    signal.pause()
"""

Pair = tuple[Path, PurePosixPath]  # a root on this machine and where it is in the container


def root_pairs(roots: Sequence[Path], workdir: str) -> list[Pair]:
    """The main root at `workdir`, each other root at /mnt/<its name> (`-2`, `-3`… when two
    share a name): the paths the model sees in the container."""
    pairs: list[Pair] = [(roots[0], PurePosixPath(workdir))]
    taken = {workdir}
    for root in roots[1:]:
        name = root.name or "root"
        target, n = f"/mnt/{name}", 1
        while target in taken:
            n += 1
            target = f"/mnt/{name}-{n}"
        taken.add(target)
        pairs.append((root, PurePosixPath(target)))
    return pairs


def masks(
    pairs: Sequence[Pair], hidden: Iterable[str | os.PathLike[str]], podman: bool = False
) -> tuple[list[str], dict[str, str]]:
    """What covers the hidden paths (crow's home, credential folders) lying inside a mounted
    root, as the sandbox does locally: binds of /dev/null over files, tmpfs over folders.
    Podman copies into a tmpfs what lay beneath it (`tmpcopyup`, its default): the mask
    would hold the very files it hides. Docker does not, and refuses the option."""
    copyup = ",notmpcopyup" if podman else ""
    binds: list[str] = []
    tmpfs: dict[str, str] = {}
    for item in hidden:
        real = Path(os.path.realpath(item))
        for host, inside in pairs:
            if real == host or not real.is_relative_to(host) or not real.exists():
                continue  # a root inside a hidden folder is where the user chose to work
            target = str(inside / real.relative_to(host).as_posix())
            if real.is_dir():
                tmpfs[target] = "ro,size=4k" + copyup
            else:
                binds.append(f"/dev/null:{target}:ro")
    return binds, tmpfs


def create_body(
    config: BackendConfig,
    labels: Mapping[str, str],
    pairs: Sequence[Pair],
    *,
    mount: bool,
    hidden: Iterable[str | os.PathLike[str]] = (),
    podman: bool = False,
) -> dict[str, Any]:
    """The Docker `containers/create` body. `Env` is `backend.env` only: crow's own
    environment (API keys) never enters the container. The hidden paths are masked under
    `backend.mounts` too (a trusted project's mounts may bring in the home folder), and a
    mount of a hidden path itself is left out: it would hand over what the mask covers."""
    hidden = [Path(os.path.realpath(h)) for h in hidden]
    binds, mounted = [], []
    for spec in config.mounts:
        host, inside = spec.split(":")[:2]
        real = Path(os.path.realpath(host))
        if not any(real.is_relative_to(h) for h in hidden):
            binds.append(spec)
            mounted.append((real, PurePosixPath(inside)))
    host_config: dict[str, Any] = {}
    if mount:
        binds += [f"{host}:{inside}" for host, inside in pairs]
        mounted += pairs
    more, tmpfs = masks(mounted, hidden, podman)
    binds += more
    if tmpfs:
        host_config["Tmpfs"] = tmpfs
    host_config["Binds"] = binds
    if not config.network:
        host_config["NetworkMode"] = "none"
    if config.cpus is not None:
        host_config["NanoCpus"] = int(config.cpus * 1e9)
    if config.memory is not None:
        host_config["Memory"] = config.memory
    body: dict[str, Any] = {
        "Image": config.image,
        "Cmd": ["python3", "-c", REAPER],
        "Entrypoint": [],  # the image's own entrypoint would wrap (or replace) the reaper
        "Labels": dict(labels),
        "WorkingDir": config.workdir,
        "Env": [f"{k}={v}" for k, v in config.env.items()],
        "HostConfig": host_config,
        "AttachStdin": False,
        "AttachStdout": False,
        "AttachStderr": False,
        "Tty": False,
    }
    if config.user:
        body["User"] = config.user
    return body


def container_path(pairs: Sequence[Pair], path: str) -> str:
    """`path` in the container's namespace, for a message: a host root's path mapped."""
    for host, inside in pairs:
        if path == str(host) or path.startswith(str(host) + os.sep):
            return posixpath.join(str(inside), os.path.relpath(path, host))
    return path
