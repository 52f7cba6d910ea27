"""End to end through a spawned `crow` (ACP over stdio): the `task` tool's children run
concurrently with their own context, ask the editor for permission (and `ask_user`
questions) with the answer honoured, stop on a cancel with every history valid, and load
afterwards. How the editor is shown a child is the ACP layer's (tests/test_acp_*); here
the protocol carries the run."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import acp
import anyio
import pytest

from crow.messages import Message, validate
from crow.store import SQLiteStore
from tests.conftest import RecordingClient, crow_env, spawn_crow
from tests.llm_server import RecordedRequest, Reply, ScriptedLLM, Stall, ToolCallSpec
from tests.test_e2e_subagents import answered, calls_then_answers, is_child, task

pytestmark = pytest.mark.anyio


async def start(conn: Any, workspace: Path) -> str:
    await conn.initialize(protocol_version=1)
    return str((await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id)


async def prompt(conn: Any, sid: str, text: str = "delegate") -> Any:
    return await conn.prompt(session_id=sid, prompt=[acp.text_block(text)])


def ended_with(client: RecordingClient, call_id: str) -> str:
    """The text of the last update of the parent's tool call `call_id`."""
    updates = [u for u in client.of_type("ToolCallProgress") if u.tool_call_id == call_id and u.content]
    return "".join(c.content.text for c in updates[-1].content if getattr(c, "content", None))


async def stored(home: Path, session_id: str) -> tuple[Any, list[Message]]:
    store = SQLiteStore(home / "crow.db", home=home)
    await store.open()
    try:
        return await store.get_session(session_id), await store.load_context(session_id)
    finally:
        await store.aclose()


async def test_two_tasks_run_at_once_through_a_spawned_crow(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    both = threading.Barrier(2, timeout=20)  # each child's reply waits until both asked

    def when_both_asked(request: RecordedRequest) -> Reply:
        both.wait()
        return Reply(text=f"answer to {request.last_user_text}")

    llm.rule(is_child, when_both_asked, times=2)
    llm.push(Reply(tool_calls=[task("t1", "CHILD one"), task("t2", "CHILD two")]), Reply(text="parent done"))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        answer = await prompt(conn, sid)
        assert answer.stop_reason == "end_turn"
        assert ended_with(client, "t1").startswith("answer to CHILD one")
        assert ended_with(client, "t2").startswith("answer to CHILD two")
    children = [r for r in llm.requests if is_child(r)]
    assert sorted(r.last_user_text for r in children) == ["CHILD one", "CHILD two"]
    for request in children:  # nothing of the parent's conversation
        assert [m for m in request.messages if m["role"] != "system"] == [
            {"role": "user", "content": request.last_user_text}
        ]


@pytest.mark.parametrize("answer", ["allow_once", "reject_once"])
async def test_a_childs_permission_request_reaches_the_editor_and_its_answer_holds(
    llm: ScriptedLLM, home: Path, workspace: Path, answer: str
) -> None:
    write = ToolCallSpec("write_file", {"path": "made.txt", "content": "hi"}, id="w1")
    llm.rule(is_child, calls_then_answers(write, answer="child finished"))
    llm.push(Reply(tool_calls=[task("t1", "CHILD write a file")]), Reply(text="parent done"))
    client = RecordingClient()
    client.permission_answer = answer
    async with spawn_crow(crow_env(llm, home), client=client) as (conn, _proc, _):
        sid = await start(conn, workspace)  # mode ask: the default
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
    (asked,) = client.permission_requests
    assert "made.txt" in str(asked[0])
    assert (workspace / "made.txt").exists() == (answer == "allow_once")
    write_result = next(
        m for r in llm.requests if is_child(r) and answered(r) for m in r.messages if m["role"] == "tool"
    )
    if answer == "reject_once":
        assert write_result["content"].startswith("Error: The user declined this tool call.")


async def test_a_childs_question_goes_to_the_editor(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    question = {"question": "Which one?", "options": ["red", "blue"]}
    llm.rule(
        is_child, calls_then_answers(ToolCallSpec("ask_user", question, id="q1"), answer="the user chose")
    )
    llm.push(Reply(tool_calls=[task("t1", "CHILD ask the user")]), Reply(text="parent done"))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
    (asked,) = client.permission_requests
    assert [o.name for o in asked[1]][:2] == ["red", "blue"]
    second = next(r for r in llm.requests if is_child(r) and answered(r))
    assert "red" in str([m for m in second.messages if m["role"] == "tool"])


async def test_a_cancel_stops_every_child_and_each_history_stays_valid(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.rule(is_child, Stall(seconds=60))
    llm.push(Reply(tool_calls=[task("t1", "CHILD one"), task("t2", "CHILD two")]))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        answers: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                answers.append(await prompt(conn, sid))

            tg.start_soon(run)
            await anyio.to_thread.run_sync(llm.wait_for_requests, 3, 20.0)
            await conn.cancel(session_id=sid)
        assert answers[0].stop_reason == "cancelled"
        for call_id in ("t1", "t2"):
            last = [u for u in client.of_type("ToolCallProgress") if u.tool_call_id == call_id][-1]
            assert last.status == "failed"
        llm.reset()
        llm.push(Reply(text="after the cancel"))
        assert (await prompt(conn, sid, "again")).stop_reason == "end_turn"
        children = await child_ids(home, sid)
        assert len(children) == 2
        loaded = await conn.load_session(cwd=str(workspace), session_id=children[0], mcp_servers=[])
        assert loaded is not None
    for session_id in [sid, *children]:
        record, context = await stored(home, session_id)
        validate(context)
        assert record.parent_id == (None if session_id == sid else sid)


async def child_ids(home: Path, parent_id: str) -> list[str]:
    store = SQLiteStore(home / "crow.db", home=home)
    await store.open()
    try:
        return [r.id for r in await store.descendants([parent_id])]
    finally:
        await store.aclose()


async def test_a_definitions_prompt_tools_and_mode_hold_through_a_spawned_crow(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """A repository's reviewer (read_file, grep) gets its own system prompt and only its
    tools; a write it was not offered is refused without asking. A repository's yolo agent
    under an ask-mode parent still asks."""
    agents = workspace / ".crow" / "agents"
    agents.mkdir(parents=True)
    (agents / "reviewer.md").write_text(
        "---\nname: reviewer\ndescription: Reviews code\ntools: read_file, grep\n---\nREVIEWER-PROMPT: find bugs.\n"
    )
    (agents / "loose.md").write_text(
        "---\nname: loose\ndescription: Does anything\nmode: yolo\n---\nLOOSE-PROMPT\n"
    )

    def child(request: RecordedRequest) -> Reply:
        if answered(request):
            return Reply(text="child finished")
        name = "sneaky.txt" if "REVIEWER" in request.system else "asked.txt"
        return Reply(tool_calls=[ToolCallSpec("write_file", {"path": name, "content": "x"}, id="w1")])

    llm.rule(is_child, child)
    llm.push(
        Reply(tool_calls=[task("t1", "CHILD review", agent="reviewer")]),
        Reply(tool_calls=[task("t2", "CHILD write", agent="loose")]),
        Reply(text="parent done"),
    )
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)  # mode ask: the default
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
    reviewer = next(r for r in llm.requests if is_child(r) and "REVIEWER" in r.system)
    assert reviewer.system.startswith("REVIEWER-PROMPT: find bugs.")
    assert sorted(reviewer.tool_names) == ["grep", "read_file"]
    refused = next(
        m["content"]
        for r in llm.requests
        if is_child(r) and "REVIEWER" in r.system and answered(r)
        for m in r.messages
        if m["role"] == "tool"
    )
    assert refused.startswith("Error: write_file was not offered to this subagent (agent reviewer)")
    assert not (workspace / "sneaky.txt").exists()
    # the loose agent's write was asked about (the parent's mode), and allowed by the editor
    (asked,) = client.permission_requests
    assert "asked.txt" in str(asked[0])
    assert (workspace / "asked.txt").exists()
