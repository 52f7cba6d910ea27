"""crow's wire against the official ACP schema 1.25 (`tests.support.acp_schema`).

Every crow spawned by `tests.conftest.spawn_crow` has its messages validated when it ends;
these tests prove the check itself can fail, and run one session that touches most update
kinds with a client advertising everything schema 1.25 adds.
"""

from __future__ import annotations

import os
from pathlib import Path

import acp
import pytest

from tests.conftest import FEATURES_125, crow_env, initialize_125, spawn_crow
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec
from tests.support import acp_schema

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def schema_available() -> None:
    if isinstance(reason := acp_schema.schemas(), str):
        if os.environ.get("CI"):
            pytest.fail(f"CI must check conformance: {reason}")
        pytest.skip(reason)


def _update(update: dict) -> tuple[str, dict]:
    return (
        "in",
        {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s", "update": update}},
    )


def test_the_check_refuses_broken_messages() -> None:
    good = _update({"sessionUpdate": "usage_update", "used": 1, "size": 10})
    assert acp_schema.violations([good]) == []
    broken = [
        _update({"sessionUpdate": "usage_update", "used": 1}),  # size missing
        _update({"sessionUpdate": "tool_call", "toolCallId": "t", "title": "x", "locations": [{"line": 1}]}),
        _update({"sessionUpdate": "notice", "severity": "info", "title": ""}),  # empty title
        _update({"sessionUpdate": "compaction_update", "status": "completed"}),  # no id
        ("in", {"jsonrpc": "2.0", "method": "session/made_up", "params": {}}),
        ("in", {"jsonrpc": "2.0", "id": 7, "result": {}}),  # answers nothing asked
        ("in", {"jsonrpc": "2.0", "id": 8, "error": {"message": "no code"}}),
    ]
    asked = ("out", {"jsonrpc": "2.0", "id": 8, "method": "session/new", "params": {}})
    for message in broken:
        found = acp_schema.violations([asked, message])
        assert found, message


def test_a_response_is_checked_against_its_request_method() -> None:
    asked = ("out", {"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {}})
    assert (
        acp_schema.violations([asked, ("in", {"jsonrpc": "2.0", "id": 1, "result": {"sessionId": "a"}})])
        == []
    )
    assert acp_schema.violations([asked, ("in", {"jsonrpc": "2.0", "id": 1, "result": {}})])


async def test_a_session_with_every_feature_advertised_conforms(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (workspace / "notes.txt").write_text("hello\n")
    llm.push(
        Reply(
            text="Reading.",
            reasoning="let me look",
            tool_calls=[ToolCallSpec("read_file", {"path": "notes.txt"})],
        ),
        Reply(text="It says hello."),
        Reply(text="SUMMARY: read notes.txt."),
    )
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await initialize_125(conn)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        await conn.prompt(session_id=sid, prompt=[acp.text_block("what is in notes.txt?")])
        await conn.ext_method("crow.compact", {"sessionId": sid})
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        await conn.list_sessions()
    assert client.wire is not None
    kinds = {
        m["params"]["update"]["sessionUpdate"]
        for d, m in client.wire.messages
        if m.get("method") == "session/update"
    }
    assert {
        "agent_message_chunk",
        "agent_thought_chunk",
        "tool_call",
        "usage_update",
        "user_message_chunk",
    } <= kinds
    assert client.wire.violations() == []


async def test_client_fs_terminal_and_permission_calls_conform(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """crow's requests to the client (fs/*, terminal/*, session/request_permission) and the
    updates around them, with every 1.25 feature and the client's fs and terminal on."""
    (workspace / "a.txt").write_text("old\n")
    llm.push(
        Reply(tool_calls=[ToolCallSpec("read_file", {"path": "a.txt"})]),
        Reply(tool_calls=[ToolCallSpec("write_file", {"path": "a.txt", "content": "new\n"})]),
        Reply(tool_calls=[ToolCallSpec("execute", {"command": "echo hi"})]),
        Reply(text="done"),
    )
    caps = {**FEATURES_125, "fs": {"readTextFile": True, "writeTextFile": True}, "terminal": True}
    async with spawn_crow(crow_env(llm, home, CROW_SANDBOX="off")) as (conn, _proc, client):
        await initialize_125(conn, caps)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
    assert client.wire is not None
    sent = {m.get("method") for d, m in client.wire.messages if d == "in"}
    assert {
        "fs/read_text_file",
        "fs/write_text_file",
        "session/request_permission",
        "terminal/create",
    } <= sent
    assert client.wire.violations() == []


def test_an_answer_must_match_one_request_once() -> None:
    """An error is an answer too: to a request the client sent, once. A second answer, an
    answer to a notification, or one with both result and error is a violation."""
    asked = ("out", {"jsonrpc": "2.0", "id": 3, "method": "session/new", "params": {}})
    told = ("out", {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s"}})
    error = {"code": -32602, "message": "Invalid params"}
    answer = ("in", {"jsonrpc": "2.0", "id": 3, "result": {"sessionId": "a"}})
    assert acp_schema.violations([asked, answer]) == []
    assert acp_schema.violations([asked, ("in", {"jsonrpc": "2.0", "id": 3, "error": error})]) == []
    # A parse error answers no id: JSON-RPC's null.
    assert acp_schema.violations([("in", {"jsonrpc": "2.0", "id": None, "error": error})]) == []
    broken = [
        [asked, answer, answer],  # answered twice
        [asked, ("in", {"jsonrpc": "2.0", "id": 3, "error": error}), answer],
        [told, ("in", {"jsonrpc": "2.0", "id": 9, "error": error})],  # an error to a notification
        [asked, ("in", {"jsonrpc": "2.0", "id": 3, "result": {"sessionId": "a"}, "error": error})],
        [asked, ("in", {"jsonrpc": "2.0", "id": 3})],  # neither result nor error
    ]
    for messages in broken:
        assert acp_schema.violations(messages), messages


def test_a_request_and_a_notification_are_not_interchangeable() -> None:
    """`session/update` is a notification and `session/request_permission` a request: the
    same params sent the other way are a message the client cannot handle."""
    update = {"sessionId": "s", "update": {"sessionUpdate": "usage_update", "used": 1, "size": 10}}
    asking = {
        "sessionId": "s",
        "toolCall": {"toolCallId": "t"},
        "options": [{"optionId": "a", "name": "Allow", "kind": "allow_once"}],
    }
    sent = [
        {"jsonrpc": "2.0", "method": "session/update", "params": update},
        {"jsonrpc": "2.0", "id": 0, "method": "session/request_permission", "params": asking},
    ]
    assert acp_schema.violations([("in", m) for m in sent]) == []
    swapped = [
        {"jsonrpc": "2.0", "id": 0, "method": "session/update", "params": update},
        {"jsonrpc": "2.0", "method": "session/request_permission", "params": asking},
    ]
    for message in swapped:
        assert acp_schema.violations([("in", message)]), message
