"""The bubblewrap sandbox `execute` runs commands in.

What a sandboxed command gets:

- new PID, IPC and UTS namespaces (it sees and can signal only its own processes; the
  `/proc/$PPID/root` trick reaches the sandbox's own root), `--die-with-parent`, no
  capabilities, even as root;
- no controlling terminal (no TIOCSTI into the user's): `run_command` starts every command
  in a session of its own. Not bwrap's `--new-session`: that moves the sandbox's init out of
  the command's process group, and a cancel landing before bwrap set its parent-death
  signal then orphaned the whole sandbox;
- `/` read-only, the writable roots (the session's workspace) read-write, a private `/tmp`,
  a fresh `/proc` and a minimal `/dev`;
- hidden: `hidden` (crow's home, holding the session store) and the user's credential
  files and folders (`CREDENTIALS`, under `$HOME`), plus the per-user runtime folder (agent,
  keyring and D-Bus sockets) and the Docker socket: an empty tmpfs over a folder, `/dev/null`
  over a file. Only paths that exist are hidden; they are looked up at every command, so one
  created mid-session is hidden too;
- the network unless `network=False` (`--unshare-net`: only a private loopback, and an empty
  `/run` but for its symlinks, so the system daemons' Unix sockets there, such as D-Bus and
  the DNS resolver, are out of reach too).

Not confined: reads of everything else on the machine that the user can read; Unix sockets
outside `/run`, `/tmp` and the hidden folders; and, with the network on, abstract Unix
sockets, the sockets in `/run` and anything reachable over the network.

Mount order matters, as bwrap applies its options in order: a path is mounted before any path
below it, so a root under `/tmp` or inside a hidden folder stays visible and writable, and a
hidden folder inside a root stays hidden.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CREDENTIALS", "Sandbox", "find_bwrap", "probe"]

# Relative to $HOME. Folders are replaced by an empty tmpfs, files by /dev/null.
CREDENTIALS = (
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".config/gcloud",
    ".config/gh",
    ".config/hub",
    ".config/git/credentials",
    ".config/op",
    ".config/rclone",
    ".password-store",
    ".local/share/keyrings",
    ".terraform.d",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".gem/credentials",
    ".netrc",
    ".git-credentials",
    ".pypirc",
    ".npmrc",
    ".yarnrc.yml",
    ".pgpass",
    ".my.cnf",
    ".boto",
    ".s3cfg",
    ".vault-token",
    ".mozilla",
    ".config/google-chrome",
    ".config/chromium",
)
SOCKETS = ("/run/docker.sock", "/var/run/docker.sock")


def find_bwrap() -> str | None:
    return shutil.which("bwrap")


def probe(bwrap: str) -> str | None:
    """Why bubblewrap cannot sandbox here (e.g. user namespaces are disabled), or None."""
    argv = [bwrap, "--unshare-pid", "--die-with-parent", "--cap-drop", "ALL",
            "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{bwrap} cannot run: {exc}"
    if done.returncode != 0:
        return f"{bwrap} fails here: {done.stderr.decode(errors='replace').strip()[-300:]}"
    return None


def _real(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(path)


def _run_links() -> list[tuple[str, list[str]]]:
    """The symlinks directly in /run, made again in its empty replacement: they hold no
    socket, and on NixOS every program is reached through one (/run/current-system)."""
    links: list[tuple[str, list[str]]] = []
    try:
        with os.scandir("/run") as it:
            for entry in it:
                if entry.is_symlink():
                    links.append((entry.path, ["--symlink", os.readlink(entry.path), entry.path]))
    except OSError:
        pass
    return links


@dataclass(frozen=True)
class Sandbox:
    """bwrap options for one session: `argv(shell_argv, cwd)` wraps a command."""

    bwrap: str
    writable: tuple[str, ...]
    hidden: tuple[str, ...] = ()
    network: bool = True

    @classmethod
    def create(
        cls,
        writable: Sequence[str | os.PathLike[str]],
        *,
        hidden: Iterable[str | os.PathLike[str]] = (),
        network: bool = True,
        bwrap: str | None = None,
    ) -> Sandbox:
        """Raises FileNotFoundError when bubblewrap is not installed."""
        exe = bwrap or find_bwrap()
        if exe is None:
            raise FileNotFoundError("bubblewrap (bwrap) is not installed")
        if not writable:
            raise ValueError("a sandbox needs at least one writable root")
        return cls(exe, tuple(_real(p) for p in writable), tuple(_real(p) for p in hidden), network)

    def _hidden_now(self) -> list[tuple[str, bool]]:
        """(path, is_dir) of what exists now and must be hidden; never a writable root
        itself (the user chose to work there). A folder holding a root is hidden, and the
        root mounted back inside it (see `argv`)."""
        home = os.environ.get("HOME") or str(Path.home())
        candidates = [*self.hidden, *(os.path.join(home, c) for c in CREDENTIALS), *SOCKETS]
        candidates.append(f"/run/user/{os.getuid()}")
        if not self.network:  # the system daemons' sockets (D-Bus, the resolver, nscd): ways out
            candidates.append("/run")
        out: list[tuple[str, bool]] = []
        seen: set[str] = set()
        for path in candidates:
            if not os.path.lexists(path):  # most do not exist: one lstat, not a realpath
                continue
            real = _real(path)
            if real in seen or not os.path.lexists(real):
                continue
            seen.add(real)
            if real in self.writable:
                continue
            out.append((real, os.path.isdir(real)))
        return out

    def argv(self, command: Sequence[str], cwd: str | os.PathLike[str]) -> list[str]:
        # /dev and /proc sort after a root at "/" (whose writable bind would cover them with the
        # host's /proc, every process of the user in it) and before a root inside them.
        mounts: list[tuple[str, list[str]]] = [
            ("/dev", ["--dev", "/dev"]),
            ("/proc", ["--proc", "/proc"]),
            ("/tmp", ["--tmpfs", "/tmp"]),
        ]
        for root in self.writable:
            # One removed since (bwrap would refuse to start) or replaced by a symlink (the
            # bind would make where it leads writable) is left out.
            if os.path.isdir(root) and _real(root) == root:
                mounts.append((root, ["--bind", root, root]))
        for path, is_dir in self._hidden_now():
            mounts.append((path, ["--tmpfs", path] if is_dir else ["--ro-bind", "/dev/null", path]))
            if path == "/run":
                mounts += _run_links()
        # Parents before children (stable: /dev, /proc, /tmp first among equals).
        mounts.sort(key=lambda m: len(Path(m[0]).parts))
        argv = [
            self.bwrap,
            "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--die-with-parent",
            "--cap-drop", "ALL",
            "--ro-bind", "/", "/",
        ]  # fmt: skip
        for _, options in mounts:
            argv += options
        if not self.network:
            argv.append("--unshare-net")
        argv += ["--chdir", str(cwd), *command]
        return argv
