"""Subagents asking at once in `crow chat` (tmux): one question at a time, each answer to
the child that asked, and Ctrl-C during a child's question."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from tests.llm_server import RecordedRequest, Reply, ScriptedLLM, ToolCallSpec
from tests.support.tmux import Terminal
from tests.test_terminal_prompts import crow_run_answering
from tests.test_terminal_subagents import chat  # the fixture

__all__ = ["chat"]


@pytest.fixture(autouse=True)
def private_home(home: Path) -> None:
    home.chmod(0o700)




def _two_children_run(llm: ScriptedLLM) -> None:
    for who in ("A", "B"):
        asked = f"CHILD-{who}"

        def first(r: RecordedRequest, asked: str = asked) -> bool:
            return asked in r.last_user_text and not any(m["role"] == "tool" for m in r.messages)

        run = ToolCallSpec("execute", {"command": f"echo ran-{who}"}, id="c1")
        llm.rule(first, Reply(tool_calls=[run]), times=1)
        llm.rule(lambda r, asked=asked: asked in r.last_user_text, Reply(text=f"{who} done"), times=1)
    tasks = [
        ToolCallSpec("task", {"description": f"Do {w}", "prompt": f"CHILD-{w}"}, id=f"t{w}") for w in "AB"
    ]
    llm.push(Reply(tool_calls=tasks), Reply(text="Both done."))


def _tool_result(llm: ScriptedLLM, who: str) -> str:
    child = [r for r in llm.requests if f"CHILD-{who}" in r.last_user_text][-1]
    [result] = [m["content"] for m in child.messages if m["role"] == "tool"]
    return str(result)


def test_two_children_asking_at_once_are_asked_in_turn_each_answer_to_its_own(
    chat: Terminal, llm: ScriptedLLM
) -> None:
    _two_children_run(llm)
    chat.type("delegate twice")
    screen = chat.wait_for("Answer for")
    first = re.search(r"Answer for general-purpose: Run echo ran-(\w) \(call t(\w)/c1\)", screen)
    assert first and first[1] == first[2], screen
    assert screen.count("Answer for") == 1, "one question at a time"
    chat.send("y")
    second = "B" if first[1] == "A" else "A"
    chat.wait_for(f"Run echo ran-{second} (call t{second}/c1)")
    chat.send("n")
    chat.wait_for("Both done.", timeout=30)
    assert _tool_result(llm, first[1]).startswith(f"ran-{first[1]}")
    assert f"ran-{second}" not in _tool_result(llm, second)


def test_ctrl_c_during_a_childs_question_cancels_the_turn_and_the_chat_goes_on(
    chat: Terminal, llm: ScriptedLLM, home: Path
) -> None:
    _two_children_run(llm)
    chat.type("delegate twice")
    chat.wait_for("Answer for")
    chat.send("C-c")
    screen = chat.wait_for("Cancelled after", timeout=20)
    assert "■ general-purpose: Do A · cancelled" in screen and "■ general-purpose: Do B · cancelled" in screen
    llm.reset()  # the parent's reply after the tasks was never asked for
    llm.push(Reply(text="still here"))
    chat.type("hello again")
    screen = chat.wait_for("still here", timeout=20)
    assert screen.count("(subagent) asks: Allow") == 1, screen  # the other child's never came up
    with sqlite3.connect(home / "crow.db") as db:
        rows = db.execute("SELECT count(*) FROM sessions WHERE parent_id IS NOT NULL").fetchone()
    assert rows[0] == 2


def test_crow_run_asks_two_children_in_turn_each_answer_to_its_own(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    _two_children_run(llm)
    status, shown = crow_run_answering(llm, home, workspace, [b"y\n", b"n\n"])
    assert status == 4, shown  # a call refused in its child's last tool round
    asked = re.findall(r"Answer for 'Run echo ran-(\w)' \(call t(\w)/c1\)", shown)
    assert len(asked) == 2 and all(a == b for a, b in asked), shown
    first, second = asked[0][0], asked[1][0]
    assert first != second
    assert _tool_result(llm, first).startswith(f"ran-{first}")
    assert f"ran-{second}" not in _tool_result(llm, second)
    assert "Both done." in shown


def test_crow_run_ctrl_c_at_a_childs_question_is_exit_130(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    _two_children_run(llm)
    status, shown = crow_run_answering(llm, home, workspace, [b"\x03"])
    assert status == 130, shown
    assert "Traceback" not in shown
    assert shown.count("(subagent) asks") == 1, shown
