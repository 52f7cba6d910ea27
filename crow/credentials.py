"""API keys stored by `crow login`: `$CROW_HOME/credentials.json`, the user's alone (0600).

    {"version": 1, "keys": [{"provider": "openai", "base_url": "https://api.openai.com/v1",
                             "api_key": "sk-..."}]}

A key is bound to the provider name and the base URL it was verified against: it is used
only for requests to that URL (a changed `OPENAI_BASE_URL` or a project's provider entry
pointing elsewhere never receives it). It comes last: a key in the config file or the
provider's environment variable wins. It never enters an environment (so no tool, hook or
MCP server started by crow inherits it) and is never logged: the file tools and the sandbox
hide CROW_HOME.

The file is replaced atomically, created 0600 (never readable by others, not even for an
instant); a symlink in its place is refused, and a file that another user owns or others
may write is ignored. Import-light: `create_provider` and ACP `authenticate` read it.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

from crow.errors import ConfigError
from crow.private import DIR_MODE, locked, tighten, write_private

log = logging.getLogger("crow.credentials")

FILE = "credentials.json"

Stamp = tuple[int, int, int] | None


def path_in(home: str | os.PathLike[str]) -> Path:
    return Path(home) / FILE


def same_url(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


def stamp(home: str | os.PathLike[str]) -> Stamp:
    """What changes when the file does (one stat, every model call: no Path built): providers
    built before are rebuilt."""
    try:
        st = os.lstat(os.path.join(home, FILE))
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _entries(home: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The stored entries; none when the file is missing, unsafe or unreadable (logged)."""
    path = path_in(home)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    except OSError as exc:  # a symlink (ELOOP), unreadable
        log.warning("ignored %s: %s", path, exc.strerror or exc)
        return []
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            log.warning("ignored %s: not a regular file of yours that only you can write", path)
            return []
        try:
            data = json.loads(f.read(1 << 20))
        except ValueError:
            log.warning("ignored %s: not valid JSON", path)
            return []
    keys = data.get("keys") if isinstance(data, dict) else None
    return [
        e
        for e in (keys if isinstance(keys, list) else [])
        if isinstance(e, dict) and all(isinstance(e.get(k), str) for k in ("provider", "base_url", "api_key"))
    ]


def stored_key(home: str | os.PathLike[str] | None, provider: str, base_url: str) -> str | None:
    """The key `crow login` stored for `provider` at `base_url`, or None."""
    if home is None:
        return None
    for entry in _entries(home):
        if entry["provider"] == provider and same_url(entry["base_url"], base_url):
            return entry["api_key"] or None
    return None


def check_key(key: str) -> str:
    """A pasted key, trimmed; refused when it could not be sent as a header."""
    key = key.strip()
    if not key:
        raise ConfigError("no key given")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in key) or not key.isascii():
        raise ConfigError("the key holds spaces, control or non-ASCII characters: not an API key")
    return key


def _refuse_symlink(path: Path) -> None:
    if path.is_symlink():
        raise ConfigError(f"{path} is a symbolic link: crow will not write keys through it; remove it first")


def store(home: str | os.PathLike[str], provider: str, base_url: str, key: str) -> Path:
    """Store `key` for `provider` at `base_url`, replacing the entry for that pair."""
    path = path_in(home)
    key = check_key(key)
    with locked(path):
        _refuse_symlink(path)
        kept = [
            e for e in _entries(home) if not (e["provider"] == provider and same_url(e["base_url"], base_url))
        ]
        entry = {"provider": provider, "base_url": base_url.rstrip("/"), "api_key": key}
        write_private(path, json.dumps({"version": 1, "keys": [*kept, entry]}, indent=1) + "\n")
    tighten(path.parent, DIR_MODE)  # CROW_HOME is the user's alone, as the store makes it
    return path


def forget(home: str | os.PathLike[str]) -> bool:
    """Remove every stored key; True when there were any (a symlink is removed, not followed)."""
    path = path_in(home)
    if not os.path.lexists(path):
        return False
    with locked(path):
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
    return True
