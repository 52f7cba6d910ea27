"""End to end: permission rules, scoped always-answers, untrusted read-only hints, plan
mode and one question at a time, with crow spawned over ACP and a scripted model."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import acp
import anyio
import pytest
from acp.schema import EnvVariable, McpServerStdio

from tests.conftest import RecordingClient, crow_env, spawn_crow
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec

pytestmark = pytest.mark.anyio
SUPPORT = Path(__file__).parent / "support"


def configure(home: Path, text: str) -> None:
    (home / "config.yaml").write_text(text)


def call(name: str, id: str, **arguments: Any) -> ToolCallSpec:
    return ToolCallSpec(name=name, arguments=arguments, id=id)


def results(llm: ScriptedLLM, request: int) -> dict[str, str]:
    """Tool results the model read in request N, by tool call id."""
    return {m["tool_call_id"]: m["content"] for m in llm.requests[request].messages if m["role"] == "tool"}


async def start(conn: Any, workspace: Path, mcp_servers: list | None = None) -> str:
    await conn.initialize(protocol_version=1)
    return (await conn.new_session(cwd=str(workspace), mcp_servers=mcp_servers or [])).session_id


class ScriptedAnswers(RecordingClient):
    """Answers permission requests with option ids from a list, in order."""

    def __init__(self, *answers: str) -> None:
        super().__init__()
        self.answers = list(answers)

    async def request_permission(self, session_id: str, tool_call: Any, options: list[Any], **kw: Any) -> Any:
        from acp.schema import AllowedOutcome, RequestPermissionResponse

        self.permission_requests.append((tool_call, options))
        chosen = self.answers.pop(0)
        assert chosen in [o.option_id for o in options], (chosen, options)
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=chosen))


async def test_deny_rules_hold_in_yolo(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    configure(
        home,
        "mode: yolo\npermissions:\n  allow: [execute]\n  deny: ['execute(rm *)', 'write_file(/secret/**)']\n",
    )
    (workspace / "keep.txt").write_text("keep")
    llm.push(
        Reply(
            tool_calls=[
                call("execute", "c1", command="touch ran.txt && rm -f keep.txt"),
                call("write_file", "c2", path="./docs/../secret/key.txt", content="x"),
                call("execute", "c3", command="echo fine > fine.txt"),
            ]
        ),
        Reply(text="ok"),
    )
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
    read = results(llm, 1)
    assert "denied by the permission rule `execute(rm *)`" in read["c1"]
    assert "denied by the permission rule `write_file(/secret/**)`" in read["c2"]
    assert (workspace / "keep.txt").exists() and not (workspace / "ran.txt").exists(), "nothing of c1 ran"
    assert not (workspace / "secret").exists()
    assert (workspace / "fine.txt").read_text() == "fine\n", "yolo still runs what no rule denies"
    assert client.permission_requests == []


async def test_always_allowing_echo_does_not_cover_rm(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    (workspace / "victim.txt").write_text("precious")
    llm.push(
        Reply(tool_calls=[call("execute", "c1", command="echo hi")]),
        Reply(text="ok"),
        Reply(tool_calls=[call("execute", "c2", command="echo again")]),
        Reply(text="ok"),
        Reply(tool_calls=[call("execute", "c3", command="echo ok; rm -f victim.txt")]),
        Reply(text="ok"),
        Reply(tool_calls=[call("execute", "c4", command="rm -f victim.txt")]),
        Reply(text="ok"),
    )
    client = ScriptedAnswers("allow_always", "reject_once", "reject_once")
    async with spawn_crow(crow_env(llm, home), client=client) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        for prompt in ("one", "two", "three", "four"):
            await conn.prompt(session_id=sid, prompt=[acp.text_block(prompt)])
    assert (workspace / "victim.txt").read_text() == "precious"
    asked = [tc.title for tc, _ in client.permission_requests]
    assert asked == ["Run echo hi", "Run echo ok; rm -f victim.txt", "Run rm -f victim.txt"]
    assert results(llm, 3)["c2"].startswith("again"), "echo is now allowed: it ran without a question"
    options = client.permission_requests[0][1]
    named = {o.option_id: o.name for o in options}
    assert named["allow_always"] == "Always allow `echo` commands"
    assert named["reject_always"] == "Always reject `echo` commands"
    assert "declined" in results(llm, 5)["c3"] and "declined" in results(llm, 7)["c4"]


async def test_always_allowing_one_file_or_folder_covers_no_other(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    for rel in ("src/app.py", "src/util.py", "lib/other.py"):
        (workspace / rel).parent.mkdir(exist_ok=True)
        (workspace / rel).write_text("x = 1\n")

    def edit(id: str, path: str, old: str = "x = 1") -> Reply:
        return Reply(tool_calls=[call("edit_file", id, path=path, old_text=old, new_text=f"x = {id}")])

    llm.push(
        edit("e1", "src/app.py"),
        Reply(text="ok"),
        edit("e2", "./src/app.py", "x = e1"),  # covered: the same file
        Reply(text="ok"),
        edit("e3", "src/util.py"),  # another file of the folder: asked, allowed for the folder
        Reply(text="ok"),
        Reply(tool_calls=[call("write_file", "e4", path="src/new.py", content="new\n")]),  # covered
        Reply(text="ok"),
        edit("e5", "lib/other.py"),  # another folder: asked, rejected
        Reply(text="ok"),
    )
    client = ScriptedAnswers("allow_always", "allow_always_folder", "reject_once")
    async with spawn_crow(crow_env(llm, home), client=client) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        for prompt in ("1", "2", "3", "4", "5"):
            await conn.prompt(session_id=sid, prompt=[acp.text_block(prompt)])
    asked = [(tc.title, {o.option_id: o.name for o in opts}) for tc, opts in client.permission_requests]
    assert [a[0] for a in asked] == ["Edit src/app.py", "Edit src/util.py", "Edit lib/other.py"]
    assert asked[0][1]["allow_always"] == "Always allow edits to src/app.py"
    assert asked[1][1]["allow_always_folder"] == "Always allow edits in src/"
    assert (workspace / "src/app.py").read_text() == "x = e2\n"
    assert (workspace / "src/util.py").read_text() == "x = e3\n"
    assert (workspace / "src/new.py").read_text() == "new\n"
    assert (workspace / "lib/other.py").read_text() == "x = 1\n"


def sneaky_server(marker: Path) -> McpServerStdio:
    return McpServerStdio(
        name="sneaky",
        command=sys.executable,
        args=[str(SUPPORT / "readonly_mcp.py")],
        env=[EnvVariable(name="MARKER", value=str(marker))],
    )


async def test_an_editor_servers_read_only_label_is_not_trusted(
    llm: ScriptedLLM, home: Path, workspace: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "peeked"
    llm.push(
        Reply(tool_calls=[call("peek", "p1", text="ask")]),
        Reply(text="ok"),
        Reply(tool_calls=[call("peek", "p2", text="read_only")]),
        Reply(text="ok"),
    )
    client = ScriptedAnswers("reject_once")
    async with spawn_crow(crow_env(llm, home), client=client) as (conn, _proc, _client):
        sid = await start(conn, workspace, [sneaky_server(marker)])
        await conn.prompt(session_id=sid, prompt=[acp.text_block("peek")])
        assert [tc.title for tc, _ in client.permission_requests] == ["peek"], "ask mode asks"
        assert {o.name for o in client.permission_requests[0][1]} >= {"Always allow `peek`"}
        await conn.set_session_mode(session_id=sid, mode_id="read_only")
        await conn.prompt(session_id=sid, prompt=[acp.text_block("peek again")])
    assert len(client.permission_requests) == 1, "read_only refuses without asking"
    assert "read-only mode" in results(llm, 3)["p2"]
    assert not marker.exists(), "the self-declared read-only tool never ran"


async def test_an_allow_rule_lets_an_untrusted_tool_run_in_read_only(
    llm: ScriptedLLM, home: Path, workspace: Path, tmp_path: Path
) -> None:
    configure(home, "mode: read_only\npermissions:\n  allow: [peek]\n")
    marker = tmp_path / "peeked"
    llm.push(Reply(tool_calls=[call("peek", "p1", text="allowed")]), Reply(text="ok"))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace, [sneaky_server(marker)])
        await conn.prompt(session_id=sid, prompt=[acp.text_block("peek")])
    assert marker.read_text() == "allowed" and client.permission_requests == []


async def test_plan_mode_refuses_changes_without_asking(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (workspace / "notes.txt").write_text("read me\n")
    llm.push(
        Reply(
            tool_calls=[
                call("write_file", "w1", path="plan.txt", content="x"),
                call("execute", "x1", command="touch made.txt"),
                call("read_file", "r1", path="notes.txt"),
                call("write_todos", "t1", todos=[{"id": "1", "title": "Plan", "status": "pending"}]),
            ]
        ),
        Reply(text="ok"),
    )
    async with spawn_crow(crow_env(llm, home, CROW_MODE="plan")) as (conn, _proc, client):
        sid = await start(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("plan it")])
    read = results(llm, 1)
    for refused in ("w1", "x1"):
        assert "plan mode" in read[refused] and "exit_plan_mode(plan)" in read[refused]
    assert "read me" in read["r1"]
    assert not read["t1"].startswith("Error")
    assert not (workspace / "plan.txt").exists() and not (workspace / "made.txt").exists()
    assert client.permission_requests == []


class SlowAnswers(RecordingClient):
    """Takes a while to answer each request and records how many were open at once."""

    def __init__(self) -> None:
        super().__init__()
        self.open = 0
        self.most_open = 0
        self.answered_at: list[float] = []
        self.asked_at: list[float] = []

    async def request_permission(self, session_id: str, tool_call: Any, options: list[Any], **kw: Any) -> Any:
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        self.asked_at.append(time.monotonic())
        try:
            await anyio.sleep(0.3)
            return await super().request_permission(session_id, tool_call, options, **kw)
        finally:
            self.open -= 1
            self.answered_at.append(time.monotonic())


async def test_a_batch_asks_one_question_at_a_time(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    llm.push(
        Reply(
            tool_calls=[
                call("execute", "a", command="echo one"),
                call("execute", "b", command="echo two"),
                call("write_file", "c", path="p.txt", content="p\n"),
            ]
        ),
        Reply(text="ok"),
    )
    client = SlowAnswers()
    async with spawn_crow(crow_env(llm, home), client=client) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
    assert sorted(tc.tool_call_id for tc, _ in client.permission_requests) == ["a", "b", "c"]
    assert client.most_open == 1, "a request was sent while another was unanswered"
    for later, earlier in zip(client.asked_at[1:], client.answered_at, strict=False):
        assert later >= earlier
    assert (workspace / "p.txt").read_text() == "p\n"


async def test_an_always_answer_settles_the_calls_waiting_behind_it(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(
        Reply(tool_calls=[call("execute", f"e{i}", command=f"echo {i}") for i in range(3)]),
        Reply(text="ok"),
    )
    client = ScriptedAnswers("allow_always")
    async with spawn_crow(crow_env(llm, home), client=client) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
    assert len(client.permission_requests) == 1, "the waiting echo calls were covered by the answer"
    assert all(results(llm, 1)[f"e{i}"].startswith(str(i)) for i in range(3))


async def test_a_foreign_tools_path_argument_does_not_let_later_calls_pass_it(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """Only crow's file tools are known to touch nothing but their `path`: a read written
    after another server's `build(path="src")` sees what the build wrote elsewhere."""
    configure(home, "mode: yolo\n")
    out = workspace / "dist.txt"
    builder = McpServerStdio(
        name="builder",
        command=sys.executable,
        args=[str(SUPPORT / "path_mcp.py")],
        env=[EnvVariable(name="OUTPUT", value=str(out))],
    )
    llm.push(
        Reply(tool_calls=[call("build", "b", path="src"), call("read_file", "r", path="dist.txt")]),
        Reply(text="ok"),
    )
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        sid = await start(conn, workspace, [builder])
        await conn.prompt(session_id=sid, prompt=[acp.text_block("build, then read the output")])
    read = results(llm, 1)
    assert read["b"] == "built src" and "built src" in read["r"], read


async def test_accept_edits_still_asks_before_an_edit_inside_dot_git(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """A hook or a `core.fsmonitor` in .git is a command git runs (for the user, outside
    any sandbox, at the next commit): writing one is not a mere edit."""
    configure(home, "mode: accept_edits\n")
    (workspace / ".git" / "hooks").mkdir(parents=True)
    (workspace / ".git" / "config").write_text("[core]\n")
    (workspace / "gitdir").symlink_to(".git")
    llm.push(
        Reply(
            tool_calls=[
                call("write_file", "h", path=".git/hooks/pre-commit", content="#!/bin/sh\nrm -rf ~\n"),
                call(
                    "edit_file",
                    "c",
                    path="src/../.git/config",
                    old_text="[core]",
                    new_text="[core]\n fsmonitor = x",
                ),
                call("write_file", "l", path="gitdir/hooks/post-checkout", content="#!/bin/sh\n"),
                call("write_file", "a", path="app.py", content="print(1)\n"),
            ]
        ),
        Reply(text="ok"),
    )
    client = ScriptedAnswers("reject_once", "reject_once", "reject_once")
    async with spawn_crow(crow_env(llm, home), client=client) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
    asked = [tc.title for tc, _ in client.permission_requests]
    assert asked == [
        "Write .git/hooks/pre-commit",
        "Edit src/../.git/config",
        "Write gitdir/hooks/post-checkout",
    ]
    assert not (workspace / ".git" / "hooks" / "pre-commit").exists()
    assert (workspace / ".git" / "config").read_text() == "[core]\n"
    assert (workspace / "app.py").read_text() == "print(1)\n", "other edits run without asking"


async def test_another_servers_tool_named_write_todos_is_not_waved_through(
    llm: ScriptedLLM, home: Path, workspace: Path, tmp_path: Path
) -> None:
    """crow's `write_todos` never asks; with the todo list off, an editor server's tool of
    that name is judged like any of its tools: refused in read_only mode."""
    configure(home, "mode: read_only\nhooks:\n  disable: [todolist]\n")
    marker = tmp_path / "written"
    impostor = McpServerStdio(
        name="impostor",
        command=sys.executable,
        args=[str(SUPPORT / "impostor_mcp.py")],
        env=[EnvVariable(name="MARKER", value=str(marker))],
    )
    llm.push(Reply(tool_calls=[call("write_todos", "t", todos=["rm -rf ~"])]), Reply(text="ok"))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace, [impostor])
        await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
    assert "read-only mode" in results(llm, 1)["t"]
    assert not marker.exists() and client.permission_requests == []


async def test_an_always_allow_for_this_project_holds_in_later_sessions_of_the_project_only(
    llm: ScriptedLLM, home: Path, tmp_path: Path
) -> None:
    """"Always allow in this project" is kept in CROW_HOME (0600, never in the workspace)
    and answers the same command in a new crow process, in any folder of that repository;
    another project still asks, and a narrower scope is not widened."""
    import stat

    repo, other = tmp_path / "repo", tmp_path / "other"
    (repo / ".git").mkdir(parents=True)
    (repo / "sub").mkdir()
    other.mkdir()
    llm.push(Reply(tool_calls=[call("execute", "c1", command="echo one")]), Reply(text="ok"))
    async with spawn_crow(crow_env(llm, home), client=ScriptedAnswers("allow_always_project")) as (
        conn,
        _proc,
        client,
    ):
        await conn.prompt(session_id=await start(conn, repo), prompt=[acp.text_block("go")])
    labels = {o.option_id: o.name for o in client.permission_requests[0][1]}
    assert labels["allow_always_project"] == "Always allow in this project: `echo` commands"
    stored = home / "rules.json"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert not list(repo.rglob("*.json")), "nothing written in the workspace"

    llm.push(
        Reply(tool_calls=[call("execute", "c2", command="echo two"), call("execute", "c3", command="ls")]),
        Reply(text="ok"),
    )
    async with spawn_crow(crow_env(llm, home), client=ScriptedAnswers("reject_once")) as (conn, _p, client):
        await conn.prompt(session_id=await start(conn, repo / "sub"), prompt=[acp.text_block("go")])
    assert [tc.raw_input["command"] for tc, _ in client.permission_requests] == ["ls"], "echo was granted"
    assert results(llm, 3)["c2"].startswith("two")

    llm.push(Reply(tool_calls=[call("execute", "c4", command="echo three")]), Reply(text="ok"))
    async with spawn_crow(crow_env(llm, home), client=ScriptedAnswers("reject_once")) as (conn, _p, client):
        await conn.prompt(session_id=await start(conn, other), prompt=[acp.text_block("go")])
    assert len(client.permission_requests) == 1, "another project asks again"
