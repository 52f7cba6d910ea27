"""Project trust: a repository's crow.yaml applies only where the user said so.

Trust lives in the user's space, `$CROW_HOME/trust.json` (0600, written atomically), as a
map from a project folder (the resolved folder holding crow.yaml) to the SHA-256 of the
crow.yaml the user trusted. A changed file (edited by hand, by a `git pull`, or by the
model) is no longer trusted and is asked about again: nothing written inside a workspace
can grant itself trust. Trust is never honoured when trust.json itself lies inside the
project folder (CROW_HOME pointed into a repository).

`ProjectConfigs.for_cwd(cwd)` is what a new session calls: the nearest crow.yaml, whether
it is trusted, and the configuration in force (the user's, with the project merged over it
when trusted). Files and composed configs are cached by the file's stat signature, so a
session/new in a known project costs a few `stat` calls.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crow.config import Config, read_yaml
from crow.errors import ConfigError
from crow.events import Emit, Notice
from crow.private import locked, write_private
from crow.project_config import compose, find_project_file

if TYPE_CHECKING:
    from crow.session import Session

log = logging.getLogger("crow.trust")

TRUST_FILE = "trust.json"
PROJECT = "crow.project"  # session.state: the SessionProject found at creation, until settled
CONFIG_ERROR = "crow.config_error"  # session.state: a trusted project file that cannot apply
# The trust question's answers, as permission option kinds (what editors know how to show).
TRUST_OPTIONS = [
    ("allow_once", "Apply for this session"),
    ("allow_always", "Trust this folder"),
    ("reject_once", "Ignore it"),
]


class ProjectFile:
    """A crow.yaml as read once: its bytes' digest now, its YAML parsed only when needed
    (the trusted path takes the parsed form stored with the trust: no YAML import on the
    way to a session/new answer)."""

    def __init__(self, path: Path, raw: bytes | None, problem: str | None = None) -> None:
        self.path = path  # in its resolved folder; the name itself may be a symlink
        self.raw = raw
        self.digest = hashlib.sha256(raw).hexdigest() if raw is not None else ""
        self._problem = problem
        self._data: Mapping[str, Any] | None = None

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def data(self) -> Mapping[str, Any]:
        """The parsed file ({} when it cannot be used: see `problem`)."""
        if self._data is None:
            self._data = {}
            if self.raw is not None:
                try:
                    self._data = read_yaml(self.path, self.raw)  # the bytes hashed
                except ConfigError as exc:
                    self._problem = str(exc)
        return self._data

    @property
    def problem(self) -> str | None:
        """Why it cannot be used (unreadable, not YAML, not a mapping), or None."""
        _ = self.data
        return self._problem


@dataclass(frozen=True, slots=True)
class SessionProject:
    """What applies to a session's cwd."""

    config: Config  # in force now: the user's, or the user's with the trusted project merged
    file: ProjectFile | None = None  # the nearest crow.yaml, trusted or not
    trusted: bool = False
    error: str | None = None  # the project file could not be read or composed


MAX_PROJECT_BYTES = 1 << 20  # a crow.yaml is a few hundred bytes; a repository's may be hostile


def read_project(path: Path) -> ProjectFile:
    """Never raises: an untrusted file that is broken is ignored like any untrusted file.
    The file belongs to the folder it was found in, not to where a symlink points: trust is
    keyed by that folder, so a repository's crow.yaml linking to a trusted project's file
    does not borrow that project's trust."""
    path = path.parent.resolve() / path.name
    try:
        # Non-blocking: a FIFO swapped in for the file must not hang the session/new.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return ProjectFile(path, None, f"cannot read {path}: not a regular file")
            raw = f.read(MAX_PROJECT_BYTES + 1)
    except OSError as exc:
        return ProjectFile(path, None, f"cannot read {path}: {exc}")
    if len(raw) > MAX_PROJECT_BYTES:
        return ProjectFile(path, None, f"cannot read {path}: too large (over {MAX_PROJECT_BYTES:,} bytes)")
    return ProjectFile(path, raw)


class TrustStore:
    """`$CROW_HOME/trust.json`; re-read when it changes on disk (`crow trust` from a shell
    while an editor's crow runs)."""

    def __init__(self, home: Path) -> None:
        self.path = home / TRUST_FILE
        self._entries: dict[str, dict[str, Any]] = {}
        self._seen: tuple[int, int, int] | None = None
        self._real: Path | None = None

    def _resolved(self) -> Path:
        # Once: each path component is a syscall, and each syscall hands the GIL to the
        # warm-up thread while a session/new waits.
        if self._real is None:
            self._real = self.path.resolve()
        return self._real

    def entries(self) -> dict[str, dict[str, Any]]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._entries, self._seen = {}, None
            return {}
        signature = (st.st_mtime_ns, st.st_size, st.st_ino)  # each write is a new inode
        if signature != self._seen:
            self._entries = self._read()
            self._seen = signature
        return self._entries

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read {self.path}: {exc}; fix or remove it") from exc
        if not isinstance(data, dict) or not isinstance(data.get("folders", {}), dict):
            raise ConfigError(f"{self.path}: not a crow trust file; fix or remove it")
        return {k: v for k, v in data.get("folders", {}).items() if isinstance(v, dict)}

    def is_trusted(self, project: ProjectFile) -> bool:
        return self._entry(project) is not None

    def _entry(self, project: ProjectFile) -> dict[str, Any] | None:
        if not project.digest:
            return None
        if self._resolved().is_relative_to(project.folder):
            log.warning("%s is inside %s: trust is not honoured there", self.path, project.folder)
            return None
        try:
            entry = self.entries().get(str(project.folder))
        except ConfigError as exc:
            log.warning("%s", exc)
            return None
        return entry if entry is not None and entry.get("sha256") == project.digest else None

    def lookup(self, project: ProjectFile) -> tuple[bool, Mapping[str, Any] | None]:
        """(trusted, the parsed form stored with the trust, if any)."""
        entry = self._entry(project)
        data = entry.get("data") if entry is not None else None
        return entry is not None, data if isinstance(data, dict) else None

    def changed(self, project: ProjectFile) -> bool:
        """The folder was trusted with other content (the file changed since)."""
        try:
            entry = self.entries().get(str(project.folder))
        except ConfigError:
            return False
        return entry is not None and entry.get("sha256") != project.digest

    def trust(self, project: ProjectFile) -> None:
        record: dict[str, Any] = {"sha256": project.digest, "file": project.path.name, "at": int(time.time())}
        try:  # the parsed form, so that a session/new need not import a YAML parser
            record["data"] = json.loads(json.dumps(project.data))
        except (TypeError, ValueError):
            pass  # YAML-only values (dates...): parsed again when used

        def change(entries: dict[str, dict[str, Any]]) -> bool:
            entries[str(project.folder)] = record
            return True

        self._update(change)

    def untrust(self, folder: Path) -> bool:
        key = str(folder.resolve())
        return self._update(lambda entries: entries.pop(key, None) is not None)

    def _update(self, change: Callable[[dict[str, dict[str, Any]]], bool]) -> bool:
        """Read, change and write under a lock: two `crow trust` at once both land."""
        with locked(self.path):
            self._seen = None  # re-read: another process may have written meanwhile
            entries = dict(self.entries())
            changed = change(entries)
            if changed:
                text = json.dumps({"version": 1, "folders": entries}, indent=2, sort_keys=True)
                write_private(self.path, text + "\n")
                self._entries, self._seen = entries, None
            return changed


class ProjectConfigs:
    """Per-session configuration for one user config, cached per project file."""

    def __init__(self, user: Config) -> None:
        self.user = user
        self.trust = TrustStore(user.home)
        self._files: dict[Path, tuple[tuple[int, int, int], ProjectFile]] = {}
        self._composed: dict[tuple[Path, str], Config] = {}
        # Files the user said "ignore" to in this process: later sessions are told, not asked.
        self.declined: set[tuple[Path, str]] = set()

    def for_cwd(self, cwd: Path) -> SessionProject:
        found = find_project_file(cwd)
        if found is None:
            return SessionProject(self.user)
        project = self._read(found)
        trusted, data = self.trust.lookup(project)
        if not trusted:
            return SessionProject(self.user, project)
        try:
            return SessionProject(self.apply(project, data), project, trusted=True)
        except ConfigError as exc:
            return SessionProject(self.user, project, trusted=True, error=str(exc))

    def _read(self, path: Path) -> ProjectFile:
        try:
            st = os.stat(path)
        except OSError:
            return read_project(path)  # vanished meanwhile: says why
        signature = (st.st_mtime_ns, st.st_size, st.st_ino)
        cached = self._files.get(path)
        if cached is not None and cached[0] == signature:
            return cached[1]
        project = read_project(path)
        self._files[path] = (signature, project)
        return project

    def apply(self, project: ProjectFile, data: Mapping[str, Any] | None = None) -> Config:
        """The user's config with `project` (or its stored parse, `data`) merged over it
        (raises ConfigError)."""
        key = (project.path, project.digest)
        config = self._composed.get(key)
        if config is None:
            if data is None and project.problem:
                raise ConfigError(project.problem)
            data = project.data if data is None else data
            config = self._composed[key] = compose(self.user, data, project.path)
        return config


def describe(data: Mapping[str, Any], limit: int = 8) -> str:
    """What a project file would change, for the trust question: "sets mode: yolo, adds 2
    command hooks, sets providers.openai.base_url: http://…". Values and names from the file
    are shown only when they are short tokens: the question must not carry the file's own
    prose. What weakens the user's safety (mode, sandbox, network, model, hooks, rules,
    environment, providers) is always shown; only other keys are cut after `limit` parts,
    so a file cannot push `mode: yolo` out of sight behind harmless keys."""
    parts: list[str] = []
    others: list[str] = []
    for key, value in data.items():
        key = _token(key)
        if key in ("mode", "model", "sandbox", "network") and not isinstance(value, Mapping | list):
            parts.append(f"sets {key}: {_token(value)}")
        elif key == "hooks" and isinstance(value, Mapping):
            for sub, inner in value.items():
                if sub == "commands" and isinstance(inner, list):
                    parts.append(f"adds {len(inner)} command hook{'s' if len(inner) != 1 else ''}")
                else:
                    parts.append(f"sets hooks.{_token(sub)}")
        elif key == "permissions" and isinstance(value, Mapping):
            verbs = {"allow": "allows", "ask": "asks for", "deny": "denies"}
            for sub, rules in value.items():
                shown = ", ".join(map(_token, rules)) if isinstance(rules, list) else _token(rules)
                parts.append(f"{verbs.get(str(sub), 'sets permissions.' + _token(sub))} {shown}")
        elif key == "backend" and isinstance(value, Mapping) and value:
            # What reaches into this machine (mounts), runs as whom (user) and with which
            # variables (env) is shown, not only named: `mounts: ["/:/host"]` is the host.
            for sub, inner in value.items():
                if sub == "mounts" and isinstance(inner, list):
                    parts.append(f"sets backend.mounts: {', '.join(map(_token, inner)) or '(none)'}")
                elif sub == "env" and isinstance(inner, Mapping) and inner:
                    parts.extend(f"sets backend.env.{_token(name)}" for name in inner)
                else:
                    known = ("type", "image", "network", "sync", "user", "workdir")
                    shown = f": {_token(inner)}" if sub in known else ""
                    parts.append(f"sets backend.{_token(sub)}{shown}")
        elif key == "environment" and isinstance(value, Mapping) and value:
            parts.extend(f"sets environment.{_token(sub)}" for sub in value)
        elif isinstance(value, Mapping) and key == "providers":
            for name, entry in value.items():
                fields = [f for f in entry] if isinstance(entry, Mapping) and entry else [""]
                for f in fields:
                    shown = f": {_token(entry[f])}" if f in ("base_url", "api_key_env") else ""
                    parts.append(f"sets providers.{_token(name)}{'.' + _token(f) if f else ''}{shown}")
        elif key in _NEVER_CUT:
            parts.append(f"sets {key}")  # not the expected shape: the schema check refuses it
        else:
            others.append(f"sets {key}")
    if not parts and not others:
        return "changes nothing"
    room = max(limit - len(parts), 0)
    if len(others) > room:
        others = [*others[:room], f"and {len(others) - room} more"]
    return ", ".join([*parts, *others])


_NEVER_CUT = (
    "mode", "model", "sandbox", "network", "hooks", "permissions", "environment", "providers", "backend"
)  # fmt: skip
_TOKEN = re.compile(r"[\w.:/@+*\-]{1,60}(\([^()\n]{0,40}\))?")  # a name, or a rule TOOL(PATTERN)


def _token(value: Any) -> str:
    text = str(value)
    return text if _TOKEN.fullmatch(text) else "(…)"


def untrusted_notice(project: ProjectFile, changed: bool = False) -> str:
    what = f"it {describe(project.data)}" if not project.problem else project.problem
    status = "changed since you trusted it" if changed else "is not trusted"
    return (
        f"This project's {project.path} {status}, so crow ignored it ({what}). "
        f"Run `crow trust {project.folder}` to apply it."
    )


async def settle(
    projects: ProjectConfigs, session: Session, emit: Emit, ready: Callable[[Session], Awaitable[None]]
) -> bool:
    """Once per session, before its first turn: ask about an untrusted crow.yaml when the
    front end can ask (`session.client`), else tell the user it was ignored.
    Returns True when the session's config (and maybe its mode or model) changed."""
    project: SessionProject | None = session.state.get(PROJECT)
    if project is None:
        return False
    answer = await _ask(projects, project, session)  # cancelled: asked again next prompt
    session.state.pop(PROJECT, None)
    if project.error:
        session.state[CONFIG_ERROR] = project.error
        return False
    file = project.file
    if file is None or project.trusted:
        return False
    if answer not in ("allow_once", "allow_always"):
        if answer is not None:
            projects.declined.add((file.path, file.digest))
        log.warning("ignored untrusted %s (run `crow trust %s` to apply it)", file.path, file.folder)
        text = untrusted_notice(file, projects.trust.changed(file))
        await emit(Notice(text, "warning", "Project configuration ignored"))
        return False
    try:
        config = projects.apply(file)
    except ConfigError as exc:
        session.state[CONFIG_ERROR] = str(exc)
        return False
    if answer == "allow_always":
        try:
            projects.trust.trust(file)
            log.info("trusted %s (sha256 %s)", file.path, file.digest[:12])
        except (ConfigError, OSError) as exc:
            text = f"Applied {file.path} for this session, but could not remember it: {exc}"
            await emit(Notice(text, "warning"))
    before = session.config or projects.user
    session.config = config
    changes: dict[str, Any] = {}
    if session.mode == before.mode and config.mode != session.mode:
        changes["mode"] = config.mode
    if session.model == (before.model or "") and (config.model or "") != session.model:
        changes["model"] = config.model or ""
    if changes:
        await ready(session)
        await session.save(**changes)
    return True


async def _ask(projects: ProjectConfigs, project: SessionProject, session: Session) -> str | None:
    file = project.file
    client = session.client
    if file is None or project.trusted or project.error or file.problem or client is None:
        return None
    if (file.path, file.digest) in projects.declined:
        return None
    since = "changed since you trusted it: it now " if projects.trust.changed(file) else ""
    answer = await client.ask_choice(
        f"Trust {file.folder}?",
        f"This project's {file.path} {since}{describe(file.data)}. Trust this folder?",
        TRUST_OPTIONS,
        timeout=session.config.permission_timeout if session.config else 600.0,
    )
    return answer
