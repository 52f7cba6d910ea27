"""Project permission rules ("always allow in this project") on a PostgreSQL store, the
real server: kept in the database, not in CROW_HOME; read at a session's first call, and
read again at the next one when the database could not be reached (meanwhile the call is
asked about, never allowed by a rule crow could not read)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from builtin_hooks.permissions import PermissionsHook
from crow import ProjectRules
from crow.config import Config
from crow.errors import StoreError
from crow.messages import ToolCall
from crow.session import Session
from crow.store.postgres import PostgresStore

pytestmark = pytest.mark.anyio
NOT_ASKED = "no editor is attached to ask"  # what the hook says when it would ask


async def reachable(store: PostgresStore) -> None:
    """Once the store answers again: its pool reconnects on its own schedule (backing off
    after the failures of the outage), which is not what this test is about."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # each try waits up to `store.wait` for a connection
        try:
            await store.get_session("none")
            return
        except StoreError:
            pass
    raise AssertionError("the store did not come back within a minute")


async def test_project_rules_are_kept_in_the_database_and_read_again_once_it_is_back(
    tmp_path: Path, postgres: Any, pg_url: str
) -> None:
    repo, home = tmp_path / "repo", tmp_path / "home"
    (repo / ".git").mkdir(parents=True)
    (repo / "sub").mkdir()
    home.mkdir()
    store = PostgresStore(pg_url, home=home)
    store.wait = 0.5  # a call in the outage fails after this, not the default 5 s
    async with store:
        assert await ProjectRules(home, store).add(repo / "sub", ["execute(echo *)"])
        assert await ProjectRules(home, store).allowed(repo) == ["execute(echo *)"]
        assert not (home / "rules.json").exists()

        hook = PermissionsHook()
        session = Session("s1", repo, config=Config(home=home), store=store)
        echo, ls = (
            ToolCall("c1", "execute", {"command": "echo hi"}),
            ToolCall("c2", "execute", {"command": "ls"}),
        )
        postgres.stop("fast")
        try:
            assert NOT_ASKED in (await hook.check(SimpleNamespace(session=session), echo) or "")
        finally:
            postgres.start()
        await reachable(store)
        assert await hook.check(SimpleNamespace(session=session), echo) is None, "read at the next call"
        assert NOT_ASKED in (await hook.check(SimpleNamespace(session=session), ls) or "")
