"""End to end: live information as `notice` updates (schema 1.25, `session.notices`), agent
text for clients that did not advertise it, and failed turns answered with a JSON-RPC error
once their history is stored. Each through the Python client and the TypeScript SDK client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import acp
import pytest
import yaml

from crow.messages import Message
from crow.store import SQLiteStore
from tests.conftest import crow_env, initialize_125, spawn_crow
from tests.llm_server import Cut, Fault, Reply, ScriptedLLM
from tests.support.ts_client import kinds, run_script

pytestmark = pytest.mark.anyio

SUPPORT = Path(__file__).parent / "support"
UNREACHABLE = "http://127.0.0.1:9/v1"  # the discard port: nothing listens there
RETRY = "Retrying the model call in 0.2 s (attempt 2 of 3): openai: HTTP 500: scripted 500 api_error [api_error]\n"
WARNING = "Lint is stale: 3 files changed since the last lint run.\n"
FEATURES = {"session": {"notices": {}}}  # notices alone: agent text stays for the answer


def sent(client: Any, kind: str) -> list[dict[str, Any]]:
    """The raw `session/update` payloads of one kind crow wrote, in order."""
    return [
        m["params"]["update"]
        for direction, m in client.wire.messages
        if direction == "in"
        and m.get("method") == "session/update"
        and m["params"]["update"]["sessionUpdate"] == kind
    ]


def said(updates: list[dict[str, Any]]) -> str:
    return "".join(u["content"]["text"] for u in updates if u["sessionUpdate"] == "agent_message_chunk")


async def start(conn: Any, workspace: Path, notices: bool) -> str:
    if notices:
        await initialize_125(conn, FEATURES)
    else:
        await conn.initialize(protocol_version=1)
    return (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id


async def stored(home: Path, session_id: str) -> list[Message]:
    async with SQLiteStore(home / "crow.db") as store:
        return await store.load_transcript(session_id)


def config(home: Path, **data: object) -> Path:
    path = home / "notices.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# ------------------------------------------------------------------ retries and hook warnings


@pytest.mark.parametrize("notices", [True, False], ids=["notices", "text"])
async def test_a_retry_is_told(llm: ScriptedLLM, home: Path, workspace: Path, notices: bool) -> None:
    llm.push(Fault(status=500, retry_after=0.2), Reply(text="finally"))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace, notices)
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
    assert response.stop_reason == "end_turn" and len(llm.requests) == 2
    chunks = sent(client, "agent_message_chunk")
    if notices:
        assert sent(client, "notice") == [
            {
                "sessionUpdate": "notice",
                "severity": "warning",
                "title": "Retrying the model call",
                "description": RETRY.removeprefix("Retrying the model call ").strip(),
            }
        ]
        assert said(chunks) == "finally", "a notice is not agent text"
    else:
        assert sent(client, "notice") == []
        assert said(chunks) == RETRY + "finally"


@pytest.mark.parametrize("notices", [True, False], ids=["notices", "text"])
async def test_a_hooks_warning_is_told(llm: ScriptedLLM, home: Path, workspace: Path, notices: bool) -> None:
    path = config(home, hooks={"extra": ["notice_plugins:Warner"]})
    env = crow_env(llm, home, PYTHONPATH=str(SUPPORT))
    llm.push(Reply(text="answer"))
    async with spawn_crow(env, "--config", str(path)) as (conn, _proc, client):
        sid = await start(conn, workspace, notices)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
    if notices:
        assert sent(client, "notice") == [
            {
                "sessionUpdate": "notice",
                "severity": "warning",
                "title": "Lint is stale",
                "description": "3 files changed since the last lint run.",
            }
        ]
        assert said(sent(client, "agent_message_chunk")) == "answer"
    else:
        assert said(sent(client, "agent_message_chunk")) == WARNING + "answer"
    # never model context: the model got the prompt alone
    assert [m["role"] for m in llm.requests[-1].messages if m["role"] != "system"] == ["user"]


async def test_stored_notices_replay_as_text_only_to_clients_without_notices(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """A notice is stored as a system record outside the model context (what a text-only
    client was shown live, it is shown again on load); a client that takes notices gets
    none replayed: they are live information, not history."""
    path = config(home, hooks={"extra": ["notice_plugins:Warner"]})
    env = crow_env(llm, home, PYTHONPATH=str(SUPPORT))
    llm.push(Reply(text="answer"))
    async with spawn_crow(env, "--config", str(path)) as (conn, _proc, client):
        sid = await start(conn, workspace, notices=True)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
    records = [m for m in await stored(home, sid) if m.role == "system"]
    assert [(m.content, m.meta) for m in records] == [
        (
            WARNING.strip(),
            {"notice": {"severity": "warning", "title": "Lint is stale"}},
        )
    ]
    for notices, expected in ((True, "answer"), (False, WARNING + "answer")):
        async with spawn_crow(env, "--config", str(path)) as (conn, _proc, client):
            await (initialize_125(conn, FEATURES) if notices else conn.initialize(protocol_version=1))
            await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        assert said(sent(client, "agent_message_chunk")) == expected
        assert sent(client, "notice") == []


# ------------------------------------------------------------------ failed turns


@pytest.mark.parametrize("notices", [True, False], ids=["notices", "text"])
async def test_a_failing_model_answers_an_error_and_the_session_goes_on(
    llm: ScriptedLLM, home: Path, workspace: Path, notices: bool
) -> None:
    llm.push(Fault(status=500, retry_after=0.01, times=3), Reply(text="works now"))
    env = crow_env(llm, home)
    async with spawn_crow(env) as (conn, _proc, client):
        sid = await start(conn, workspace, notices)
        with pytest.raises(acp.RequestError) as failed:
            await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
        ok = await conn.prompt(session_id=sid, prompt=[acp.text_block("again")])
    error = failed.value
    assert error.code == -32000
    assert str(error) == "Model call failed: openai: HTTP 500: scripted 500 api_error [api_error]"
    assert error.data == {
        "cause": "provider",
        "error": "openai: HTTP 500: scripted 500 api_error [api_error]",
    }
    assert ok.stop_reason == "end_turn"
    assert [m["content"] for m in llm.requests[-1].messages if m["role"] == "user"] == ["hi", "again"]
    text = said(sent(client, "agent_message_chunk"))
    if notices:
        shown = sent(client, "notice")
        assert [(n["severity"], n["title"]) for n in shown] == [
            ("warning", "Retrying the model call"),
            ("warning", "Retrying the model call"),
            ("error", "Model call failed"),
        ]
        assert shown[-1]["description"] == "openai: HTTP 500: scripted 500 api_error [api_error]"
        assert text == "works now"
        # the notice went out before the answer that ends the turn
        written = [m for direction, m in client.wire.messages if direction == "in"]
        told = next(i for i, m in enumerate(written) if m.get("params", {}).get("update") == shown[-1])
        answered = next(i for i, m in enumerate(written) if "error" in m)
        assert told < answered
    else:
        assert sent(client, "notice") == []
        assert text.endswith(
            "Model call failed: openai: HTTP 500: scripted 500 api_error [api_error]\nworks now"
        )
    # the stored history is valid: a new crow loads and replays it
    async with spawn_crow(env) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
    assert [u.content.text for u in client.of_type("UserMessageChunk")] == ["hi", "again"]
    assert client.text().endswith("works now")


async def test_an_unreachable_model_answers_an_error_and_another_model_takes_over(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    path = config(
        home,
        model="openai:scripted",
        models=["openai:scripted", "anthropic:claude-test"],
        providers={"openai": {"max_retries": 1}},
    )
    env = crow_env(
        llm, home, OPENAI_BASE_URL=UNREACHABLE, ANTHROPIC_BASE_URL=llm.root_url, ANTHROPIC_API_KEY="k"
    )
    llm.push(Reply(text="from claude"))
    async with spawn_crow(env, "--config", str(path)) as (conn, _proc, client):
        sid = await start(conn, workspace, notices=True)
        with pytest.raises(acp.RequestError) as failed:
            await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
        await conn.set_config_option(session_id=sid, config_id="model", value="anthropic:claude-test")
        ok = await conn.prompt(session_id=sid, prompt=[acp.text_block("again")])
    assert failed.value.code == -32000 and failed.value.data["cause"] == "provider"
    assert str(failed.value).startswith(f"Model call failed: openai: cannot connect to {UNREACHABLE}")
    assert [n["severity"] for n in sent(client, "notice")] == ["error"]
    assert ok.stop_reason == "end_turn" and said(sent(client, "agent_message_chunk")) == "from claude"
    # both prompts reach the next model (Anthropic: one user turn of two text blocks)
    [turn] = llm.requests[-1].json["messages"]
    assert turn["role"] == "user" and [b["text"] for b in turn["content"]] == ["hi", "again"]


async def test_no_model_answers_an_error_naming_what_to_set(home: Path, workspace: Path) -> None:
    async with spawn_crow(crow_env(None, home)) as (conn, _proc, client):
        sid = await start(conn, workspace, notices=True)
        with pytest.raises(acp.RequestError) as failed:
            await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
    assert failed.value.code == -32000 and failed.value.data["cause"] == "no_model"
    assert "CROW_MODEL" in str(failed.value)
    [notice] = sent(client, "notice")
    assert (notice["severity"], notice["title"]) == ("error", "No model is configured")
    assert [m.content for m in await stored(home, sid) if m.role == "user"] == ["hi"]


async def test_a_cut_stream_answers_an_error_and_keeps_what_was_shown(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Cut(after_chunks=3, text="one two three four five six"), Reply(text="recovered"))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace, notices=True)
        with pytest.raises(acp.RequestError) as failed:
            await conn.prompt(session_id=sid, prompt=[acp.text_block("count")])
        second = await conn.prompt(session_id=sid, prompt=[acp.text_block("again")])
    assert failed.value.data["cause"] == "stream_cut"
    assert second.stop_reason == "end_turn"
    assert said(sent(client, "agent_message_chunk")) == "one two three recovered"
    kept = [m for m in llm.requests[-1].messages if m["role"] == "assistant"]
    assert kept and kept[0]["content"].startswith("one two three") and "cut off" in kept[0]["content"]


# ------------------------------------------------------------------ the TypeScript SDK client


def prompt_step(name: str, text: str) -> dict[str, Any]:
    return {
        "request": "session/prompt",
        "params": {"sessionId": "${s.sessionId}", "prompt": [{"type": "text", "text": text}]},
        "as": name,
    }


def ts_steps(workspace: Path) -> list[dict[str, Any]]:
    return [
        {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "s"},
        prompt_step("failed", "hi"),
        prompt_step("ok", "again"),
        {
            "request": "session/load",
            "params": {"sessionId": "${s.sessionId}", "cwd": str(workspace), "mcpServers": []},
            "as": "load",
        },
    ]


@pytest.mark.parametrize("notices", [True, False], ids=["notices", "text"])
def test_ts_client_retries_failures_and_the_next_prompt(
    llm: ScriptedLLM, home: Path, workspace: Path, notices: bool
) -> None:
    llm.push(Fault(status=500, retry_after=0.2), Fault(status=500, retry_after=0.01, times=2))
    llm.push(Reply(text="works now"))
    script = {"capabilities": FEATURES if notices else {}, "steps": ts_steps(workspace)}
    out = run_script(script, crow_env(llm, home), workspace)
    error = out["results"]["failed"]["error"]
    assert error["code"] == -32000 and error["data"]["cause"] == "provider"
    assert error["message"] == "Model call failed: openai: HTTP 500: scripted 500 api_error [api_error]"
    assert out["results"]["ok"]["result"]["stopReason"] == "end_turn"
    assert "result" in out["results"]["load"]
    replayed = out["updates"][
        [u["update"]["sessionUpdate"] for u in out["updates"]].index("user_message_chunk") :
    ]
    live = [u["update"] for u in out["updates"][: len(out["updates"]) - len(replayed)]]
    users = [
        u["update"]["content"]["text"]
        for u in replayed
        if u["update"]["sessionUpdate"] == "user_message_chunk"
    ]
    assert users == ["hi", "again"]
    if notices:
        assert [(u["severity"], u["title"]) for u in live if u["sessionUpdate"] == "notice"] == [
            ("warning", "Retrying the model call"),
            ("warning", "Retrying the model call"),
            ("error", "Model call failed"),
        ]
        assert said(live) == "works now"
        assert said([u["update"] for u in replayed]) == "works now", "notices are not replayed"
    else:
        assert "notice" not in kinds(out)
        assert said(live).startswith(RETRY)
        assert said(live).endswith(
            "Model call failed: openai: HTTP 500: scripted 500 api_error [api_error]\nworks now"
        )
        assert said([u["update"] for u in replayed]) == said(live), "the replay shows what was shown"


@pytest.mark.parametrize("notices", [True, False], ids=["notices", "text"])
def test_ts_client_hook_warning(llm: ScriptedLLM, home: Path, workspace: Path, notices: bool) -> None:
    path = config(home, hooks={"extra": ["notice_plugins:Warner"]})
    llm.push(Reply(text="answer"))
    script = {
        "capabilities": FEATURES if notices else {},
        "steps": [
            {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "s"},
            prompt_step("p", "hi"),
        ],
    }
    env = crow_env(llm, home, PYTHONPATH=str(SUPPORT))
    out = run_script(script, env, workspace, "--config", str(path))
    assert out["results"]["p"]["result"]["stopReason"] == "end_turn"
    updates = [u["update"] for u in out["updates"]]
    if notices:
        assert [u for u in updates if u["sessionUpdate"] == "notice"] == [
            {
                "sessionUpdate": "notice",
                "severity": "warning",
                "title": "Lint is stale",
                "description": "3 files changed since the last lint run.",
            }
        ]
        assert said(updates) == "answer"
    else:
        assert "notice" not in kinds(out) and said(updates) == WARNING + "answer"
