"""End to end: the builtin MCP tools as an editor sees them — titles, diffs, permission
prompts, plans, client MCP servers, editor fs and terminals."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import acp
import pytest
from acp.schema import (
    ClientCapabilities,
    EnvVariable,
    FileSystemCapabilities,
    McpServerStdio,
)

from tests.conftest import crow_env, spawn_crow
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec

pytestmark = pytest.mark.anyio
SUPPORT = Path(__file__).parent / "support"


def edit(path: str, old: str, new: str) -> Reply:
    return Reply(
        tool_calls=[
            ToolCallSpec(name="edit_file", arguments={"path": path, "old_text": old, "new_text": new})
        ]
    )


async def start(
    conn,
    workspace: Path,
    caps: ClientCapabilities | None = None,  # type: ignore[no-untyped-def]
    mcp_servers: list | None = None,
) -> str:
    await conn.initialize(protocol_version=1, client_capabilities=caps)
    return (await conn.new_session(cwd=str(workspace), mcp_servers=mcp_servers or [])).session_id


async def test_edit_asks_permission_and_arrives_as_a_diff(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (workspace / "app.py").write_text("x = 1\nprint(x)\n")
    llm.push(edit("app.py", "x = 1", "x = 2"), Reply(text="done"))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("bump x")])
    assert response.stop_reason == "end_turn"
    assert (workspace / "app.py").read_text() == "x = 2\nprint(x)\n"
    # the permission prompt showed the proposed change
    ((asked, options),) = client.permission_requests
    assert asked.title == "Edit app.py" and asked.kind == "edit"
    assert {o.kind for o in options} == {"allow_once", "allow_always", "reject_once", "reject_always"}
    assert asked.content[0].type == "diff"
    # the tool call: title, kind, location, then a diff of the whole file
    start_update = client.of_type("ToolCallStart")[0]
    assert start_update.title == "Edit app.py" and start_update.kind == "edit"
    assert start_update.locations[0].path == str(workspace / "app.py")
    done = client.of_type("ToolCallProgress")[-1]
    assert done.status == "completed"
    diff = done.content[0]
    assert (
        diff.type == "diff" and diff.old_text == "x = 1\nprint(x)\n" and diff.new_text == "x = 2\nprint(x)\n"
    )
    assert diff.path == str((workspace / "app.py").resolve())


async def test_rejection_reaches_the_model_and_always_holds(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (workspace / "a.txt").write_text("one\n")
    llm.push(edit("a.txt", "one", "two"), Reply(text="ok"), edit("a.txt", "one", "three"), Reply(text="ok"))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        client.permission_answer = "reject_always"
        await conn.prompt(session_id=sid, prompt=[acp.text_block("edit")])
        await conn.prompt(session_id=sid, prompt=[acp.text_block("edit again")])
    assert (workspace / "a.txt").read_text() == "one\n"
    assert len(client.permission_requests) == 1, "reject_always holds for the session"
    first = [m for m in llm.requests[1].messages if m["role"] == "tool"][-1]["content"]
    assert "declined" in first
    second = [m for m in llm.requests[3].messages if m["role"] == "tool"][-1]["content"]
    assert "rejected edit_file calls like this one" in second and "`edit_file(/a.txt)`" in second


async def test_yolo_mode_and_read_only_mode(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    llm.push(
        Reply(tool_calls=[ToolCallSpec(name="write_file", arguments={"path": "n.txt", "content": "hi"})]),
        Reply(text="ok"),
        Reply(tool_calls=[ToolCallSpec(name="write_file", arguments={"path": "m.txt", "content": "x"})]),
        Reply(text="ok"),
    )
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        await conn.set_session_mode(session_id=sid, mode_id="yolo")
        await conn.prompt(session_id=sid, prompt=[acp.text_block("write")])
        await conn.set_config_option(session_id=sid, config_id="mode", value="read_only")
        await conn.prompt(session_id=sid, prompt=[acp.text_block("write more")])
    assert (workspace / "n.txt").read_text() == "hi"
    assert not (workspace / "m.txt").exists()
    assert client.permission_requests == []
    last_tool = [m for m in llm.requests[3].messages if m["role"] == "tool"][-1]["content"]
    assert "read-only mode" in last_tool
    assert [u.current_mode_id for u in client.of_type("CurrentModeUpdate")] == ["yolo", "read_only"]


async def test_write_todos_sends_a_plan(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    todos = [
        {"id": "1", "title": "Read code", "status": "done"},
        {"id": "2", "title": "Fix bug", "status": "in_progress"},
        {"id": "3", "title": "Test", "status": "pending"},
    ]
    llm.push(
        Reply(tool_calls=[ToolCallSpec(name="write_todos", arguments={"todos": todos})]),
        Reply(text="planned"),
    )
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("plan")])
    plan = client.of_type("AgentPlanUpdate")[-1]
    assert [(e.content, e.status) for e in plan.entries] == [
        ("Read code", "completed"),
        ("Fix bug", "in_progress"),
        ("Test", "pending"),
    ]
    assert client.permission_requests == [], "write_todos only changes the plan"


async def test_client_stdio_mcp_server_tool_is_called(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    llm.push(Reply(tool_calls=[ToolCallSpec(name="shout", arguments={"text": "hey"})]), Reply(text="ok"))
    servers = [
        McpServerStdio(
            name="echo",
            command=sys.executable,
            args=[str(SUPPORT / "echo_mcp.py")],
            env=[EnvVariable(name="PYTHONPATH", value=str(SUPPORT))],
        ),
        McpServerStdio(name="broken", command="/nonexistent/server", args=[], env=[]),
    ]
    async with spawn_crow(crow_env(llm, home, CROW_MODE="yolo")) as (conn, _proc, client):
        sid = await start(conn, workspace, mcp_servers=servers)
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("shout")])
    assert response.stop_reason == "end_turn"
    assert "shout" in llm.requests[0].tool_names and "read_file" in llm.requests[0].tool_names
    tool = [m for m in llm.requests[1].messages if m["role"] == "tool"][-1]["content"]
    assert tool == "HEY"
    assert "'broken' failed to start" in client.text()


async def test_an_editor_server_named_like_crows_own_is_renamed_not_fatal(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """An editor MCP server named `filesystem` used to fail the session's preparation, and
    with it every prompt."""
    (workspace / "a.txt").write_text("hello\n")
    calls = [
        ToolCallSpec(name="shout", arguments={"text": "hey"}),
        ToolCallSpec(name="read_file", arguments={"path": "a.txt"}),
    ]
    llm.push(Reply(tool_calls=calls), Reply(text="ok"))
    server = McpServerStdio(
        name="filesystem",
        command=sys.executable,
        args=[str(SUPPORT / "echo_mcp.py")],
        env=[EnvVariable(name="PYTHONPATH", value=str(SUPPORT))],
    )
    async with spawn_crow(crow_env(llm, home, CROW_MODE="yolo")) as (conn, _proc, client):
        sid = await start(conn, workspace, mcp_servers=[server])
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("both")])
    assert response.stop_reason == "end_turn"
    results = [m["content"] for m in llm.requests[1].messages if m["role"] == "tool"]
    assert results == ["HEY", "[a.txt: lines 1-1 of 1]\n     1\thello"]
    assert (
        "MCP server 'filesystem': another server already has that name; it is connected as 'filesystem_2'"
        in client.text()
    )


async def test_escapes_are_refused(llm: ScriptedLLM, home: Path, workspace: Path, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("secret")
    (workspace / "link").symlink_to(tmp_path / "secret.txt")
    attempts = [
        "../secret.txt",
        str(tmp_path / "secret.txt"),
        "link",
        "/proc/self/root/etc/passwd",
        "/etc/passwd",
    ]
    llm.push(
        Reply(tool_calls=[ToolCallSpec(name="read_file", arguments={"path": p}) for p in attempts]),
        Reply(
            tool_calls=[ToolCallSpec(name="write_file", arguments={"path": "../evil.txt", "content": "x"})]
        ),
        Reply(text="ok"),
    )
    async with spawn_crow(crow_env(llm, home, CROW_MODE="yolo")) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("read")])
    results = [m["content"] for m in llm.requests[1].messages if m["role"] == "tool"]
    assert len(results) == len(attempts)
    assert all(
        "outside the workspace" in r and "secret" not in r.replace("secret.txt", "") for r in results
    ), results
    assert not (tmp_path / "evil.txt").exists()


def _alive_with(marker: str) -> list[int]:
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except OSError:
            continue
        if marker in cmd and state != "Z":
            pids.append(int(pid))
    return pids


async def test_timed_out_command_leaves_no_process(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    marker = "1234.5"
    llm.push(
        Reply(
            tool_calls=[
                ToolCallSpec(
                    name="execute", arguments={"command": f"sleep {marker} & sleep {marker}", "timeout": 1}
                )
            ]
        ),
        Reply(text="ok"),
    )
    async with spawn_crow(crow_env(llm, home, CROW_MODE="yolo")) as (conn, _proc, client):
        sid = await start(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("run")])
        assert _alive_with(f"sleep {marker}") == []
    start_update = client.of_type("ToolCallStart")[0]
    assert start_update.kind == "execute" and start_update.title.startswith("Run sleep")
    tool = [m for m in llm.requests[1].messages if m["role"] == "tool"][-1]["content"]
    assert "timed out" in tool


async def test_editor_fs_and_terminal_are_used_when_offered(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    path = str(workspace / "buf.py")
    (workspace / "buf.py").write_text("on disk\n")
    llm.push(
        Reply(
            tool_calls=[
                ToolCallSpec(name="read_file", arguments={"path": "buf.py"}),
                ToolCallSpec(name="write_file", arguments={"path": "new/made.txt", "content": "fresh"}),
                ToolCallSpec(name="read_file", arguments={"path": "missing.txt"}),
            ]
        ),
        edit("buf.py", "unsaved", "edited"),
        Reply(tool_calls=[ToolCallSpec(name="execute", arguments={"command": "echo from-terminal"})]),
        Reply(text="ok"),
    )
    caps = ClientCapabilities(
        fs=FileSystemCapabilities(read_text_file=True, write_text_file=True), terminal=True
    )
    # sandbox off: a sandboxed session runs commands locally under bubblewrap, never in the
    # editor's terminal (test_sandbox.py); this test is about the terminal.
    env = crow_env(llm, home, CROW_MODE="yolo", CROW_SANDBOX="off")
    async with spawn_crow(env) as (conn, _proc, client):
        client.files[path] = "unsaved buffer\n"
        sid = await start(conn, workspace, caps)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
    results = {m["tool_call_id"]: m["content"] for m in llm.requests[1].messages if m["role"] == "tool"}
    read, wrote, missing = (results[c["id"]] for c in llm.requests[1].messages[-4]["tool_calls"])
    assert "unsaved buffer" in read, "read_file sees the editor's buffer"
    assert client.files[str(workspace / "new" / "made.txt")] == "fresh", wrote
    assert missing == "Error: missing.txt does not exist"
    assert client.files[path] == "edited buffer\n"
    assert (workspace / "buf.py").read_text() == "on disk\n", "the edit went through the editor"
    ran = [m for m in llm.requests[3].messages if m["role"] == "tool"][-1]["content"]
    assert "from-terminal" in ran
    terminal_updates = [
        c for u in client.of_type("ToolCallProgress") for c in (u.content or []) if c.type == "terminal"
    ]
    assert terminal_updates and client.released == [terminal_updates[0].terminal_id]
