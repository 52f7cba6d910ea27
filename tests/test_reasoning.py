"""Thought levels: the `thought_level` config option is offered for models that take one
(crow's list, or `model_settings.REF.reasoning`), re-evaluated when the model changes,
remembered with the session, and the chosen level reaches the provider's request
(OpenAI `reasoning_effort`, Anthropic thinking budget). Python client, then the TypeScript
SDK client at the end; unit tests of the lists and the config checks first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import acp
import pytest

from crow.config import Config, ReasoningSettings
from crow.errors import ConfigError
from crow.reasoning import levels_for
from tests.conftest import crow_env, spawn_crow
from tests.llm_server import ScriptedLLM
from tests.support.ts_client import run_script

pytestmark = pytest.mark.anyio


# ------------------------------------------------------------ which models take a level
@pytest.mark.parametrize(
    ("ref", "levels"),
    [
        ("openai:o3-mini", ["low", "medium", "high"]),
        ("openai:o4-mini-2025-04-16", ["low", "medium", "high"]),
        ("openai:gpt-5-mini", ["minimal", "low", "medium", "high"]),
        ("openai:gpt-5.1", ["none", "low", "medium", "high"]),
        ("openai:gpt-5.1-codex", ["low", "medium", "high"]),
        ("anthropic:claude-sonnet-4-5-20250929", ["off", "low", "medium", "high"]),
        ("anthropic:claude-3-7-sonnet-latest", ["off", "low", "medium", "high"]),
        ("openai:gpt-4o", None),
        ("openai:gpt-5-chat-latest", None),
        ("anthropic:claude-3-5-haiku", None),
        ("ollama:qwen3:8b", None),
        ("openai:claude-sonnet-4-5", None),  # the request format decides: no thinking budget in OpenAI's
    ],
)
def test_builtin_list(ref: str, levels: list[str] | None) -> None:
    found = levels_for(ref, Config())
    assert (found.levels if found else None) == levels


def test_config_overrides_the_list_per_model() -> None:
    config = Config.model_validate(
        {
            "model_settings": {
                "openai:o3-mini": {"reasoning": {"levels": []}},  # this one: none
                "my-model": {"reasoning": {"levels": ["fast", "deep"], "default": "deep"}},
            }
        }
    )
    assert levels_for("openai:o3-mini", config) is None
    assert levels_for("vllm:my-model", config) == ReasoningSettings(levels=["fast", "deep"], default="deep")


@pytest.mark.parametrize(
    ("reasoning", "says"),
    [
        ({"levels": ["low", "low"]}, "levels repeat a name"),
        ({"levels": ["Low"]}, "level 'Low': lower-case"),
        ({"levels": ["low"], "default": "high"}, "default 'high' is not one of the levels ['low']"),
        ({"levels": ["low"], "budgets": {"high": 2048}}, "budgets.high: not one of the levels"),
        ({"levels": ["low"], "budgets": {"low": 10}}, "budgets.low: 10 (0 = no thinking"),
        ({"default": "low"}, "levels\n  Field required"),
    ],
)
def test_bad_reasoning_settings_are_clear_errors(reasoning: dict[str, Any], says: str) -> None:
    from crow.config import validate_config

    with pytest.raises(ConfigError) as err:
        validate_config({"model_settings": {"m": {"reasoning": reasoning}}}, " in test.yaml")
    assert says in str(err.value) and "model_settings.m.reasoning" in str(err.value)


# ------------------------------------------------------------ end to end, Python client
def options(answer: Any) -> dict[str, Any]:
    return {o.id: o for o in answer.config_options}


async def test_openai_level_offered_chosen_sent_and_remembered(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (home / "config.yaml").write_text(
        "model: openai:gpt-5-mini\nmodels: [openai:gpt-5-mini, openai:scripted]\n"
    )
    env = crow_env(llm, home, CROW_MODEL="")
    async with spawn_crow(env) as (conn, _proc, _client):
        await conn.initialize(protocol_version=1)
        new = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        sid, thought = new.session_id, options(new)["thought_level"]
        assert (thought.category, thought.type, thought.current_value) == (
            "thought_level",
            "select",
            "medium",
        )
        assert [o.value for o in thought.options] == ["minimal", "low", "medium", "high"]
        await conn.prompt(session_id=sid, prompt=[acp.text_block("default")])
        assert "reasoning_effort" not in llm.requests[-1].json  # the model's own default

        changed = await conn.set_config_option(session_id=sid, config_id="thought_level", value="high")
        assert options(changed)["thought_level"].current_value == "high"
        await conn.prompt(session_id=sid, prompt=[acp.text_block("think hard")])
        assert llm.requests[-1].json["reasoning_effort"] == "high"

        # a model that takes no level: not offered, not sent; back again: remembered
        other = await conn.set_config_option(session_id=sid, config_id="model", value="openai:scripted")
        assert "thought_level" not in options(other)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("plain")])
        assert "reasoning_effort" not in llm.requests[-1].json
        back = await conn.set_config_option(session_id=sid, config_id="model", value="openai:gpt-5-mini")
        assert options(back)["thought_level"].current_value == "high"

    async with spawn_crow(env) as (conn, _proc, _client):  # a restart, then load
        await conn.initialize(protocol_version=1)
        loaded = await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        assert options(loaded)["thought_level"].current_value == "high"
        await conn.prompt(session_id=sid, prompt=[acp.text_block("again")])
        assert llm.requests[-1].json["reasoning_effort"] == "high"
        resumed = await conn.resume_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        assert options(resumed)["thought_level"].current_value == "high"
        forked = await conn.fork_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        assert options(forked)["thought_level"].current_value == "high"


async def test_anthropic_level_is_a_thinking_budget(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    (home / "config.yaml").write_text(
        "models: [anthropic:claude-sonnet-4-5, anthropic:claude-custom]\n"
        "model_settings:\n"
        "  anthropic:claude-custom:\n"
        "    reasoning: {levels: [quick, deep], default: quick, budgets: {quick: 0, deep: 30000}}\n"
    )
    env = crow_env(
        llm, home, CROW_MODEL="anthropic:claude-sonnet-4-5", ANTHROPIC_BASE_URL=llm.root_url,
        ANTHROPIC_API_KEY="k",
    )  # fmt: skip
    async with spawn_crow(env) as (conn, _proc, _client):
        await conn.initialize(protocol_version=1)
        new = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        sid = new.session_id
        assert options(new)["thought_level"].current_value == "off"
        await conn.set_config_option(session_id=sid, config_id="thought_level", value="medium")
        await conn.prompt(session_id=sid, prompt=[acp.text_block("think")])
        body = llm.requests[-1].json
        assert body["thinking"] == {"type": "enabled", "budget_tokens": 8192}
        assert body["max_tokens"] > 8192 and "temperature" not in body
        await conn.set_config_option(session_id=sid, config_id="thought_level", value="off")
        await conn.prompt(session_id=sid, prompt=[acp.text_block("do not")])
        assert "thinking" not in llm.requests[-1].json

        custom = await conn.set_config_option(
            session_id=sid, config_id="model", value="anthropic:claude-custom"
        )
        thought = options(custom)["thought_level"]
        assert ([o.value for o in thought.options], thought.current_value) == (["quick", "deep"], "quick")
        await conn.set_config_option(session_id=sid, config_id="thought_level", value="deep")
        await conn.prompt(session_id=sid, prompt=[acp.text_block("deeply")])
        assert llm.requests[-1].json["thinking"] == {"type": "enabled", "budget_tokens": 30000}


async def test_bad_levels_are_refused_and_the_session_stays_usable(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (home / "config.yaml").write_text("models: [openai:o3-mini, openai:scripted]\n")
    async with spawn_crow(crow_env(llm, home, CROW_MODEL="openai:o3-mini")) as (conn, _proc, _client):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        for value, says in [
            (
                "minimal",
                "unknown thought level 'minimal' for openai:o3-mini; one of ['low', 'medium', 'high']",
            ),
            ("", "unknown thought level '' for openai:o3-mini"),
        ]:
            with pytest.raises(acp.RequestError) as err:
                await conn.set_config_option(session_id=sid, config_id="thought_level", value=value)
            assert err.value.code == -32602 and says in str(err.value.data)
        await conn.set_config_option(session_id=sid, config_id="model", value="openai:scripted")
        with pytest.raises(acp.RequestError) as err:
            await conn.set_config_option(session_id=sid, config_id="thought_level", value="low")
        assert "the model openai:scripted takes no thought level" in str(err.value.data)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("still fine")])
        assert "reasoning_effort" not in llm.requests[-1].json


# ------------------------------------------------------------ the TypeScript SDK client
def ts_options(result: dict[str, Any]) -> dict[str, Any]:
    return {o["id"]: o for o in result["configOptions"]}


def test_ts_client_chooses_a_level_that_reaches_both_providers(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (home / "config.yaml").write_text(
        "models: [openai:o4-mini, anthropic:claude-opus-4-1, openai:scripted]\n"
    )
    env = crow_env(
        llm, home, CROW_MODEL="openai:o4-mini", ANTHROPIC_BASE_URL=llm.root_url, ANTHROPIC_API_KEY="k"
    )

    def set_option(config_id: str, value: str, name: str) -> dict[str, Any]:
        params = {"sessionId": "${s.sessionId}", "configId": config_id, "value": value}
        return {"request": "session/set_config_option", "params": params, "as": name}

    def prompt(name: str) -> dict[str, Any]:
        params = {"sessionId": "${s.sessionId}", "prompt": [{"type": "text", "text": name}]}
        return {"request": "session/prompt", "params": params, "as": name}

    steps = [
        {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "s"},
        set_option("thought_level", "low", "low"),
        prompt("p1"),
        set_option("model", "anthropic:claude-opus-4-1", "claude"),
        set_option("thought_level", "high", "high"),
        prompt("p2"),
        set_option("model", "openai:scripted", "plain"),
        set_option("thought_level", "high", "refused"),
        set_option("model", "openai:o4-mini", "back"),
        set_option("thought_level", "extreme", "unknown"),
    ]
    out = run_script({"steps": steps}, env, workspace)
    results = out["results"]
    offered = ts_options(results["s"]["result"])["thought_level"]
    assert offered["category"] == "thought_level" and offered["currentValue"] == "medium"
    assert [o["value"] for o in offered["options"]] == ["low", "medium", "high"]
    assert ts_options(results["low"]["result"])["thought_level"]["currentValue"] == "low"
    # claude offers "low" too: the session's choice carries over to it
    assert ts_options(results["claude"]["result"])["thought_level"]["currentValue"] == "low"
    assert ts_options(results["high"]["result"])["thought_level"]["currentValue"] == "high"
    assert "thought_level" not in ts_options(results["plain"]["result"])
    assert results["refused"]["error"]["code"] == -32602
    assert "takes no thought level" in str(results["refused"]["error"]["data"])
    assert ts_options(results["back"]["result"])["thought_level"]["currentValue"] == "high"
    assert results["unknown"]["error"]["code"] == -32602
    assert "unknown thought level 'extreme'" in str(results["unknown"]["error"]["data"])
    openai_body, anthropic_body = (r.json for r in llm.requests)
    assert openai_body["reasoning_effort"] == "low"
    assert anthropic_body["thinking"] == {"type": "enabled", "budget_tokens": 16384}


def test_ts_client_sees_the_level_remembered_after_load(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    env = crow_env(llm, home, CROW_MODEL="openai:gpt-5")
    first = run_script(
        {
            "steps": [
                {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "s"},
                {
                    "request": "session/set_config_option",
                    "params": {
                        "sessionId": "${s.sessionId}",
                        "configId": "thought_level",
                        "value": "minimal",
                    },
                    "as": "set",
                },
            ]
        },
        env,
        workspace,
    )
    sid = first["results"]["s"]["result"]["sessionId"]
    params = {"sessionId": sid, "cwd": str(workspace), "mcpServers": []}
    out = run_script(
        {
            "steps": [
                {"request": "session/load", "params": params, "as": "load"},
                {
                    "request": "session/prompt",
                    "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]},
                    "as": "p",
                },
            ]
        },
        env,
        workspace,
    )
    assert ts_options(out["results"]["load"]["result"])["thought_level"]["currentValue"] == "minimal"
    assert llm.requests[-1].json["reasoning_effort"] == "minimal"
