"""Prices and the stored cost without a model server: which price applies, what one call
costs, that a project cannot set prices, and that a store written by an older crow (schema 1)
opens with its sessions' cost unknown and new sessions' cost 0."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from crow.config import Config, Pricing, load_config
from crow.errors import ConfigError
from crow.llm.base import Usage
from crow.pricing import PRICES_CHECKED, cost_of, price_for
from crow.project_config import compose
from crow.store import SCHEMA_VERSION, SQLiteStore

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_the_list_is_dated() -> None:
    assert PRICES_CHECKED == "2025-11-25"


@pytest.mark.parametrize(
    ("ref", "price"),
    [
        ("openai:gpt-4o-mini", (0.15, 0.60, 0.075, 0.15)),
        ("openai:gpt-4o-2024-08-06", (2.50, 10.0, 1.25, 2.50)),  # a snapshot: its model's price
        ("openai:gpt-4o-2024-05-13", (5.0, 15.0, 5.0, 5.0)),  # ...unless it has one of its own
        ("anthropic:claude-haiku-4-5-20251001", (1.0, 5.0, 0.10, 1.25)),
        ("anthropic:claude-3-7-sonnet-latest", (3.0, 15.0, 0.30, 3.75)),
        ("openrouter:openai/gpt-4o", None),  # another provider's prices are its own
        ("ollama:gpt-4o", None),
        ("openai:gpt-4o-mini-turbo-x", None),
    ],
)
def test_list_prices(ref: str, price: tuple[float, ...] | None) -> None:
    found = price_for(ref, Config())
    assert (
        None if found is None else (found.input, found.output, found.cache_read, found.cache_write)
    ) == price


def test_the_users_price_wins_by_ref_then_by_model_name() -> None:
    config = Config.model_validate(
        {
            "model_settings": {
                "openai:gpt-4o": {"pricing": {"input": 1, "output": 2}},
                "gpt-4o-mini": {"pricing": {"input": 0, "output": 0}},  # any provider's
                "anthropic:claude-sonnet-4-5": {"context_window": 1000},  # no price here: the list's
            }
        }
    )
    assert price_for("openai:gpt-4o", config) == Pricing(input=1, output=2)
    assert price_for("ollama:gpt-4o-mini", config) == Pricing(input=0, output=0)
    assert price_for("anthropic:claude-sonnet-4-5", config).input == 3.0  # type: ignore[union-attr]


def test_cost_of_one_call() -> None:
    usage = Usage(
        input_tokens=1_000_000, output_tokens=500_000, cache_read_tokens=2_000_000, cache_write_tokens=0
    )
    assert cost_of(usage, Pricing(input=3, output=15, cache_read=0.3, cache_write=3.75)) == pytest.approx(
        3 + 7.5 + 0.6
    )
    # without cache prices, cached tokens cost the input price (no discount is assumed)
    assert (
        cost_of(Usage(cache_read_tokens=1_000_000, cache_write_tokens=1_000_000), Pricing(input=2, output=8))
        == 4
    )


def test_a_project_may_not_set_prices(home: Path, tmp_path: Path) -> None:
    user = load_config(env={"CROW_HOME": str(home)})
    project = {"model_settings": {"openai:gpt-5": {"pricing": {"input": 0, "output": 0}}}}
    with pytest.raises(ConfigError) as err:
        compose(user, project, tmp_path / "crow.yaml")
    assert str(err.value) == (
        f"invalid configuration in {tmp_path / 'crow.yaml'}: model_settings.openai:gpt-5.pricing cannot be "
        "set by a project's crow.yaml (the cost shown is what your account pays); set it in your own config "
        f"({home / 'config.yaml'}) instead"
    )
    # the rest of a model's settings a project may still set
    ok = compose(
        user, {"model_settings": {"openai:gpt-5": {"reasoning": {"levels": ["low"]}}}}, tmp_path / "c"
    )
    assert ok.model_settings["openai:gpt-5"].reasoning.levels == ["low"]  # type: ignore[union-attr]


# The layout crow wrote before the cost (schema 1), as it was.
_V1 = """
CREATE TABLE sessions (
  id TEXT PRIMARY KEY, cwd TEXT NOT NULL, title TEXT NOT NULL DEFAULT '',
  created_at REAL NOT NULL, updated_at REAL NOT NULL, model TEXT, mode TEXT,
  todos TEXT NOT NULL DEFAULT '[]', files TEXT NOT NULL DEFAULT '{}',
  config TEXT NOT NULL DEFAULT '{}', message_count INTEGER NOT NULL DEFAULT 0,
  context_from INTEGER NOT NULL DEFAULT 0, context_head TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX sessions_by_time ON sessions (updated_at DESC, id);
CREATE INDEX sessions_by_cwd ON sessions (cwd, updated_at DESC, id);
CREATE TABLE entries (
  session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE, seq INTEGER NOT NULL,
  message TEXT NOT NULL, in_context INTEGER NOT NULL DEFAULT 1, PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
INSERT INTO sessions (id, cwd, created_at, updated_at, model, message_count)
  VALUES ('used', '/w', 1, 1, 'openai:gpt-4o', 1), ('empty', '/w', 2, 2, NULL, 0);
INSERT INTO entries VALUES ('used', 0, '{"role": "user", "content": "hi"}', 1);
PRAGMA user_version = 1;
"""


async def test_a_store_from_before_the_cost_opens_and_keeps_everything(tmp_path: Path) -> None:
    db = tmp_path / "crow.db"
    with closing(sqlite3.connect(db)) as raw:
        raw.executescript(_V1)
    async with SQLiteStore(db) as store:
        used, empty = await store.get_session("used"), await store.get_session("empty")
        assert used is not None and empty is not None
        assert (used.cost, used.thought_level, used.message_count) == (None, None, 1)  # calls never priced
        assert empty.cost == 0.0
        assert [m.content for m in await store.load_transcript("used")] == ["hi"]
        updated = await store.update_session("used", thought_level="high")
        assert updated.thought_level == "high" and updated.cost is None
        fresh = await store.create_session(id="new", cwd="/w")
        assert (fresh.cost, fresh.thought_level) == (0.0, None)
        await store.update_session("new", cost=0.25)
        forked = await store.fork_session("new", "fork")
        assert forked.cost == 0.25
    with closing(sqlite3.connect(db)) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
    async with SQLiteStore(db) as store:  # opening again migrates nothing twice
        assert (await store.get_session("new")).cost == 0.25  # type: ignore[union-attr]


def test_usages_add_up_field_by_field() -> None:
    """Every field, a new one too (the sum is written out field by field for speed)."""
    import dataclasses

    fields = [f.name for f in dataclasses.fields(Usage)]
    one = Usage(*range(1, len(fields) + 1))
    two = Usage(*range(100, 100 + len(fields)))
    assert [getattr(one + two, f) for f in fields] == [getattr(one, f) + getattr(two, f) for f in fields]
