"""A store URL crow refuses (a typo in its scheme, another database's) is a config error
that never shows the URL's password: CROW_STORE is a secret."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import crow_env
from tests.test_store_postgres import crow_cli


@pytest.mark.parametrize("url", ["postgresql+psycopg://crow:s3cr3t@db/crow", "host=db password=s3cr3t"])
def test_a_refused_store_url_is_not_shown(home: Path, url: str) -> None:
    by_env = crow_env(None, home, CROW_STORE=url)
    (home / "config.yaml").write_text(f"store: '{url}'\n")
    by_file = crow_env(None, home)
    for env in (by_env, by_file):
        done = crow_cli(env, "sessions", "list")
        assert done.returncode == 2
        assert "store must be a postgresql:// URL" in done.stderr
        assert "s3cr3t" not in done.stderr + done.stdout


@pytest.mark.parametrize(
    "url",
    ["postgresql://crow:s3cr%zz3t@/db?host=/nowhere", "postgresql:///db?host=/nowhere&password=s3cr%zz3t"],
)
def test_an_unreadable_url_does_not_show_its_password(home: Path, url: str) -> None:
    # a password holding a bare % (not percent-encoded): libpq's error quotes that token
    done = subprocess.run(
        [sys.executable, "-m", "crow", "sessions", "list"],
        env=crow_env(None, home, CROW_STORE=url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "cannot reach the PostgreSQL store" in done.stderr
    assert "s3cr" not in done.stderr + done.stdout
