"""crow's files are private: the store's folder, database and CROW_HOME files, and traces."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from builtin_hooks.tracing import TraceWriter
from crow.store import SQLiteStore

pytestmark = pytest.mark.anyio


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


@pytest.fixture(autouse=True)
def usual_umask() -> object:
    old = os.umask(0o022)  # files 0644, folders 0755 unless crow says otherwise
    yield
    os.umask(old)


async def test_a_new_store_is_private(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    home = tmp_path / "a" / "home"
    async with SQLiteStore(home / "crow.db", home=home) as store:
        await store.create_session(id="s", cwd="/w")
        assert mode(home) == 0o700
        assert {p.name: mode(p) for p in home.iterdir()} == {
            "crow.db": 0o600,
            "crow.db-wal": 0o600,
            "crow.db-shm": 0o600,
        }
    assert mode(tmp_path / "a") == 0o755, "only CROW_HOME itself is crow's"
    assert "private" not in caplog.text


async def test_loose_modes_are_tightened_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    (home / "crow.db").touch(mode=0o644)
    (home / "config.yaml").write_text("model: x\n")
    (home / "notes.txt").write_text("not crow's")
    (home / "config.yaml").chmod(0o640)
    with caplog.at_level(logging.WARNING, "crow.private"):
        async with SQLiteStore(home / "crow.db", home=home):
            pass
    assert (mode(home), mode(home / "crow.db"), mode(home / "config.yaml")) == (0o700, 0o600, 0o600)
    assert mode(home / "notes.txt") == 0o644, "files crow does not know are left alone"
    [line] = [r.getMessage() for r in caplog.records if "private" in r.getMessage()]
    assert line.endswith("home 0755→0700, config.yaml 0640→0600, crow.db 0644→0600"), line


async def test_a_store_without_home_touches_only_its_own_files(tmp_path: Path) -> None:
    (tmp_path / "project").mkdir(mode=0o755)
    async with SQLiteStore(tmp_path / "project" / "x.db"):
        pass
    assert mode(tmp_path / "project") == 0o755
    assert mode(tmp_path / "project" / "x.db") == 0o600


def test_traces_are_private(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    new = TraceWriter(tmp_path / "traces" / "t.jsonl")
    new.write({"name": "x", "output_preview": "bad\udcff name"})  # a surrogateescaped file name
    new.close()
    assert mode(tmp_path / "traces") == 0o700 and mode(tmp_path / "traces" / "t.jsonl") == 0o600
    assert "bad? name" in (tmp_path / "traces" / "t.jsonl").read_text()
    old = tmp_path / "old.jsonl"
    old.write_text("")
    old.chmod(0o644)
    writer = TraceWriter(old)
    writer.write({"name": "y"})
    writer.close()
    assert mode(old) == 0o600
    assert f"made trace file {old} private: 0644→0600" in caplog.text
