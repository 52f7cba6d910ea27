"""The subagent view (crow/acp/subagents.py) without a process: coalescing, bounds, what a
client without the `subagents` capability is never sent, and the schema check of unstable
updates (tests/support/acp_schema.py). End to end: tests/test_acp_subagents_e2e.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from crow.acp.convert import notification_params
from crow.acp.protocol import ClientFeatures
from crow.acp.subagents import FLUSH_EVERY, MAX_SHOWN, SubagentView
from crow.events import (
    Notice,
    PlanUpdated,
    SubagentEvent,
    SubagentFinished,
    SubagentStarted,
    TextDelta,
    ThoughtDelta,
    TitleChanged,
    ToolCallStart,
    UsageUpdated,
)
from crow.messages import ToolCall
from tests.support import acp_schema

CWD = Path("/ws")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run(view: SubagentView, *events: Any) -> list[tuple[str, dict[str, Any]]]:
    import json

    shown = []
    for event in events:
        for session_id, update in view.updates("parent", CWD, event):
            shown.append((session_id, json.loads(notification_params(session_id, update))["update"]))
    return shown


def child(event: Any, session: str = "kid", call: str = "t1") -> SubagentEvent:
    return SubagentEvent(call, session, event)


STARTED = SubagentStarted("t1", "kid", "reviewer", "Review it", "/ws")


def test_the_childs_text_is_coalesced_and_its_final_state_always_shown() -> None:
    clock = Clock()
    view = SubagentView(ClientFeatures(), clock)
    shown = run(view, STARTED, *(child(TextDelta("w ", "m1")) for _ in range(50)))
    texts = [u["content"][0]["content"]["text"] for _, u in shown if u.get("content")]
    assert texts == ["w "], "one update for a burst within FLUSH_EVERY"
    clock.now += 2 * FLUSH_EVERY
    shown = run(view, child(TextDelta("x", "m1")))
    assert shown[0][1]["content"][0]["content"]["text"] == "w " * 50 + "x"
    shown = run(view, child(TextDelta("y", "m1")), SubagentFinished("t1", "kid", "end_turn"))
    assert [u["content"][0]["content"]["text"] for _, u in shown] == ["w " * 50 + "xy"], "flushed at the end"


def test_a_long_answer_shows_its_tail_only() -> None:
    view = SubagentView(ClientFeatures(), Clock())
    shown = run(
        view,
        STARTED,
        child(TextDelta("a" * 3 * MAX_SHOWN + "END", "m1")),
        SubagentFinished("t1", "kid", "end_turn"),
    )
    text = shown[-1][1]["content"][0]["content"]["text"]
    assert text.startswith("…") and text.endswith("END") and len(text) == MAX_SHOWN + 1


def test_without_the_capability_nothing_names_the_child_session() -> None:
    view = SubagentView(ClientFeatures(notices=True), Clock())
    call = ToolCall("c1", "read_file", {"path": "a.txt"})
    shown = run(
        view,
        STARTED,
        child(ThoughtDelta("hmm", "m0")),
        child(PlanUpdated([{"title": "x", "status": "pending"}])),
        child(UsageUpdated(10, 100)),
        child(TitleChanged("child title")),
        child(ToolCallStart(call)),
        child(Notice("the disk is slow", "warning", "Slow")),
        SubagentFinished("t1", "kid", "end_turn"),
    )
    assert {s for s, _ in shown} == {"parent"}
    assert [u["sessionUpdate"] for _, u in shown] == ["tool_call_update", "tool_call", "notice"]
    assert shown[1][1]["toolCallId"] == "t1/c1"
    assert shown[1][1]["_meta"] == {"crow": {"parentToolCallId": "t1", "subagentSessionId": "kid"}}
    assert (shown[2][1]["title"], shown[2][1]["description"]) == (
        "reviewer: Slow",
        "reviewer: the disk is slow",
    )


def test_a_grandchilds_calls_are_shown_under_its_task_call_shown_id() -> None:
    view = SubagentView(ClientFeatures(), Clock())
    grandchild = SubagentStarted("g1", "grandkid", "helper", "Help", "/ws")
    deep = child(SubagentEvent("g1", "grandkid", ToolCallStart(ToolCall("c9", "ls", {}))))
    shown = run(view, STARTED, child(grandchild), deep)
    assert shown[1][1]["toolCallId"] == "t1/g1"
    assert shown[2][1]["toolCallId"] == "t1/g1/c9"
    assert shown[2][1]["_meta"]["crow"]["parentToolCallId"] == "t1/g1"


def test_with_the_capability_a_failed_child_ends_idle_with_an_error() -> None:
    view = SubagentView(ClientFeatures(subagents=True), Clock())
    shown = run(
        view, STARTED, SubagentFinished("t1", "kid", "failed", input_tokens=5, output_tokens=2, error="boom")
    )
    assert shown[-1] == (
        "parent",
        {
            "sessionUpdate": "subagent_update",
            "sessionId": "kid",
            "state": {
                "state": "idle", "stopReason": "error", "error": {"code": -32000, "message": "boom"},
                "usage": {"totalTokens": 7, "inputTokens": 5, "outputTokens": 2},
            },
        },
    )  # fmt: skip
    if not isinstance(acp_schema.schemas(), str):
        message = {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {"sessionId": "parent", "update": shown[-1][1]},
        }
        assert acp_schema.violations([("in", message)]) == []


@pytest.fixture
def schema() -> None:
    if isinstance(reason := acp_schema.schemas(), str):
        if os.environ.get("CI"):
            pytest.fail(f"CI must check conformance: {reason}")
        pytest.skip(reason)


def _update(update: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return (
        "in",
        {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s", "update": update}},
    )


def test_the_check_takes_unstable_updates_by_the_unstable_schema_only(schema: None) -> None:
    good = _update({"sessionUpdate": "subagent_update", "sessionId": "kid", "state": {"state": "running"}})
    assert acp_schema.violations([good]) == []
    assert acp_schema.violations([_update({"sessionUpdate": "subagent_update", "title": "no id"})])
    assert acp_schema.violations(
        [_update({"sessionUpdate": "subagent_update", "sessionId": "k", "state": "x"})]
    )
    assert acp_schema.violations([_update({"sessionUpdate": "made_up", "sessionId": "k"})])
    assert acp_schema.violations([_update({"sessionUpdate": "usage_update", "used": 1})]), "stable: as strict"


def test_a_task_call_ending_before_its_child_did_reports_the_child_idle_first() -> None:
    """A cancel (or a failure) can end the task call without `SubagentFinished`: a client
    that shows subagents must not show that child running for ever."""
    view = SubagentView(ClientFeatures(subagents=True), Clock())
    from crow.events import ToolCallEnd
    from crow.messages import ToolResult

    task = ToolCall("t1", "task", {})
    shown = run(view, STARTED, ToolCallEnd(task, ToolResult("t1", "task", error="cancelled")))
    assert [(s, u["sessionUpdate"]) for s, u in shown[2:]] == [
        ("parent", "subagent_update"),
        ("parent", "tool_call_update"),
    ]
    assert shown[2][1] == {
        "sessionUpdate": "subagent_update", "sessionId": "kid", "state": {"state": "idle", "stopReason": "cancelled"}
    }  # fmt: skip
    finished = run(view, ToolCallEnd(task, ToolResult("t1", "task", output="again")))
    assert [u["sessionUpdate"] for _, u in finished] == ["tool_call_update"], "told once"


def test_another_sessions_call_with_the_same_id_leaves_a_running_child_shown_as_it_was() -> None:
    """Two sessions on one connection, their models reusing call ids: session B's call
    `t1` ending must not drop what is kept of session A's child run by A's `t1` (its name,
    its text so far)."""
    import json

    from crow.events import ToolCallEnd
    from crow.messages import ToolResult

    view = SubagentView(ClientFeatures(), Clock())
    shown: list[tuple[str, dict[str, Any]]] = []

    def emit(session: str, event: Any) -> None:
        for sid, update in view.updates(session, CWD, event):
            shown.append((sid, json.loads(notification_params(sid, update))["update"]))

    emit("A", STARTED)
    emit("A", child(TextDelta("first part; ")))
    emit("B", ToolCallEnd(ToolCall("t1", "read_file", {}), ToolResult("t1", "read_file", output="x")))
    emit("A", child(Notice("the disk is slow")))
    emit("A", child(TextDelta("second part", message_id="")))
    emit("A", SubagentFinished("t1", "kid", "end_turn", 1, 0, 0, None))
    notices = [u for s, u in shown if s == "A" and u["sessionUpdate"] == "agent_message_chunk"]
    assert notices and notices[-1]["content"]["text"] == "reviewer: the disk is slow\n"
    calls = [u for s, u in shown if s == "A" and u["sessionUpdate"] == "tool_call_update"]
    texts = [u["content"][0]["content"]["text"] for u in calls if u.get("content")]
    assert texts[-1] == "first part; second part"
