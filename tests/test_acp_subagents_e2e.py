"""End to end: subagents (the `task` tool's children) as an ACP editor sees them
(crow/acp/subagents.py), with crow spawned over ACP and a scripted model playing parent and
children. Without the unstable `subagents` capability everything shows on the parent's
session (each child tool call a tool call of its own, linked to the task call); with it,
each child is a session announced by `subagent_update`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import acp
import anyio
import pytest
import yaml

from crow.store import SQLiteStore
from tests.conftest import FEATURES_125, RecordingClient, crow_env, initialize_125, spawn_crow
from tests.llm_server import RecordedRequest, Reply, ScriptedLLM, Stall, Step, ToolCallSpec
from tests.support.ts_client import run_script

pytestmark = pytest.mark.anyio
WITH_SUBAGENTS = {**FEATURES_125, "subagents": {}}
AGENT = "general-purpose"


def configure(home: Path, mode: str = "yolo") -> Path:
    path = home / "subagents.yaml"
    path.write_text(yaml.safe_dump({"mode": mode}))
    return path


def child(llm: ScriptedLLM, marker: str, *replies: Step) -> None:
    """The child whose prompt holds `marker` answers its Nth model request with replies[N]."""

    def step(request: RecordedRequest) -> Step:
        answered = sum(1 for m in request.messages if m["role"] == "assistant")
        return replies[min(answered, len(replies) - 1)]

    llm.rule(lambda r: marker in r.last_user_text, step)


def task(call_id: str, description: str, prompt: str) -> ToolCallSpec:
    return ToolCallSpec("task", {"description": description, "prompt": prompt}, id=call_id)


def tool(name: str, call_id: str, **args: Any) -> ToolCallSpec:
    return ToolCallSpec(name, args, id=call_id)


def wire_updates(client: RecordingClient) -> list[tuple[str, dict[str, Any]]]:
    """(sessionId, update) of every session/update crow wrote, in order, as written."""
    return [
        (m["params"]["sessionId"], m["params"]["update"])
        for direction, m in client.wire.messages  # type: ignore[union-attr]
        if direction == "in" and m.get("method") == "session/update"
    ]


def requests_of(client: RecordingClient, method: str) -> list[dict[str, Any]]:
    return [
        m["params"]
        for direction, m in client.wire.messages  # type: ignore[union-attr]
        if direction == "in" and m.get("method") == method and "id" in m
    ]


def linked_child(updates: list[tuple[str, dict[str, Any]]], call_id: str) -> str:
    """The child session a task call is linked to (`_meta.crow.subagentSessionId`)."""
    found = {
        u["_meta"]["crow"]["subagentSessionId"]
        for _, u in updates
        if u.get("toolCallId") == call_id and "subagentSessionId" in u.get("_meta", {}).get("crow", {})
    }
    assert len(found) == 1, found
    return found.pop()


def task_text(updates: list[tuple[str, dict[str, Any]]], call_id: str) -> list[str]:
    """The texts a task call's content showed while it ran (before it completed)."""
    return [
        u["content"][0]["content"]["text"]
        for _, u in updates
        if u["sessionUpdate"] == "tool_call_update" and u["toolCallId"] == call_id and u.get("content")
        and u.get("status") is None
    ]  # fmt: skip


def idle(state: dict[str, Any]) -> dict[str, Any]:
    """A child's end state without its usage: the task tool's figures, which the view passes
    on as they are (tests/test_acp_subagents.py checks how)."""
    return {k: v for k, v in state.items() if k != "usage"}


async def stored_children(home: Path, parent: str) -> list[str]:
    async with SQLiteStore(home / "crow.db") as store:
        records = await store.descendants([parent])
    return [r.id for r in records if r.parent_id == parent]


async def start(conn: Any, workspace: Path, subagents: bool) -> str:
    await initialize_125(conn, WITH_SUBAGENTS if subagents else FEATURES_125)
    return (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id


def script_fix(llm: ScriptedLLM) -> None:
    """Parent: one task; child: says something, reads a.txt, edits it, answers."""
    llm.push(Reply(tool_calls=[task("t1", "Fix the greeting", "CHILD-A: change hello to bye in a.txt")]))
    llm.push(Reply(text="parent done"))
    child(
        llm,
        "CHILD-A",
        Reply(text="Looking at it.", tool_calls=[tool("read_file", "c1", path="a.txt")]),
        Reply(tool_calls=[tool("edit_file", "c2", path="a.txt", old_text="hello", new_text="bye")]),
        Reply(text="Changed hello to bye in a.txt."),
    )


async def run_fix(llm: ScriptedLLM, home: Path, workspace: Path, subagents: bool) -> tuple[str, list[Any]]:
    """One prompt of `script_fix` in a fresh crow: the parent's id and what was sent."""
    (workspace / "a.txt").write_text("hello\n")
    script_fix(llm)
    env = crow_env(llm, home)
    async with spawn_crow(env, "--config", str(configure(home))) as (conn, _proc, client):
        sid = await start(conn, workspace, subagents)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
    return sid, wire_updates(client)


def ts_run(
    home: Path, workspace: Path, env: dict[str, str], subagents: bool, **more: Any
) -> tuple[dict[str, Any], str, str]:
    """One prompt ("go") through the official TypeScript client (its unstable binding when
    it advertises `subagents`: the stable one drops subagent_update unseen); `more` adds to
    the script (`capabilities`, answers). Returns its output, the parent's and child's ids."""
    capabilities = {**more.pop("capabilities", {}), **({"subagents": {}} if subagents else {})}
    prompt = {"sessionId": "${s.sessionId}", "prompt": [{"type": "text", "text": "go"}]}
    script = {
        "capabilities": capabilities,
        "unstable": subagents,
        **more,
        "steps": [
            {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "s"},
            {"request": "session/prompt", "params": prompt, "as": "p"},
        ],
    }
    out = run_script(script, env, workspace, "--config", str(configure(home)))
    assert out["results"]["p"] == {"result": {"stopReason": "end_turn"}}
    updates = [(u["sessionId"], u["update"]) for u in out["updates"]]
    return out, out["results"]["s"]["result"]["sessionId"], linked_child(updates, "t1")


async def test_without_the_capability_child_calls_show_among_the_parents(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    sid, updates = await run_fix(llm, home, workspace, subagents=False)
    assert (workspace / "a.txt").read_text() == "bye\n"
    assert {s for s, _ in updates} == {sid}, "everything on the parent's session"
    assert "subagent_update" not in [u["sessionUpdate"] for _, u in updates]
    child_id = linked_child(updates, "t1")
    assert await stored_children(home, sid) == [child_id]
    calls = [u for _, u in updates if u["sessionUpdate"] == "tool_call"]
    assert [c["toolCallId"] for c in calls] == ["t1", "t1/c1", "t1/c2"]
    assert (calls[0]["title"], calls[0]["kind"]) == ("Fix the greeting", "think")
    link = {"crow": {"parentToolCallId": "t1", "subagentSessionId": child_id}}
    read, edit = calls[1], calls[2]
    assert (read["title"], read["kind"], read["_meta"]) == ("Read a.txt", "read", link)
    assert read["locations"] == [{"path": str(workspace / "a.txt")}]
    assert (edit["title"], edit["kind"], edit["_meta"]) == ("Edit a.txt", "edit", link)
    ends = {
        u["toolCallId"]: u
        for _, u in updates
        if u["sessionUpdate"] == "tool_call_update" and u.get("status") == "completed"
    }
    assert ends["t1/c2"]["content"][0] == {
        "type": "diff", "path": str(workspace / "a.txt"), "oldText": "hello\n", "newText": "bye\n"
    }  # fmt: skip
    assert ends["t1/c2"]["_meta"] == link
    shown = task_text(updates, "t1")
    assert shown[-1] == "Looking at it.\n\nChanged hello to bye in a.txt.", "the final state, shown"
    assert "Changed hello to bye in a.txt." in ends["t1"]["content"][0]["content"]["text"]
    assert ends["t1"]["_meta"] == {"crow": {"subagentSessionId": child_id}}
    order = [u.get("toolCallId") for _, u in updates]
    last_child = max(i for i, c in enumerate(order) if c and c.startswith("t1/"))
    completed = next(
        i
        for i, (_, u) in enumerate(updates)
        if u.get("toolCallId") == "t1" and u.get("status") == "completed"
    )
    assert last_child < completed


async def test_with_the_capability_a_child_is_a_session_announced_first_and_ended_idle(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    sid, updates = await run_fix(llm, home, workspace, subagents=True)
    child_id = linked_child(updates, "t1")
    assert await stored_children(home, sid) == [child_id]
    announced = [i for i, (s, u) in enumerate(updates) if u["sessionUpdate"] == "subagent_update"]
    assert all(updates[i][0] == sid for i in announced), "subagent_update goes on the parent's session"
    assert updates[announced[0]][1] == {
        "sessionUpdate": "subagent_update", "sessionId": child_id, "title": "Fix the greeting",
        "description": AGENT, "state": {"state": "running"}, "cwd": str(workspace),
    }  # fmt: skip
    ended = updates[announced[-1]][1]
    assert ended.keys() == {"sessionUpdate", "sessionId", "state"} and ended["sessionId"] == child_id
    assert idle(ended["state"]) == {"state": "idle", "stopReason": "end_turn"}
    on_child = [i for i, (s, _) in enumerate(updates) if s == child_id]
    assert on_child and announced[0] < on_child[0] and on_child[-1] < announced[-1]
    completed = next(
        i
        for i, (_, u) in enumerate(updates)
        if u.get("toolCallId") == "t1" and u.get("status") == "completed"
    )
    assert announced[-1] < completed, "the child ended before its task call did"
    child_updates = [updates[i][1] for i in on_child]
    calls = [u for u in child_updates if u["sessionUpdate"] == "tool_call"]
    assert [c["toolCallId"] for c in calls] == ["c1", "c2"], "its own ids, on its own session"
    assert all(c["_meta"] == {"crow": {"parentToolCallId": "t1"}} for c in calls)
    said = "".join(u["content"]["text"] for u in child_updates if u["sessionUpdate"] == "agent_message_chunk")
    assert said == "Looking at it.Changed hello to bye in a.txt."
    assert not any(u.get("toolCallId", "").startswith("t1/") for _, u in updates), "nothing flattened"


@pytest.mark.parametrize("subagents", [False, True], ids=["flat", "sessions"])
@pytest.mark.parametrize("answer", ["allow_once", "reject_once"])
async def test_a_childs_permission_request_names_it_and_its_answer_holds(
    llm: ScriptedLLM, home: Path, workspace: Path, subagents: bool, answer: str
) -> None:
    (workspace / "a.txt").write_text("hello\n")
    llm.push(Reply(tool_calls=[task("t1", "Fix the greeting", "CHILD-A: change it")]), Reply(text="done"))
    child(
        llm,
        "CHILD-A",
        Reply(tool_calls=[tool("edit_file", "c2", path="a.txt", old_text="hello", new_text="bye")]),
        Reply(text="finished"),
    )
    client = RecordingClient()
    client.permission_answer = answer
    env = crow_env(llm, home)
    async with spawn_crow(env, "--config", str(configure(home, "ask")), client=client) as (conn, _proc, _c):
        sid = await start(conn, workspace, subagents)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
    child_id = linked_child(wire_updates(client), "t1")
    [asked] = requests_of(client, "session/request_permission")
    assert asked["toolCall"]["title"] == f"{AGENT}: Edit a.txt"
    if subagents:
        assert (asked["sessionId"], asked["toolCall"]["toolCallId"]) == (child_id, "c2")
    else:  # the id of the tool call the editor already shows
        assert (asked["sessionId"], asked["toolCall"]["toolCallId"]) == (sid, "t1/c2")
        shown = [u["toolCallId"] for _, u in wire_updates(client) if u["sessionUpdate"] == "tool_call"]
        assert "t1/c2" in shown
    assert (workspace / "a.txt").read_text() == ("bye\n" if answer == "allow_once" else "hello\n")
    child_read = [m["content"] for m in llm.requests[-2].messages if m["role"] == "tool"]
    assert len(child_read) == 1 and ("declined" in child_read[0]) == (answer == "reject_once")


@pytest.mark.parametrize("subagents", [False, True], ids=["flat", "sessions"])
async def test_two_children_at_once_are_each_attributable(
    llm: ScriptedLLM, home: Path, workspace: Path, subagents: bool
) -> None:
    for name in ("a", "b"):
        (workspace / f"{name}.txt").write_text(f"{name}\n")
    llm.push(
        Reply(
            tool_calls=[
                task("ta", "Read A", "CHILD-A: read a.txt"),
                task("tb", "Read B", "CHILD-B: read b.txt"),
            ]
        ),
        Reply(text="both done"),
    )
    for name in ("a", "b"):  # the same call id in both children: shown apart all the same
        child(
            llm,
            f"CHILD-{name.upper()}",
            Reply(
                text=f"reading {name} now",
                chunk_delay=0.02,
                tool_calls=[tool("read_file", "c1", path=f"{name}.txt")],
            ),
            Reply(text=f"{name} says {name} and nothing more", chunk_delay=0.02),
        )
    env = crow_env(llm, home)
    async with spawn_crow(env, "--config", str(configure(home))) as (conn, _proc, client):
        sid = await start(conn, workspace, subagents)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
    updates = wire_updates(client)
    children = {call: linked_child(updates, call) for call in ("ta", "tb")}
    assert sorted(children.values()) == sorted(await stored_children(home, sid))
    for call, name in (("ta", "a"), ("tb", "b")):
        kid = children[call]
        if subagents:
            mine = [i for i, (s, _) in enumerate(updates) if s == kid]
            told = [
                i
                for i, (s, u) in enumerate(updates)
                if u["sessionUpdate"] == "subagent_update" and u["sessionId"] == kid
            ]
            assert (
                told[0] < mine[0] and mine[-1] < told[-1] and updates[told[-1]][1]["state"]["state"] == "idle"
            )
            [read] = [updates[i][1] for i in mine if updates[i][1]["sessionUpdate"] == "tool_call"]
            assert (read["toolCallId"], read["_meta"]["crow"]["parentToolCallId"]) == ("c1", call)
            said = "".join(
                updates[i][1]["content"]["text"]
                for i in mine
                if updates[i][1]["sessionUpdate"] == "agent_message_chunk"
            )
            assert said == f"reading {name} now{name} says {name} and nothing more"
        else:
            [read] = [
                u for _, u in updates if u["sessionUpdate"] == "tool_call" and u["toolCallId"] == f"{call}/c1"
            ]
            assert read["_meta"] == {"crow": {"parentToolCallId": call, "subagentSessionId": kid}}
            assert read["locations"] == [{"path": str(workspace / f"{name}.txt")}]
            assert (
                task_text(updates, call)[-1] == f"reading {name} now\n\n{name} says {name} and nothing more"
            )
    if not subagents:
        assert {s for s, _ in updates} == {sid}
        assert "subagent_update" not in [u["sessionUpdate"] for _, u in updates]


@pytest.mark.parametrize("subagents", [False, True], ids=["flat", "sessions"])
async def test_loading_the_parent_and_the_child_replays_each(
    llm: ScriptedLLM, home: Path, workspace: Path, subagents: bool
) -> None:
    sid, updates = await run_fix(llm, home, workspace, subagents)
    child_id = linked_child(updates, "t1")
    env = crow_env(llm, home)
    async with spawn_crow(env, "--config", str(configure(home))) as (conn, _proc, client):
        await initialize_125(conn, WITH_SUBAGENTS if subagents else FEATURES_125)
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        await conn.load_session(cwd=str(workspace), session_id=child_id, mcp_servers=[])
    parent = [(s, u) for s, u in wire_updates(client) if s == sid]
    loaded_child = [(s, u) for s, u in wire_updates(client) if s == child_id]
    [replayed] = [u for s, u in parent if u["sessionUpdate"] == "tool_call"]
    assert (replayed["toolCallId"], replayed["title"], replayed["kind"]) == (
        "t1",
        "Fix the greeting",
        "think",
    )
    assert replayed["_meta"] == {"crow": {"subagentSessionId": child_id}}
    assert "Changed hello to bye in a.txt." in replayed["content"][0]["content"]["text"]
    kinds = [u["sessionUpdate"] for _, u in loaded_child]
    assert kinds[0] == "user_message_chunk" and "CHILD-A" in loaded_child[0][1]["content"]["text"]
    calls = [u for _, u in loaded_child if u["sessionUpdate"] == "tool_call"]
    assert [(c["toolCallId"], c["status"]) for c in calls] == [("c1", "completed"), ("c2", "completed")]
    said = "".join(
        u["content"]["text"] for _, u in loaded_child if u["sessionUpdate"] == "agent_message_chunk"
    )
    assert said == "Looking at it.Changed hello to bye in a.txt."


@pytest.mark.parametrize("subagents", [False, True], ids=["flat", "sessions"])
def test_the_typescript_sdk_client_takes_a_run_with_children(
    llm: ScriptedLLM, home: Path, workspace: Path, subagents: bool
) -> None:
    (workspace / "a.txt").write_text("hello\n")
    script_fix(llm)
    out, _sid, _kid = ts_run(home, workspace, crow_env(llm, home), subagents)
    kinds = [u["update"]["sessionUpdate"] for u in out["updates"]]
    calls = [u["update"]["toolCallId"] for u in out["updates"] if u["update"]["sessionUpdate"] == "tool_call"]
    if subagents:
        assert kinds.count("subagent_update") == 2 and calls == ["t1", "c1", "c2"]
    else:
        assert "subagent_update" not in kinds and calls == ["t1", "t1/c1", "t1/c2"]


async def test_cancelling_the_parent_ends_its_children_idle_after_their_traffic(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """Two children, one waiting on its model: the parent's cancel ends both; each is
    reported idle on the parent after all of its own updates, and the turn is cancelled."""
    llm.push(
        Reply(tool_calls=[task("ta", "Wait", "CHILD-A: wait"), task("tb", "Also wait", "CHILD-B: wait")]),
        Reply(text="never"),
    )
    (workspace / "a.txt").write_text("a\n")
    child(
        llm,
        "CHILD-A",
        Reply(text="reading", tool_calls=[tool("read_file", "c1", path="a.txt")]),
        Stall(seconds=30),
    )
    child(llm, "CHILD-B", Stall(seconds=30))
    env = crow_env(llm, home)
    async with spawn_crow(env, "--config", str(configure(home))) as (conn, _proc, client):
        sid = await start(conn, workspace, subagents=True)
        result: dict[str, Any] = {}

        async def prompt() -> None:
            result["answer"] = await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(prompt)
                # the wire log and the model server have no events to wait on: poll them
                while len([r for r in llm.requests if "CHILD" in r.last_user_text]) < 3:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
                await conn.cancel(session_id=sid)
        assert result["answer"].stop_reason == "cancelled"
    updates = wire_updates(client)
    children = {call: linked_child(updates, call) for call in ("ta", "tb")}
    for call, kid in children.items():
        told = [
            i
            for i, (s, u) in enumerate(updates)
            if u["sessionUpdate"] == "subagent_update" and u["sessionId"] == kid
        ]
        mine = [i for i, (s, _) in enumerate(updates) if s == kid]
        assert idle(updates[told[-1]][1]["state"]) == {"state": "idle", "stopReason": "cancelled"}, call
        assert not mine or mine[-1] < told[-1]
        ended = next(
            i
            for i, (_, u) in enumerate(updates)
            if u.get("toolCallId") == call and u.get("status") in ("completed", "failed")
        )
        assert told[-1] < ended


@pytest.mark.parametrize("subagents", [False, True], ids=["flat", "sessions"])
def test_a_childs_form_names_it_and_its_answer_reaches_the_child(
    llm: ScriptedLLM, home: Path, workspace: Path, subagents: bool
) -> None:
    """Through the official TypeScript client: a child's `ask_user` form carries the child's
    name, and the session and tool call ids the editor shows it under."""
    llm.push(Reply(tool_calls=[task("t1", "Choose", "CHILD-A: choose a database")]), Reply(text="done"))
    question = {"question": "Which database?", "options": ["SQLite", "Postgres"]}
    child(llm, "CHILD-A", Reply(tool_calls=[tool("ask_user", "q1", **question)]), Reply(text="SQLite then"))
    env = crow_env(llm, home)
    answer = {"action": "accept", "content": {"answer": "SQLite"}}
    out, sid, kid = ts_run(
        home, workspace, env, subagents, capabilities={"elicitation": {"form": {}}}, elicitation=answer
    )
    [form] = [r["params"] for r in out["requests"] if r["method"] == "elicitation/create"]
    assert form["message"] == f"{AGENT}: Which database?"
    assert (form["sessionId"], form["toolCallId"]) == ((kid, "q1") if subagents else (sid, "t1/q1"))
    answered = [m["content"] for m in llm.requests[-2].messages if m["role"] == "tool"]
    assert len(answered) == 1 and "SQLite" in answered[0]


@pytest.mark.parametrize("subagents", [False, True], ids=["flat", "sessions"])
def test_a_childs_command_runs_in_an_editor_terminal_and_it_is_released(
    llm: ScriptedLLM, home: Path, workspace: Path, subagents: bool
) -> None:
    llm.push(Reply(tool_calls=[task("t1", "Run it", "CHILD-A: run echo")]), Reply(text="done"))
    child(
        llm,
        "CHILD-A",
        Reply(tool_calls=[tool("execute", "x1", command="echo from-the-child")]),
        Reply(text="ran"),
    )
    # commands run in the editor's terminal only without a sandbox (the editor cannot run bwrap)
    env = crow_env(llm, home, CROW_SANDBOX="off")
    out, sid, kid = ts_run(home, workspace, env, subagents, capabilities={"terminal": True})
    on = {
        r["method"]: r["params"]["sessionId"] for r in out["requests"] if r["method"].startswith("terminal/")
    }
    assert {"terminal/create", "terminal/release"} <= on.keys()
    # The child shares its parent's tool servers, whose file tools were bound to the
    # parent's client: its terminal is the parent session's, made and released there.
    assert set(on.values()) == {sid} and kid != sid, on
    assert "from-the-child" in str(llm.requests[-2].messages)
