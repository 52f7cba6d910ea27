"""Permission rules the user granted "in this project" at a permission question.

They live in the user's space, `$CROW_HOME/rules.json` (0600), keyed by the project's
folder (the nearest folder holding `.git`, else the session's cwd): never in the workspace,
so nothing the model writes can grant itself a rule (CROW_HOME is out of the file tools'
and the sandbox's reach). Only allow rules are kept here; the user's config holds the rest.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from crow.private import locked, write_private

log = logging.getLogger("crow.rules")

RULES_FILE = "rules.json"


def project_folder(cwd: Path) -> Path:
    """The repository holding `cwd` (the nearest folder with `.git`), else `cwd` itself."""
    start = Path(os.path.realpath(cwd))
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return start


class ProjectRules:
    def __init__(self, home: Path) -> None:
        self.path = home / RULES_FILE

    def _read(self) -> dict[str, list[str]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("cannot read %s (%s): no project rules apply", self.path, exc)
            return {}
        projects = data.get("projects") if isinstance(data, dict) else None
        if not isinstance(projects, dict):
            return {}
        return {
            k: [r for r in v if isinstance(r, str)] for k, v in projects.items() if isinstance(v, list)
        }

    def allowed(self, cwd: Path) -> list[str]:
        """The allow rules granted for the project holding `cwd`."""
        return self._read().get(str(project_folder(cwd)), [])

    def add(self, cwd: Path, rules: Iterable[str]) -> None:
        key = str(project_folder(cwd))
        with locked(self.path):  # re-read under the lock: another crow may have added some
            projects = self._read()
            projects[key] = list(dict.fromkeys([*projects.get(key, []), *rules]))
            write_private(self.path, json.dumps({"version": 1, "projects": projects}, indent=2) + "\n")
