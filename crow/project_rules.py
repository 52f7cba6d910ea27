"""Permission rules the user granted "in this project" at a permission question.

They live in the user's space, keyed by the project's folder (the nearest folder holding
`.git`, else the session's cwd): never in the workspace, so nothing the model writes can
grant itself a rule (CROW_HOME is out of the file tools' and the sandbox's reach). With a
store that keeps side records (`SideRecords`: PostgreSQL) they are in the database, for
every crow on it; otherwise in `$CROW_HOME/rules.json` (0600). Only allow rules are kept
here; the user's config holds the rest.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

from crow.errors import StoreError
from crow.private import locked, write_private
from crow.store.base import SideRecords

log = logging.getLogger("crow.rules")

RULES_FILE = "rules.json"


def project_folder(cwd: Path) -> Path:
    """The repository holding `cwd` (the nearest folder with `.git`), else `cwd` itself."""
    start = Path(os.path.realpath(cwd))
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return start


class RuleBook(Protocol):
    """Where the rules are kept: the rules half of a store's `SideRecords` (same names)."""

    async def project_rules(self, project: str) -> list[str]: ...
    async def add_project_rules(self, project: str, rules: Sequence[str]) -> None: ...


class ProjectRules:
    """The rules granted per project, where the session's `store` keeps them (see above)."""

    def __init__(self, home: Path, store: object = None) -> None:
        self.book: RuleBook = store if isinstance(store, SideRecords) else RulesFile(home)

    async def allowed(self, cwd: Path) -> list[str] | None:
        """The allow rules granted for the project holding `cwd`; None when they cannot be
        read now (the database unreachable: logged), so that the caller asks again later."""
        try:
            return await self.book.project_rules(str(project_folder(cwd)))
        except StoreError as exc:
            log.warning("the project's permission rules cannot be read now: %s", exc)
            return None

    async def add(self, cwd: Path, rules: Iterable[str]) -> bool:
        """Keep `rules` for the project holding `cwd`; False when they could not be (logged)."""
        rules = list(rules)
        try:
            await self.book.add_project_rules(str(project_folder(cwd)), rules)
        except (OSError, StoreError) as exc:
            log.warning("cannot store the project rules %s: %s", rules, exc)
            return False
        return True


class RulesFile:
    """`rules.json` in CROW_HOME: {"version": 1, "projects": {folder: [rule, ...]}}."""

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

    async def project_rules(self, project: str) -> list[str]:
        return self._read().get(project, [])

    async def add_project_rules(self, project: str, rules: Sequence[str]) -> None:
        with locked(self.path):  # re-read under the lock: another crow may have added some
            projects = self._read()
            projects[project] = list(dict.fromkeys([*projects.get(project, []), *rules]))
            write_private(self.path, json.dumps({"version": 1, "projects": projects}, indent=2) + "\n")


async def copy_file_to(book: RuleBook, home: Path) -> int:
    """Add every project's rules of `home`'s rules.json to `book` (a store's): what `crow
    sessions migrate` does. The number of projects."""
    projects = RulesFile(home)._read()
    for project, rules in projects.items():
        await book.add_project_rules(project, rules)
    return len(projects)
