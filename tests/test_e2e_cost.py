"""End to end: usage_update carries the session's cost when the model's price is known
(the user's configured price, crow's list prices), never for an unknown one; the cost is
stored with the session and shown again after a restart and session/load; a bad price is
a clear error. The Python client here; the TypeScript SDK client at the end."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import acp
import pytest

from tests.conftest import crow_env, spawn_crow
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec
from tests.support.ts_client import run_script

pytestmark = pytest.mark.anyio

# openai:scripted at $2 in, $10 out, $0.50 cached per million tokens
PRICED = "model_settings:\n  openai:scripted:\n    pricing: {input: 2, output: 10, cache_read: 0.5}\n"


def two_calls(llm: ScriptedLLM, workspace: Path) -> None:
    """A tool call then an answer: (1000 in of which 200 cached, 100 out), then (2000 in of
    which 1000 cached, 50 out)."""
    (workspace / "a.txt").write_text("alpha\n")
    llm.push(
        Reply(tool_calls=[ToolCallSpec("read_file", {"path": "a.txt"})], usage=(1000, 100), cache=(200, 0)),
        Reply(text="It says alpha.", usage=(2000, 50), cache=(1000, 0)),
    )


# (800 x 2 + 100 x 10 + 200 x 0.5) / 1e6, then + (1000 x 2 + 50 x 10 + 1000 x 0.5) / 1e6
CONFIGURED = [0.0027, 0.0057]


def usage_updates(wire: Any) -> list[dict[str, Any]]:
    """The usage_update updates crow wrote, as JSON on the wire."""
    return [
        m["params"]["update"]
        for direction, m in wire.messages
        if direction == "in"
        and m.get("method") == "session/update"
        and m["params"]["update"]["sessionUpdate"] == "usage_update"
    ]


def costs(wire: Any) -> list[float | None]:
    return [u["cost"]["amount"] if "cost" in u else None for u in usage_updates(wire)]


async def prompt_once(conn: Any, workspace: Path, text: str = "what is in a.txt?") -> str:
    await conn.initialize(protocol_version=1)
    sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
    response = await conn.prompt(session_id=sid, prompt=[acp.text_block(text)])
    assert response.stop_reason == "end_turn"
    return sid


async def test_configured_price_cost_accumulates_over_two_calls(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (home / "config.yaml").write_text(PRICED)
    two_calls(llm, workspace)
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await prompt_once(conn, workspace)
        assert costs(client.wire) == pytest.approx(CONFIGURED)
        assert {u["cost"]["currency"] for u in usage_updates(client.wire)} == {"USD"}


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        # gpt-4o-mini: $0.15 in, $0.60 out, $0.075 cached
        ("openai:gpt-4o-mini", [(800 * 0.15 + 100 * 0.6 + 200 * 0.075) / 1e6]),
        # a dated snapshot of claude-sonnet-4-5: $3 in, $15 out, $0.30 cache read, $3.75 cache write
        (
            "anthropic:claude-sonnet-4-5-20250929",
            [(1000 * 3 + 100 * 15 + 200 * 0.3 + 400 * 3.75) / 1e6],
        ),
    ],
)
async def test_list_price_of_a_known_model(
    llm: ScriptedLLM, home: Path, workspace: Path, model: str, expected: list[float]
) -> None:
    llm.push(Reply(text="hi", usage=(1000, 100), cache=(200, 400)))
    llm.push(Reply(text="again", usage=(1000, 100), cache=(200, 400)))
    env = crow_env(llm, home, CROW_MODEL=model, ANTHROPIC_BASE_URL=llm.root_url, ANTHROPIC_API_KEY="k")
    async with spawn_crow(env) as (conn, _proc, client):
        sid = await prompt_once(conn, workspace, "hello")
        await conn.prompt(session_id=sid, prompt=[acp.text_block("again")])
    assert costs(client.wire) == pytest.approx([expected[0], 2 * expected[0]])


async def test_no_cost_for_a_model_without_a_price(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    two_calls(llm, workspace)
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await prompt_once(conn, workspace)
    updates = usage_updates(client.wire)
    assert len(updates) == 2 and all("cost" not in u for u in updates), updates


async def test_an_unpriced_call_makes_the_total_unknown(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """A priced call, then one of a model without a price: the total is not known any more,
    so no cost is shown, not a total leaving that call out."""
    (home / "config.yaml").write_text(PRICED + "models: [openai:scripted, openai:free-for-all]\n")
    llm.push(Reply(text="one", usage=(1000, 100)), Reply(text="two", usage=(1000, 100)))
    llm.push(Reply(text="three", usage=(1000, 100)))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await prompt_once(conn, workspace, "one")
        await conn.set_config_option(session_id=sid, config_id="model", value="openai:free-for-all")
        await conn.prompt(session_id=sid, prompt=[acp.text_block("two")])
        await conn.set_config_option(session_id=sid, config_id="model", value="openai:scripted")
        await conn.prompt(session_id=sid, prompt=[acp.text_block("three")])
    assert costs(client.wire) == [pytest.approx(0.003), None, None]


async def test_cost_survives_restart_and_load(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    (home / "config.yaml").write_text(PRICED)
    two_calls(llm, workspace)
    env = crow_env(llm, home)
    async with spawn_crow(env) as (conn, _proc, client):
        sid = await prompt_once(conn, workspace)
    llm.push(Reply(text="still alpha", usage=(3000, 10)))
    async with spawn_crow(env) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        # the first usage_update after load, before any call, shows what was spent
        assert costs(client.wire) == [pytest.approx(CONFIGURED[1])]
        await conn.prompt(session_id=sid, prompt=[acp.text_block("and now?")])
    assert costs(client.wire) == pytest.approx([CONFIGURED[1], CONFIGURED[1] + (3000 * 2 + 10 * 10) / 1e6])


@pytest.mark.parametrize("stored", ["'NaN'", "-1", "'a lot'", "9e999"])
async def test_a_damaged_stored_cost_shows_none_and_the_session_goes_on(
    llm: ScriptedLLM, home: Path, workspace: Path, stored: str
) -> None:
    """A total that is not one crow writes (a store edited by hand, or damaged) is unknown:
    no NaN, negative or string on the wire; the session loads and answers."""
    (home / "config.yaml").write_text(PRICED)
    llm.push(Reply(text="one", usage=(1000, 100)), Reply(text="two", usage=(1000, 100)))
    env = crow_env(llm, home)
    async with spawn_crow(env) as (conn, _proc, _client):
        sid = await prompt_once(conn, workspace, "one")
    with closing(sqlite3.connect(home / "crow.db")) as raw:
        raw.execute(f"UPDATE sessions SET cost = {stored} WHERE id = ?", (sid,))
        raw.commit()
    async with spawn_crow(env) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("two")])
    assert response.stop_reason == "end_turn" and "two" in client.text()
    assert costs(client.wire) == [None]


async def test_a_summary_call_is_counted_too(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    """crow.compact's summary request costs money as a turn's call does."""
    (home / "config.yaml").write_text(PRICED)
    for i in range(4):
        llm.push(Reply(text=f"answer {i} " + "detail " * 50, usage=(1000, 100)))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await prompt_once(conn, workspace, "question 0")
        for i in range(1, 4):
            await conn.prompt(session_id=sid, prompt=[acp.text_block(f"question {i}")])
        llm.push(Reply(text="SUMMARY: four answers.", usage=(5000, 20)))
        result = await conn.ext_method("crow.compact", {"sessionId": sid})
        assert result["compacted"] is True
    per_turn = (1000 * 2 + 100 * 10) / 1e6
    summary = (5000 * 2 + 20 * 10) / 1e6
    assert costs(client.wire) == pytest.approx(
        [per_turn * n for n in (1, 2, 3, 4)] + [4 * per_turn + summary]
    )


@pytest.mark.parametrize(
    ("pricing", "says"),
    [
        ("{input: -1, output: 2}", "pricing.input\n  Input should be greater than or equal to 0"),
        ("{input: .nan, output: 2}", "pricing.input\n  Input should be a finite number"),
        ("{input: 1e300, output: 2}", "pricing.input\n  Input should be less than or equal to 10000"),
        ("{input: 1}", "pricing.output\n  Field required"),
        ("{input: one, output: 2}", "pricing.input\n  Input should be a valid number"),
    ],
)
def test_a_bad_price_in_the_config_is_a_clear_error(home: Path, pricing: str, says: str) -> None:
    """crow does not start on it (exit 2), saying which price is wrong and why."""
    (home / "config.yaml").write_text(f"model_settings:\n  openai:scripted:\n    pricing: {pricing}\n")
    done = subprocess.run(
        [sys.executable, "-m", "crow"], env=crow_env(None, home), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"crow: invalid configuration in {home / 'config.yaml'}")
    assert f"model_settings.openai:scripted.{says}" in done.stderr


# ------------------------------------------------------------ the TypeScript SDK client
def ts_costs(out: dict[str, Any]) -> list[float | None]:
    usage = [u["update"] for u in out["updates"] if u["update"]["sessionUpdate"] == "usage_update"]
    return [u["cost"]["amount"] if "cost" in u else None for u in usage]


def ts_prompt(text: str, name: str) -> dict[str, Any]:
    return {
        "request": "session/prompt",
        "params": {"sessionId": "${s.sessionId}", "prompt": [{"type": "text", "text": text}]},
        "as": name,
    }


def test_ts_client_sees_configured_and_list_price_costs_and_none_for_unknown(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (home / "config.yaml").write_text(PRICED)
    new = {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "s"}
    two_calls(llm, workspace)
    out = run_script({"steps": [new, ts_prompt("what is in a.txt?", "p")]}, crow_env(llm, home), workspace)
    assert out["results"]["p"]["result"]["stopReason"] == "end_turn"
    assert ts_costs(out) == pytest.approx(CONFIGURED)

    llm.push(Reply(text="one", usage=(1000, 100)), Reply(text="two", usage=(1000, 100)))
    env = crow_env(llm, home, CROW_MODEL="openai:gpt-4.1")  # $2 in, $8 out
    out = run_script({"steps": [new, ts_prompt("one", "p1"), ts_prompt("two", "p2")]}, env, workspace)
    assert ts_costs(out) == pytest.approx([0.0028, 0.0056])

    two_calls(llm, workspace)
    env = crow_env(llm, home, CROW_MODEL="openai:no-price-known")
    out = run_script({"steps": [new, ts_prompt("what is in a.txt?", "p")]}, env, workspace)
    assert ts_costs(out) == [None, None]


def test_ts_client_sees_the_cost_after_a_restart_and_load(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (home / "config.yaml").write_text(PRICED)
    env = crow_env(llm, home)
    two_calls(llm, workspace)
    new = {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "s"}
    first = run_script({"steps": [new, ts_prompt("what is in a.txt?", "p")]}, env, workspace)
    sid = first["results"]["s"]["result"]["sessionId"]
    llm.push(Reply(text="still alpha", usage=(3000, 10)))
    load = {
        "request": "session/load",
        "params": {"sessionId": sid, "cwd": str(workspace), "mcpServers": []},
        "as": "load",
    }
    prompt = ts_prompt("and now?", "p")
    prompt["params"]["sessionId"] = sid
    out = run_script({"steps": [load, prompt]}, env, workspace)
    assert "error" not in out["results"]["load"], out["results"]["load"]
    assert ts_costs(out) == pytest.approx([CONFIGURED[1], CONFIGURED[1] + (3000 * 2 + 10 * 10) / 1e6])
