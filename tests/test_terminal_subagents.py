"""Subagents in the terminal front ends with a real `task` (builtin_hooks/subagents.py): `crow
run`'s text, json and stream-json output, the child's questions asked through
`TerminalClient.for_child` (one at a time with the parent's, naming the child), and `crow
chat` in a real terminal (tmux) asking a child's permission. The renderer alone:
tests/test_tui_subagents.py."""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from crow.llm.base import ToolSpec
from crow.messages import ToolCall
from crow.terminal import TerminalClient
from tests.conftest import CROW, crow_env
from tests.llm_server import RecordedRequest, Reply, ScriptedLLM, ToolCallSpec
from tests.support.tmux import Terminal
from tests.test_cli_run import run
from tests.test_terminal_prompts import answer_once
from tests.test_tui_render import until

RUN = ToolSpec("execute", "", {}, kind="execute", title="Run {command}")


@pytest.fixture(autouse=True)
def private_home(home: Path) -> None:
    home.chmod(0o700)  # else the first run warns that it made it private, on stderr


def child_asks(request: RecordedRequest) -> bool:
    return "CHILD" in request.last_user_text


def script_a_task(
    llm: ScriptedLLM, child_call: ToolCallSpec, parent_answer: str = "Parent: it is 42."
) -> None:
    """The parent's model calls `task` once; the child's calls `child_call`, then answers."""
    llm.rule(child_asks, Reply(text="CHILD-THINKS ", tool_calls=[child_call]), times=1)
    llm.rule(child_asks, Reply(text="the child found 42"), times=1)
    task = {"description": "Find the number", "prompt": "CHILD: find the number"}
    llm.push(Reply(tool_calls=[ToolCallSpec("task", task, id="t1")]), Reply(text=parent_answer))


def test_crow_run_text_keeps_stdout_to_the_parents_answer(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (workspace / "a.txt").write_text("42\nmore\n")
    script_a_task(llm, ToolCallSpec("read_file", {"path": "a.txt"}, id="c1"))
    done = run("delegate", env=crow_env(llm, home), cwd=workspace)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Parent: it is 42.\n"
    tag = "[general-purpose · Find the number]"
    assert (
        f"→ Find the number\n  {tag} started\n  {tag} → Read a.txt\n  {tag} ✓ [a.txt: lines 1-2 of 2] (2 more lines)\n"
        in done.stderr
    ), done.stderr
    assert re.search(
        rf"  {re.escape(tag)} ✓ done · 2 model calls · .*\d+\.\d s\n  ✓ the child found 42", done.stderr
    )
    assert "CHILD-THINKS" not in done.stderr + done.stdout


def test_crow_run_stream_json_links_the_childs_events_to_its_task(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (workspace / "a.txt").write_text("42\n")
    script_a_task(llm, ToolCallSpec("read_file", {"path": "a.txt"}, id="c1"))
    done = run("delegate", "--output", "stream-json", env=crow_env(llm, home), cwd=workspace)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    types = [e["type"] for e in events]
    begin, end = types.index("subagent_started"), types.index("subagent_finished")
    task_call = next(e for e in events if e["type"] == "tool_call" and e["name"] == "task")
    task_result = next(e for e in events if e["type"] == "tool_result" and e["name"] == "task")
    assert events.index(task_call) < begin < end < events.index(task_result)
    started = events[begin]
    child = started["session_id"]
    assert started == {
        "type": "subagent_started",
        "parent_tool_call_id": "t1",
        "session_id": child,
        "name": "general-purpose",
        "description": "Find the number",
        "cwd": str(workspace),
        "additional_directories": [],
    }
    assert "parent_tool_call_id" not in task_call and "session_id" not in task_call
    inside = events[begin + 1 : end]
    assert inside and all(e["parent_tool_call_id"] == "t1" and e["session_id"] == child for e in inside)
    read = next(e for e in inside if e["type"] == "tool_call")
    assert (read["id"], read["name"], read["args"]) == ("c1", "read_file", {"path": "a.txt"})
    assert any(e["type"] == "tool_result" and e["id"] == "c1" and "42" in e["output"] for e in inside)
    assert "".join(e["text"] for e in inside if e["type"] == "text") == "CHILD-THINKS the child found 42"
    finished = events[end]
    assert finished["stop_reason"] == "end_turn" and finished["error"] is None
    assert {"turns", "input_tokens", "output_tokens", "cost"} <= set(finished)
    outside = [e for e in events if "parent_tool_call_id" not in e]
    assert all("CHILD" not in e.get("text", "") for e in outside)
    assert events[-1]["type"] == "result" and events[-1]["answer"] == "Parent: it is 42."
    assert task_result["output"].startswith("the child found 42")


def test_crow_run_json_answer_is_the_parents(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    (workspace / "a.txt").write_text("42\n")
    script_a_task(llm, ToolCallSpec("read_file", {"path": "a.txt"}, id="c1"))
    done = run("delegate", "--output", "json", env=crow_env(llm, home), cwd=workspace)
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    report = json.loads(line)
    assert report["answer"] == "Parent: it is 42." and report["stop_reason"] == "end_turn"
    assert set(report) == {"session_id", "stop_reason", "answer", "usage", "cost"}
    assert "[general-purpose · Find the number] → Read a.txt" in done.stderr


def test_crow_run_on_a_terminal_asks_a_childs_permission_naming_it(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    script_a_task(llm, ToolCallSpec("execute", {"command": "echo from-the-child"}, id="c1"))
    status, text = answer_once(llm, home, workspace, b"y\n")
    assert status == 0, text
    assert "general-purpose (subagent) asks: Allow Run echo from-the-child?" in text
    assert "$ echo from-the-child" in text and "(call t1/c1)" in text
    child_requests = [r for r in llm.requests if child_asks(r)]
    result = [m["content"] for m in child_requests[-1].messages if m["role"] == "tool"]
    assert result and result[0].startswith("from-the-child")
    assert "Parent: it is 42." in text


@pytest.mark.anyio
async def test_a_childs_questions_name_it_and_wait_for_the_parents(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The parent and a child ask at once: one question on the terminal, then the other;
    each answer goes to the client that asked."""
    read, write = os.pipe()
    parent = TerminalClient(str(workspace), fd=read)
    child = parent.for_child(session_id="s-child", name="reviewer\x1b[2J", parent_call_id="t1")
    answers: dict[str, str | None] = {}

    async def ask(client: TerminalClient, who: str, command: str) -> None:
        call = ToolCall("c1", "execute", {"command": command})
        answers[who] = await client.ask_permission(call, spec=RUN, timeout=30)

    async def shown() -> str:
        seen = ""
        with anyio.fail_after(15):
            while seen.count("Answer for") < 1:
                seen += capsys.readouterr().err
                await anyio.sleep(0.02)
        return seen

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, child, "child", "echo child")
            first = await shown()
            assert "reviewer\\x1b[2J (subagent) asks: Allow Run echo child?" in first
            assert "'Run echo child' (call t1/c1)" in first
            tg.start_soon(ask, parent, "parent", "echo parent")
            # the parent's question waits for the child's answer
            await until(lambda: parent._io.lock().statistics().tasks_waiting == 1, timeout=15)
            assert "echo parent" not in capsys.readouterr().err
            os.write(write, b"n\n")
            second = await shown()
            assert "\nAllow Run echo parent?" in second and "(call c1)" in second and "subagent" not in second
            os.write(write, b"y\n")
    finally:
        os.close(read)
        os.close(write)
    assert answers == {"child": "reject_once", "parent": "allow_once"}


@pytest.mark.anyio
async def test_a_childs_forms_and_choices_name_it(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    read, write = os.pipe()
    parent = TerminalClient(str(workspace), fd=read)
    child = parent.for_child(session_id="s-child", name="reviewer", parent_call_id="t1")
    try:
        os.write(write, b"blue\n")
        schema = {"type": "object", "properties": {"colour": {"type": "string"}}}
        filled = await child.elicit(None, "Which colour?", schema, timeout=15)
        options = [("a", "Approve", "allow_once"), ("r", "Reject", "reject_once")]
        os.write(write, b"2\n")  # typed after the form: what was typed before a question is dropped
        chosen = await child.ask(None, options, title="Approve the plan?", text="1. step", timeout=15)
    finally:
        os.close(read)
        os.close(write)
    err = capsys.readouterr().err
    assert (filled.action, filled.content, chosen) == ("accept", {"colour": "blue"}, "r")
    assert "\nreviewer (subagent) asks: Which colour?" in err
    assert "\nreviewer (subagent) asks: Approve the plan?" in err
    assert parent.asker == "" and child._io is parent._io


@pytest.fixture
def chat(tmp_path: Path, llm: ScriptedLLM, home: Path, workspace: Path) -> Iterator[Terminal]:
    term = Terminal([*CROW, "chat"], env=crow_env(llm, home), cwd=workspace, socket=tmp_path / "tmux.sock")
    term.wait_for("›")
    yield term
    term.close()


def test_crow_chat_asks_a_childs_permission_and_shows_its_call_under_the_task(
    chat: Terminal, llm: ScriptedLLM
) -> None:
    script_a_task(llm, ToolCallSpec("execute", {"command": "echo from-the-child"}, id="c1"))
    chat.type("delegate")
    screen = chat.wait_for("Answer for")
    assert "general-purpose (subagent) asks: Allow Run echo from-the-child?" in screen, screen
    assert "Answer for general-purpose: Run echo from-the-child (call t1/c1)" in screen
    chat.send("y")
    screen = chat.wait_for("Parent: it is 42.")
    # (a child's warnings print in its group too: under load the scripted server's keep-alive
    # connection was once lost and the model call retried, "⚠ Retrying the model call")
    assert re.search(
        r"✓ general-purpose: Find the number · \d+\.\d s\n"
        r"(?:  ⚠ [^\n]*\n)*"
        r"  ✓ Run echo from-the-child · \d+\.\d s\n"
        r"  ↳ ✓ done · 2 model calls · .*\d+\.\d s\n",
        screen,
    ), screen
    assert screen.index("↳ ✓ done") < screen.index("Parent: it is 42.")
    assert "CHILD-THINKS" not in screen and "the child found 42" not in screen


def test_crow_runs_lines_for_a_child_are_escaped_and_a_grandchilds_objects_name_their_own_task() -> None:
    from crow.events import SubagentEvent, SubagentFinished, SubagentStarted, TextDelta, ToolCallStart
    from crow.run_output import Activity, event_object

    hostile = "rev\x1b[2Jiewer\nname"
    activity = Activity()
    assert activity.line(SubagentStarted("t1", "s1", hostile, "Find\x07 it", "/w")) == (
        "  [rev\\x1b[2Jiewer name · Find\\x07 it] started"
    )
    call = ToolCall("c1", "execute", {"command": "ls\x1b[8m"})
    line = activity.line(SubagentEvent("t1", "s1", ToolCallStart(call, RUN)))
    assert line == "  [rev\\x1b[2Jiewer name · Find\\x07 it] → Run ls\\x1b[8m"
    assert activity.line(SubagentEvent("t1", "s1", TextDelta("CHILD", "m"))) is None
    ended = activity.line(SubagentFinished("t1", "s1", "failed", turns=1, error="boom\x1b[31m\nmore"))
    tail = r"\] ✗ failed · 1 model call · \d+\.\d s: boom\\x1b\[31m \(1 more line\)$"
    assert ended is not None and re.search(tail, ended), ended
    grandchild = SubagentEvent("t1", "s1", SubagentEvent("c7", "s2", TextDelta("deep", "m")))
    assert event_object(grandchild) == {
        "type": "text",
        "parent_tool_call_id": "c7",
        "session_id": "s2",
        "text": "deep",
        "message_id": "m",
    }


def test_crow_chat_shows_two_children_at_once_each_under_its_task(
    chat: Terminal, llm: ScriptedLLM, workspace: Path
) -> None:
    """Two tasks of one reply run at once: while both children wait for their model, the
    live part shows each one's call under its own task; at the end each group is printed
    under its task's line."""
    seen = threading.Event()  # the test saw both groups live: the children may answer

    def when_seen(text: str) -> Any:
        def step(request: RecordedRequest) -> Reply:
            seen.wait(30)
            return Reply(text=text)

        return step

    tasks = []
    for who in ("A", "B"):
        (workspace / f"{who}.txt").write_text(f"{who} file\n")
        asked = f"CHILD-{who}"

        def first(r: RecordedRequest, asked: str = asked) -> bool:
            return asked in r.last_user_text and not any(m["role"] == "tool" for m in r.messages)

        llm.rule(
            first, Reply(tool_calls=[ToolCallSpec("read_file", {"path": f"{who}.txt"}, id="c1")]), times=1
        )
        llm.rule(lambda r, asked=asked: asked in r.last_user_text, when_seen(f"{who} done"), times=1)
        tasks.append(ToolCallSpec("task", {"description": f"Look at {who}", "prompt": asked}, id=f"t{who}"))
    llm.push(Reply(tool_calls=tasks), Reply(text="Both done."))
    chat.type("delegate twice")
    live = re.compile(
        r"⋯ general-purpose: Look at A\n  ✓ Read A\.txt · \d+\.\d s\n"
        r"⋯ general-purpose: Look at B\n  ✓ Read B\.txt · \d+\.\d s\n"
    )
    chat.wait_for(lambda screen: bool(live.search(screen)), timeout=30)
    seen.set()
    screen = chat.wait_for("Both done.", timeout=30)
    # A model call the scripted server cut under load is retried, and shown under its task.
    retried = r"(?:  ⚠ Retrying the model call\n)?"
    for who in ("A", "B"):
        assert re.search(
            rf"✓ general-purpose: Look at {who} · \d+\.\d s\n{retried}  ✓ Read {who}\.txt · \d+\.\d s\n"
            rf"{retried}  ↳ ✓ done",
            screen,
        ), screen


def test_crow_chat_asks_a_childs_ask_user_naming_it(chat: Terminal, llm: ScriptedLLM) -> None:
    from tests.test_tui_questions import ask

    script_a_task(llm, ask("Which colour?", ["red", "green"]))
    chat.type("delegate")
    screen = chat.wait_for("2. green")
    assert "general-purpose (subagent) asks: Which colour?" in screen, screen
    chat.send("Down", "Enter")
    chat.wait_for("Parent: it is 42.")
    child = [r for r in llm.requests if child_asks(r)][-1]
    assert [m["content"] for m in child.messages if m["role"] == "tool"] == ['The user chose "green".']


def test_a_childs_refused_call_in_a_pipeline_is_exit_4_as_the_parents_is(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """Piped, nobody is asked: a child's write is refused. docs/terminal.md: "the exit status
    says so (4)" -- a script relying on it reruns with --yolo; it got 0."""
    script_a_task(llm, ToolCallSpec("write_file", {"path": "b.txt", "content": "x"}, id="c1"))
    done = run("delegate", env=crow_env(llm, home), cwd=workspace)
    assert not (workspace / "b.txt").exists()
    assert done.returncode == 4, done.stderr
    assert done.stdout == "Parent: it is 42.\n"


def test_a_child_that_refused_then_went_on_is_not_exit_4(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """As for the parent: only a refusal in the child's last tool round says the work was
    not done; one the child's model got past does not."""
    (workspace / "a.txt").write_text("42\n")
    llm.rule(child_asks, Reply(tool_calls=[ToolCallSpec("write_file", {"path": "b.txt", "content": "x"})]), times=1)
    llm.rule(child_asks, Reply(tool_calls=[ToolCallSpec("read_file", {"path": "a.txt"})]), times=1)
    llm.rule(child_asks, Reply(text="the child found 42"), times=1)
    task = {"description": "Find the number", "prompt": "CHILD: find the number"}
    llm.push(Reply(tool_calls=[ToolCallSpec("task", task, id="t1")]), Reply(text="Parent: it is 42."))
    done = run("delegate", env=crow_env(llm, home), cwd=workspace)
    assert done.returncode == 0, done.stderr


def test_every_stderr_line_of_a_childs_notice_names_the_child() -> None:
    """Two children side by side: a line without its tag cannot be told apart (docs/terminal.md:
    "each line tagged with its agent and task")."""
    from crow.events import Notice, SubagentEvent, SubagentStarted
    from crow.run_output import Activity

    activity = Activity()
    activity.line(SubagentStarted("t1", "s1", "reviewer", "Find it", "/w"))
    notice = Notice("the MCP server failed:\nTraceback ...\nOSError: gone", "warning")
    line = activity.line(SubagentEvent("t1", "s1", notice))
    assert line is not None
    assert line.splitlines() == [
        "  [reviewer · Find it] the MCP server failed:",
        "  [reviewer · Find it] Traceback ...",
        "  [reviewer · Find it] OSError: gone",
    ]


def test_a_grandchilds_stderr_lines_name_it() -> None:
    """With `max_depth: 2` a subagent's own subagent is shown too, tagged with its own name
    and task; its lines were dropped (only stream-json had them)."""
    from crow.events import SubagentEvent, SubagentFinished, SubagentStarted, ToolCallStart
    from crow.run_output import Activity

    activity = Activity()
    activity.line(SubagentStarted("t1", "s1", "planner", "Plan it", "/w"))
    started = activity.line(SubagentEvent("t1", "s1", SubagentStarted("c7", "s2", "explore", "Look", "/w")))
    assert started == "  [explore · Look] started"
    call = ToolCall("g1", "execute", {"command": "ls"})
    inner = activity.line(SubagentEvent("t1", "s1", SubagentEvent("c7", "s2", ToolCallStart(call, RUN))))
    assert inner == "  [explore · Look] → Run ls"
    ended = activity.line(SubagentEvent("t1", "s1", SubagentFinished("c7", "s2", "end_turn", turns=1)))
    assert ended is not None and ended.startswith("  [explore · Look] ✓ done · 1 model call")


@pytest.mark.anyio
async def test_a_hostile_call_id_is_shown_escaped_in_crow_runs_question(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Call ids are the model server's: `Answer for ... (call t1/c1)` wrote them raw, so an
    id could clear the screen or draw over the question (the chat's picker escapes them)."""
    read, write = os.pipe()
    parent = TerminalClient(str(workspace), fd=read)
    child = parent.for_child(session_id="s-child", name="reviewer", parent_call_id="t1\x1b[2J")
    try:
        os.write(write, b"n\n")
        call = ToolCall("c1\x1b]0;owned\x07", "execute", {"command": "ls"})
        assert await child.ask_permission(call, spec=RUN, timeout=15) == "reject_once"
    finally:
        os.close(read)
        os.close(write)
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err, repr(err)
    assert "(call t1\\x1b[2J/c1\\x1b]0;owned\\x07)" in err
