"""End to end: the details an editor such as Zed renders. Every `tool_call` names its tool;
every path in a diff or a location is absolute (the permission question's included); a call
stays `pending` until it is approved; a cancelled editor terminal is killed and released;
`session/load` shows a terminal command's output, not a terminal that no longer exists."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import acp
import anyio
import pytest
import yaml
from acp.schema import ClientCapabilities

from tests.conftest import RecordingClient, crow_env, spawn_crow
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec
from tests.support.ts_client import run_script

pytestmark = pytest.mark.anyio
SUPPORT = Path(__file__).parent / "support"


def call(name: str, id: str, **arguments: Any) -> ToolCallSpec:
    return ToolCallSpec(name=name, arguments=arguments, id=id)


def crow_wrote(client: RecordingClient) -> list[dict[str, Any]]:
    """Every request and notification crow wrote, as JSON, in order."""
    assert client.wire is not None
    return [m for direction, m in client.wire.messages if direction == "in" and "method" in m]


def as_timeline(messages: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(m["method"], m["params"]) for m in messages]


def shown_paths(value: Any) -> Iterator[str]:
    """Every path a diff or a location shows, anywhere in `value`."""
    if isinstance(value, dict):
        if value.get("type") == "diff":
            yield value["path"]
        for location in value.get("locations") or ():
            yield location["path"]
        for v in value.values():
            yield from shown_paths(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from shown_paths(v)


def story(timeline: list[tuple[str, dict[str, Any]]], call_id: str) -> list[str]:
    """What the client saw of one tool call, in order: `tool_call:<status>`,
    `update:<status>` (updates that set one) and `permission`."""
    seen = []
    for method, params in timeline:
        if method == "session/request_permission" and params["toolCall"]["toolCallId"] == call_id:
            seen.append("permission")
        elif method == "session/update" and params["update"].get("toolCallId") == call_id:
            update = params["update"]
            if update["sessionUpdate"] == "tool_call":
                seen.append(f"tool_call:{update.get('status')}")
            elif update.get("status"):
                seen.append(f"update:{update['status']}")
    return seen


def tool_calls(timeline: list[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The `tool_call` updates by id."""
    return {
        p["update"]["toolCallId"]: p["update"]
        for method, p in timeline
        if method == "session/update" and p["update"]["sessionUpdate"] == "tool_call"
    }


def final_updates(timeline: list[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The last `tool_call_update` with a status, by id."""
    return {
        p["update"]["toolCallId"]: p["update"]
        for method, p in timeline
        if method == "session/update"
        and p["update"]["sessionUpdate"] == "tool_call_update"
        and p["update"].get("status")
    }


async def start(conn: Any, workspace: Path, caps: ClientCapabilities | None = None) -> str:
    await conn.initialize(protocol_version=1, client_capabilities=caps)
    return (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id


def edits(workspace: Path) -> list[Reply]:
    """A write and an edit (each asks), a read (no question), then an answer; the paths are
    relative, one of them roundabout."""
    (workspace / "src").mkdir()
    return [
        Reply(tool_calls=[call("write_file", "w1", path="src/new.py", content="x = 1\n")]),
        Reply(
            tool_calls=[call("edit_file", "e1", path="src/../src/new.py", old_text="x = 1", new_text="x = 2")]
        ),
        Reply(tool_calls=[call("read_file", "r1", path="./src/new.py", offset=0)]),
        Reply(text="done"),
    ]


NAMES = {"w1": "write_file", "e1": "edit_file", "r1": "read_file"}


async def test_tool_calls_are_named_and_every_path_is_absolute_live_and_replayed(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(*edits(workspace))
    target = str(workspace / "src" / "new.py")
    env = crow_env(llm, home)
    async with spawn_crow(env) as (conn, _proc, client):
        sid = await start(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
        live = as_timeline(crow_wrote(client))
    assert (workspace / "src" / "new.py").read_text() == "x = 2\n"
    assert {i: u["name"] for i, u in tool_calls(live).items()} == NAMES
    for call_id in ("w1", "e1"):
        assert story(live, call_id) == [
            "tool_call:pending",
            "permission",
            "update:in_progress",
            "update:completed",
        ]
    asked = {p["toolCall"]["toolCallId"]: p["toolCall"] for m, p in live if m == "session/request_permission"}
    assert sorted(asked) == ["e1", "w1"]
    for question in asked.values():  # the preview shows the file by its absolute path
        (diff,) = [c for c in question["content"] if c["type"] == "diff"]
        assert diff["path"] == target
        assert [loc["path"] for loc in question["locations"]] == [target]
    finals = final_updates(live)
    for call_id in ("w1", "e1"):
        (diff,) = [c for c in finals[call_id]["content"] if c["type"] == "diff"]
        assert diff["path"] == target
    assert tool_calls(live)["r1"]["locations"] == [{"path": target, "line": 1}]
    paths = list(shown_paths(live))
    assert len(paths) >= 7 and all(os.path.isabs(p) for p in paths), paths

    async with spawn_crow(env) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        replayed = as_timeline(crow_wrote(client))
    calls = tool_calls(replayed)
    assert {i: u["name"] for i, u in calls.items()} == NAMES
    for call_id in ("w1", "e1"):
        (diff,) = [c for c in calls[call_id]["content"] if c["type"] == "diff"]
        assert diff["path"] == target
        assert [loc["path"] for loc in calls[call_id]["locations"]] == [target]
    paths = list(shown_paths(replayed))
    assert len(paths) >= 5 and all(os.path.isabs(p) for p in paths), paths


async def test_a_call_stays_pending_until_it_is_approved(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(
        Reply(tool_calls=[call("execute", "allowed", command="echo allowed")]),
        Reply(text="ok"),
        Reply(tool_calls=[call("execute", "rejected", command="echo rejected")]),
        Reply(text="ok"),
        Reply(tool_calls=[call("read_file", "free", path="a.txt")]),
        Reply(text="ok"),
    )
    (workspace / "a.txt").write_text("alpha\n")
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("allow this one")])
        client.permission_answer = "reject_once"
        await conn.prompt(session_id=sid, prompt=[acp.text_block("reject this one")])
        await conn.prompt(session_id=sid, prompt=[acp.text_block("a read needs no question")])
        timeline = as_timeline(crow_wrote(client))
    assert story(timeline, "allowed") == [
        "tool_call:pending",
        "permission",
        "update:in_progress",
        "update:completed",
    ]
    assert story(timeline, "rejected") == ["tool_call:pending", "permission", "update:failed"]
    assert story(timeline, "free") == ["tool_call:pending", "update:in_progress", "update:completed"]


class TerminalLog(RecordingClient):
    """Records the terminal methods crow calls, in order, as (method, terminal id);
    `waiting` is set once crow waits for a command to end, `output_read` once it read one's
    output."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []
        self.waiting = anyio.Event()
        self.output_read = anyio.Event()

    async def create_terminal(self, command: str, session_id: str, **kwargs: Any) -> Any:
        created = await super().create_terminal(command, session_id, **kwargs)
        self.calls.append(("create", created.terminal_id))
        return created

    async def wait_for_terminal_exit(self, session_id: str, terminal_id: str, **kwargs: Any) -> Any:
        self.waiting.set()
        return await super().wait_for_terminal_exit(session_id, terminal_id, **kwargs)

    async def terminal_output(self, session_id: str, terminal_id: str, **kwargs: Any) -> Any:
        output = await super().terminal_output(session_id, terminal_id, **kwargs)
        self.output_read.set()
        return output

    async def kill_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> Any:
        self.calls.append(("kill", terminal_id))
        return await super().kill_terminal(session_id, terminal_id, **kwargs)

    async def release_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> Any:
        self.calls.append(("release", terminal_id))
        return await super().release_terminal(session_id, terminal_id, **kwargs)


# commands run in the editor's terminal only without a sandbox (the editor cannot run bwrap)
TERMINAL_ENV = {"CROW_MODE": "yolo", "CROW_SANDBOX": "off"}


async def test_a_cancel_while_a_terminal_command_runs_kills_then_releases_it(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Reply(tool_calls=[call("execute", "slow", command="sleep 30")]), Reply(text="still here"))
    client = TerminalLog()
    async with spawn_crow(crow_env(llm, home, **TERMINAL_ENV), client=client) as (conn, _proc, _client):
        sid = await start(conn, workspace, ClientCapabilities(terminal=True))
        async with anyio.create_task_group() as tg:
            outcome: list[Any] = []

            async def prompt() -> None:
                outcome.append(await conn.prompt(session_id=sid, prompt=[acp.text_block("wait")]))

            tg.start_soon(prompt)
            with anyio.fail_after(20):  # the command runs in the editor's terminal
                await client.waiting.wait()
            await anyio.sleep(0.2)
            await conn.cancel(session_id=sid)
        (tid,) = client.terminals
        assert outcome[0].stop_reason == "cancelled"
        assert client.calls == [("create", tid), ("kill", tid), ("release", tid)]
        assert client.terminals[tid].returncode is not None, "the command was killed"
        assert story(as_timeline(crow_wrote(client)), "slow")[-1] == "update:failed"
        again = await conn.prompt(session_id=sid, prompt=[acp.text_block("still there?")])
    assert again.stop_reason == "end_turn" and client.text().endswith("still here")


async def test_a_terminal_whose_result_a_cancel_kept_from_the_editor_is_released_at_the_end_of_the_prompt(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """The command ended and its output was read, but the turn was cancelled before the
    result was shown (a hook held it): no result will name the terminal, the prompt's end
    releases it."""
    config = home / "test-config.yaml"
    config.write_text(yaml.safe_dump({"hooks": {"extra": ["detail_plugins:HoldResult"]}}))
    llm.push(Reply(tool_calls=[call("execute", "quick", command="echo quick")]))
    client = TerminalLog()
    env = crow_env(llm, home, PYTHONPATH=str(SUPPORT), **TERMINAL_ENV)
    async with spawn_crow(env, "--config", str(config), client=client) as (conn, _proc, _client):
        sid = await start(conn, workspace, ClientCapabilities(terminal=True))
        async with anyio.create_task_group() as tg:
            tg.start_soon(conn.prompt, sid, [acp.text_block("run it")])
            with anyio.fail_after(20):
                await client.output_read.wait()
            await anyio.sleep(0.3)  # the result is held by the hook now
            await conn.cancel(session_id=sid)
    (tid,) = client.terminals
    assert client.calls == [("create", tid), ("release", tid)]
    assert story(as_timeline(crow_wrote(client)), "quick")[-1] == "update:failed"


async def test_a_replayed_terminal_command_shows_its_output_not_a_dead_terminal(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Reply(tool_calls=[call("execute", "echo", command="echo from-terminal")]), Reply(text="ok"))
    env = crow_env(llm, home, **TERMINAL_ENV)
    client = TerminalLog()
    async with spawn_crow(env, client=client) as (conn, _proc, _client):
        sid = await start(conn, workspace, ClientCapabilities(terminal=True))
        await conn.prompt(session_id=sid, prompt=[acp.text_block("echo")])
        live = final_updates(as_timeline(crow_wrote(client)))["echo"]
    (tid,) = client.terminals
    assert [c["type"] for c in live["content"]][0] == "terminal" and live["content"][0]["terminalId"] == tid
    assert client.calls == [("create", tid), ("release", tid)], "released once it was shown"
    async with spawn_crow(env, client=TerminalLog()) as (conn, _proc, client):
        await conn.initialize(protocol_version=1, client_capabilities=ClientCapabilities(terminal=True))
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        replayed = tool_calls(as_timeline(crow_wrote(client)))["echo"]
    assert replayed["status"] == "completed"
    assert [c["type"] for c in replayed["content"]] == ["content"]
    assert "from-terminal" in replayed["content"][0]["content"]["text"]


# ------------------------------------------------------------------ the TypeScript client


def ts_timeline(out: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(m["method"], m["params"]) for m in out["timeline"]]


def test_the_typescript_client_sees_named_calls_absolute_paths_and_pending_until_approved(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    replies = edits(workspace)
    llm.push(
        *replies[:2],
        Reply(tool_calls=[call("execute", "x1", command="echo nope")]),  # rejected
        *replies[2:],
    )
    target = str(workspace / "src" / "new.py")
    prompt = {"sessionId": "${s.sessionId}", "prompt": [{"type": "text", "text": "go"}]}
    load = {"sessionId": "${s.sessionId}", "cwd": str(workspace), "mcpServers": []}
    out = run_script(
        {
            "permissions": ["allow_once", "allow_once", "reject_once"],
            "steps": [
                {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "s"},
                {"request": "session/prompt", "params": prompt, "as": "p"},
                {"request": "session/load", "params": load, "as": "load"},
            ],
        },
        crow_env(llm, home),
        workspace,
    )
    assert out["results"]["p"]["result"]["stopReason"] == "end_turn", out["results"]
    assert "error" not in out["results"]["load"], out["results"]["load"]
    timeline = ts_timeline(out)
    # live, then replayed whole (a replayed tool_call carries its final status)
    ok = ["tool_call:pending", "permission", "update:in_progress", "update:completed", "tool_call:completed"]
    assert story(timeline, "w1") == ok and story(timeline, "e1") == ok
    assert story(timeline, "x1") == ["tool_call:pending", "permission", "update:failed", "tool_call:failed"]
    assert story(timeline, "r1") == [
        "tool_call:pending",
        "update:in_progress",
        "update:completed",
        "tool_call:completed",
    ]
    # names as the SDK parsed them (the timeline is the raw wire)
    starts = [u["update"] for u in out["updates"] if u["update"]["sessionUpdate"] == "tool_call"]
    names = {**NAMES, "x1": "execute"}
    assert {u["toolCallId"]: u["name"] for u in starts if u["status"] == "pending"} == names
    assert {u["toolCallId"]: u["name"] for u in starts if u["status"] != "pending"} == names
    asked = [p["toolCall"] for m, p in timeline if m == "session/request_permission"]
    diffs = [c["path"] for q in asked for c in q.get("content") or () if c["type"] == "diff"]
    assert diffs == [target, target]
    for update in [*final_updates(timeline).values(), *starts]:
        for diff in [c for c in update.get("content") or () if c["type"] == "diff"]:
            assert diff["path"] == target
    paths = list(shown_paths(timeline))
    assert len(paths) >= 12 and all(os.path.isabs(p) for p in paths), paths


def test_the_typescript_client_sees_a_cancelled_terminal_killed_and_released_and_replayed_as_text(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(
        Reply(tool_calls=[call("execute", "slow", command="sleep 30")]),
        Reply(tool_calls=[call("execute", "echo", command="echo from-terminal")]),
        Reply(text="ok"),
    )
    sid = "${s.sessionId}"
    text = lambda t: {"sessionId": sid, "prompt": [{"type": "text", "text": t}]}  # noqa: E731
    out = run_script(
        {
            "capabilities": {"terminal": True},
            "steps": [
                {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "s"},
                {"request": "session/prompt", "params": text("wait"), "as": "slow", "wait": False},
                {"untilRequest": "terminal/wait_for_exit"},
                {"sleep": 200},
                {"notify": "session/cancel", "params": {"sessionId": sid}},
                {"await": "slow"},
                {"request": "session/prompt", "params": text("echo"), "as": "echo"},
                {
                    "request": "session/load",
                    "params": {"sessionId": sid, "cwd": str(workspace), "mcpServers": []},
                },
            ],
        },
        crow_env(llm, home, **TERMINAL_ENV),
        workspace,
    )
    assert out["results"]["slow"]["result"]["stopReason"] == "cancelled"
    assert out["results"]["echo"]["result"]["stopReason"] == "end_turn"
    terminal_calls = [
        (r["method"], r["params"]["terminalId"])
        for r in out["requests"]
        if r["method"].startswith("terminal/") and r["method"] != "terminal/create"
    ]
    assert terminal_calls == [
        ("terminal/wait_for_exit", "term-1"),
        ("terminal/kill", "term-1"),
        ("terminal/release", "term-1"),
        ("terminal/wait_for_exit", "term-2"),
        ("terminal/output", "term-2"),
        ("terminal/release", "term-2"),
    ]
    timeline = ts_timeline(out)
    assert story(timeline, "slow")[:2] == ["tool_call:pending", "update:in_progress"]
    assert story(timeline, "slow")[2] == "update:failed"
    live_end = final_updates(timeline)["echo"]
    assert live_end["content"][0] == {"type": "terminal", "terminalId": "term-2"}
    replayed = [
        p["update"]
        for m, p in timeline
        if m == "session/update"
        and p["update"]["sessionUpdate"] == "tool_call"
        and p["update"]["toolCallId"] == "echo"
    ][-1]
    assert replayed["status"] == "completed" and [c["type"] for c in replayed["content"]] == ["content"]
    assert "from-terminal" in replayed["content"][0]["content"]["text"]
