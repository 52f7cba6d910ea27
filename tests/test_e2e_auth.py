"""End to end: authentication (schema 1.25) through the Python client and the TypeScript SDK
client: the methods offered, `authenticate`, `logout`, and a prompt without a valid key
answered auth_required (-32000) with the session still usable once the key is fixed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import acp
import anyio
import pytest

from crow import credentials
from tests.conftest import FEATURES_125, crow_env, initialize_125, raw_request, spawn_crow
from tests.llm_server import ScriptedLLM
from tests.support.ts_client import run_script

pytestmark = pytest.mark.anyio

GOOD = "sk-good-0123456789"
OPENAI = "https://api.openai.com/v1"  # never contacted: authenticate only looks for a key


def hosted_env(home: Path, **extra: str) -> dict[str, str]:
    """The real OpenAI as the configured provider, with no key unless `extra` sets one."""
    return crow_env(None, home, CROW_MODEL="openai:gpt-4.1-mini", **extra)


def keyless_env(llm: ScriptedLLM, home: Path) -> dict[str, str]:
    env = crow_env(llm, home)
    del env["OPENAI_API_KEY"]
    return env


async def error_of(call: Any) -> acp.RequestError:
    with pytest.raises(acp.RequestError) as info:
        await call
    return info.value


async def test_the_terminal_method_is_offered_only_to_clients_that_run_it(home: Path) -> None:
    async with spawn_crow(hosted_env(home)) as (conn, _proc, _client):
        without = await initialize_125(conn, {**FEATURES_125, "auth": {"terminal": False}})
    assert without["agentCapabilities"]["auth"] == {"logout": {}}
    assert [m["id"] for m in without["authMethods"]] == ["crow-api-key"]
    assert "type" not in without["authMethods"][0]  # agent: the default type
    async with spawn_crow(hosted_env(home)) as (conn, _proc, _client):
        with_terminal = await initialize_125(conn)
    methods = {m["id"]: m for m in with_terminal["authMethods"]}
    assert methods["crow-login"]["type"] == "terminal" and methods["crow-login"]["args"] == ["login"]


async def test_authenticate_checks_the_configured_key(home: Path) -> None:
    async with spawn_crow(hosted_env(home)) as (conn, _proc, _client):
        await initialize_125(conn)
        missing = await error_of(conn.authenticate(method_id="crow-api-key"))
        assert missing.code == -32000
        assert "OPENAI_API_KEY" in str(missing) and "crow login" in str(missing)
        for bad in ("crow-login", "nope", ""):  # the terminal method is never passed here
            error = await error_of(conn.authenticate(method_id=bad))
            assert error.code == -32602, (bad, error)
        # a key stored for the provider's URL counts (read anew at each call)
        credentials.store(home, "openai", OPENAI, GOOD)
        assert await conn.authenticate(method_id="crow-api-key") is not None
        assert await raw_request(conn, "logout", {}) == {}
        assert not (home / "credentials.json").exists()
        error = await error_of(conn.authenticate(method_id="crow-api-key"))
        assert error.code == -32000
        # the session goes on working: a prompt answers auth_required, no request is sent
        sid = (await conn.new_session(cwd=str(home), mcp_servers=[])).session_id
        error = await error_of(conn.prompt(session_id=sid, prompt=[acp.text_block("hi")]))
        assert error.code == -32000 and str(error).startswith("Authentication required")
    async with spawn_crow(hosted_env(home, OPENAI_API_KEY="from-env")) as (conn, _proc, _client):
        await initialize_125(conn)
        assert await conn.authenticate(method_id="crow-api-key") is not None
        # logout leaves the environment alone: still authenticated
        assert await raw_request(conn, "logout", {}) == {}
        assert await conn.authenticate(method_id="crow-api-key") is not None


async def test_a_refused_key_answers_auth_required_then_login_fixes_the_session(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.keys = {GOOD}
    env = keyless_env(llm, home)
    credentials.store(home, "openai", llm.base_url, "sk-revoked")
    async with spawn_crow(env) as (conn, _proc, client):
        await initialize_125(conn)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        error = await error_of(conn.prompt(session_id=sid, prompt=[acp.text_block("first try")]))
        assert error.code == -32000
        assert str(error).startswith("Authentication required: openai: HTTP 401")
        assert "OPENAI_API_KEY" in str(error) and "sk-revoked" not in str(error)
        # the user logs in (as the terminal method does) while crow runs
        login = [sys.executable, "-m", "crow", "login", "--provider", "openai", "--key-stdin"]
        done = await anyio.run_process(login, input=GOOD.encode(), env=env, check=False)
        assert done.returncode == 0, done.stderr
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("second try")])
        assert response.stop_reason == "end_turn"
        assert llm.requests[-1].headers["authorization"] == f"Bearer {GOOD}"
        sent = [m for m in llm.requests[-1].messages if m["role"] == "user"]
        assert [m["content"] for m in sent] == ["first try", "second try"]
        # logout: the next prompt needs auth again
        assert await raw_request(conn, "logout", {}) == {}
        error = await error_of(conn.prompt(session_id=sid, prompt=[acp.text_block("third")]))
        assert error.code == -32000
    # the history replays whole after a restart
    async with spawn_crow(crow_env(llm, home, OPENAI_API_KEY=GOOD)) as (conn, _proc, client):
        await initialize_125(conn)
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        shown = [u.content.text for u in client.of_type("UserMessageChunk")]
        assert shown == ["first try", "second try", "third"]
        assert (
            await conn.prompt(session_id=sid, prompt=[acp.text_block("fourth")])
        ).stop_reason == "end_turn"
    assert (
        "sk-revoked" not in (home / "stderr.log").read_text()
        and GOOD not in (home / "stderr.log").read_text()
    )


def test_auth_through_the_typescript_client(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    llm.keys = {GOOD}
    credentials.store(home, "openai", llm.base_url, "sk-revoked")
    prompt = {"sessionId": "${s.sessionId}", "prompt": [{"type": "text", "text": "hi"}]}
    out = run_script(
        {
            "capabilities": {"auth": {"terminal": True}},
            "steps": [
                {"request": "authenticate", "params": {"methodId": "crow-api-key"}, "as": "auth_ok"},
                {"request": "authenticate", "params": {"methodId": "nope"}, "as": "auth_unknown"},
                {"request": "authenticate", "params": {"methodId": "crow-login"}, "as": "auth_terminal"},
                {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "s"},
                {"request": "session/prompt", "params": prompt, "as": "refused"},
                {"request": "logout", "params": {}, "as": "logout"},
            ],
        },
        keyless_env(llm, home),  # a local server: a key is not required to authenticate
        workspace,
    )
    res = out["results"]
    init = res["initialize"]["result"]
    assert init["agentCapabilities"]["auth"] == {"logout": {}}
    assert [(m["id"], m.get("type")) for m in init["authMethods"]] == [
        ("crow-api-key", None),
        ("crow-login", "terminal"),
    ]
    assert res["auth_ok"] == {"result": {}}
    assert res["auth_unknown"]["error"]["code"] == -32602
    assert res["auth_terminal"]["error"]["code"] == -32602
    assert res["refused"]["error"]["code"] == -32000
    assert "Authentication required" in res["refused"]["error"]["message"]
    assert res["logout"] == {"result": {}}
    assert not (home / "credentials.json").exists()

    out = run_script(
        {"steps": [{"request": "authenticate", "params": {"methodId": "crow-api-key"}, "as": "missing"}]},
        hosted_env(home),
        workspace,
    )
    assert [m["id"] for m in out["results"]["initialize"]["result"]["authMethods"]] == ["crow-api-key"]
    missing = out["results"]["missing"]["error"]
    assert missing["code"] == -32000 and "OPENAI_API_KEY" in missing["message"]
