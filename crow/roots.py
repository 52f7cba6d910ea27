"""A session's other workspace roots (ACP `additionalDirectories`): checked, stored, named.

`cwd` stays the session's base (relative paths start there); the other roots are absolute
folders the file tools and the sandbox cover too (builtin_hooks/filesystem). A client's list
is checked whole before anything is created or stored (`checked_directories`). On
`session/load`, `resume` and `fork` the list the client sends is the session's roots for
that activation, and is stored as its roots (`reroot`); crow's own restores (`crow.compact`,
`crow sessions compact`) keep the stored ones.
"""

from __future__ import annotations

import functools
import os
import posixpath
import stat
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from crow.errors import RootsError
from crow.messages import valid_text
from crow.session import Session

if TYPE_CHECKING:
    from crow.config import Config


def checked_directories(dirs: Sequence[object]) -> list[str]:
    """The roots as a client gives them: each an absolute path to an existing folder (else
    `RootsError` naming the entry), normalised; a folder given twice (by any spelling) is
    kept once, the first time. One stat per entry: `session/new` waits for this."""
    kept: list[str] = []
    seen: set[tuple[int, int]] = set()
    for i, path in enumerate(dirs):
        entry = f"additionalDirectories[{i}]"
        if not isinstance(path, str) or not path:
            raise RootsError(f"{entry} must be a non-empty string, got {path!r}")
        if "\x00" in path or valid_text(path) != path:
            raise RootsError(f"{entry} must be valid Unicode without NUL, got {path!r}")
        if not os.path.isabs(path):
            raise RootsError(f"{entry} must be an absolute path, got {path!r}")
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            raise RootsError(f"{entry} does not exist: {path!r}") from None
        except OSError as exc:  # permission denied, a symlink loop, a name too long
            raise RootsError(f"{entry} cannot be used: {path!r} ({exc.strerror})") from None
        if not stat.S_ISDIR(st.st_mode):
            raise RootsError(f"{entry} is not a directory: {path!r}")
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            kept.append(_spelled(path, st))
    return kept


def _spelled(path: str, st: os.stat_result) -> str:
    """`path` normalised, still naming the folder `st` is: past a symlink, `..` climbs from
    where the link leads, which a lexical normpath does not know (then the real path)."""
    norm = os.path.normpath(path)
    if ".." in path.split("/") and _identity(norm) != (st.st_dev, st.st_ino):
        return os.path.realpath(path)
    return norm


def beside(cwd: Path, dirs: Sequence[str]) -> list[str]:
    """`dirs` without the folder `cwd` is (a root already)."""
    if not dirs:
        return []
    here = _identity(cwd)
    return [d for d in dirs if here is None or _identity(d) != here]


def _identity(path: str | Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


async def reroot(session: Session, roots: list[str] | None) -> bool:
    """Make `roots` (checked; None: keep them) the session's other roots, stored. True when
    they changed."""
    if roots is None or (roots := beside(session.cwd, roots)) == session.additional_directories:
        return False
    await session.save(additional_directories=roots)
    return True


def system_prompt(template: str, session: Session) -> str:
    """The system prompt for `session`: `{cwd}` filled in, and its other roots named. With
    `backend: {type: docker}` the tools and commands act in the container, where the paths
    on this machine do not exist: the model is given the container's (workdir, /mnt/NAME)."""
    pairs = container_roots(session)
    if pairs is None:
        cwd, others = str(session.cwd), list(session.additional_directories)
    else:
        cwd, others = str(pairs[0][1]), [str(inside) for _host, inside in pairs[1:]]
    text = template.replace("{cwd}", cwd)
    if others:
        text += f"\n\nThe workspace has more roots, reached by absolute path: {', '.join(others)}"
    return text


def container_roots(session: Session) -> list[tuple[Path, PurePosixPath]] | None:
    """With `backend: {type: docker}`, each root on this machine and where the session's
    container has it (the pairing the container backend makes: builtin_hooks/filesystem
    leaves out another root that is no longer a folder); None with the local backend."""
    config = session.config
    if config is None or config.backend.type != "docker":
        return None
    from mcp_servers.filesystem.container.spec import root_pairs

    roots = session.roots
    return root_pairs([roots[0], *(r for r in roots[1:] if r.is_dir())], config.backend.workdir)


def host_path(session: Session, path: Any) -> Any:
    """A path the model gave, as on this machine: in a docker session an absolute path in
    the container's workdir or /mnt/NAME becomes the root's path here, so that permission
    rules (`edit_file(src/**)`) and the editor (locations, previews) see the same file
    whichever way the model wrote it. Anything else is returned as it is."""
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        return path
    pairs = container_roots(session)
    if not pairs:
        return path
    place = PurePosixPath(posixpath.normpath(path))
    for host, inside in sorted(pairs, key=lambda pair: -len(pair[1].parts)):  # the deepest first
        if place.is_relative_to(inside):
            return str(host.joinpath(*place.relative_to(inside).parts))
    return path


class EditorCwd(type(Path())):  # type: ignore[misc]
    """A session's cwd as the ACP view takes it, carrying `host_path` for the paths the
    model gives in a docker session (crow.acp.view.absolute)."""

    host_path: Any = None


def on_this_machine(path: str, cwd: str | os.PathLike[str]) -> str:
    """`path` as the model gave it, as a path on this machine: a relative one taken from
    `cwd`, a container's one mapped when `cwd` is an `editor_cwd` that maps them."""
    mapped = getattr(cwd, "host_path", None)
    if mapped is not None:
        path = mapped(path)
    return os.path.normpath(os.path.join(cwd, path))


def editor_cwd(session: Session) -> Path:
    """What the front ends show paths against (ACP updates, permission questions): the
    session's cwd, mapping a docker session's container paths (`on_this_machine`)."""
    if container_roots(session) is None:
        return session.cwd
    cwd = EditorCwd(session.cwd)
    cwd.host_path = functools.partial(host_path, session)
    return cwd


def sandbox_hidden(config: Config) -> list[Path | str]:
    """Out of the model's reach, for the sandbox and the file tools alike: crow's home (every
    session, trust.json, the user's config and stored credentials), the user's config file
    wherever `--config` put it (it may hold keys), and a trace file (the transcript). (The
    sandbox adds the user's credential folders itself: see `file_tools_hidden`.)"""
    return [config.home, *(p for p in (config.source, config.trace) if p)]


def file_tools_hidden(config: Config) -> list[Path | str]:
    """`sandbox_hidden`, and the credential files the sandbox hides (~/.ssh, ~/.aws,
    ~/.netrc...): read_file and grep ask no question. All of them, as the sandbox does: a
    root holding the home folder, lying in it (~/.config holds gh's token) or holding where
    a credential symlink leads. `Workspace` keeps those inside a root (a few lstats, off the
    request path). What the file tools and the checkpoints of their writes resolve with."""
    from mcp_servers.filesystem.sandbox import CREDENTIALS

    home = os.environ.get("HOME") or str(Path.home())
    return [*sandbox_hidden(config), *(os.path.join(home, c) for c in CREDENTIALS)]
