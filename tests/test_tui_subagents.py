"""Subagents in the terminal's renderer (crow/tui/subagents.py through crow.tui.render.Renderer):
a task's line names its agent, the child's calls print grouped under it with a summary,
children interleaving stay apart, the live part shows what each child does, and nothing
of a child reaches the parent's answer, plan or status line. Real `crow chat` and `crow
run` with a real task: tests/test_terminal_subagents.py."""

from __future__ import annotations

import re
from typing import Any

import anyio
from rich.cells import cell_len

from crow.events import (
    Event,
    ModeChanged,
    Notice,
    PlanUpdated,
    SubagentEvent,
    SubagentFinished,
    SubagentStarted,
    TextDelta,
    TitleChanged,
    ToolCallEnd,
    ToolCallRunning,
    ToolCallStart,
    UsageUpdated,
)
from crow.llm.base import ToolSpec
from crow.loop import CANCELLED, TurnResult
from crow.messages import ToolCall, ToolResult
from crow.tui.render import Renderer
from tests.test_tui_render import ANSI, HOSTILE, RUN, chunks, console, plain, tool, turn, until

TASK = ToolSpec("task", "", {}, kind="think", title="{description}")
READ = ToolSpec("read_file", "", {}, kind="read", title="Read {path}")


def task_call(task_id: str, description: str) -> ToolCall:
    return ToolCall(task_id, "task", {"description": description, "prompt": "do it"})


def started(task_id: str, description: str, name: str = "reviewer") -> list[Event]:
    call = task_call(task_id, description)
    return [
        ToolCallStart(call, TASK),
        ToolCallRunning(call),
        SubagentStarted(task_id, "s-" + task_id, name, description, "/w"),
    ]


def ended(task_id: str, description: str, answer: str = "the answer", **finished: Any) -> list[Event]:
    fields = {
        "stop_reason": "end_turn",
        "turns": 2,
        "input_tokens": 1200,
        "output_tokens": 300,
        "cost": 0.002,
    }
    fields.update(finished)
    error = CANCELLED if fields["stop_reason"] == "cancelled" else None
    result = ToolResult(task_id, "task", output=answer if error is None else "", error=error)
    return [
        SubagentFinished(task_id, "s-" + task_id, **fields),
        ToolCallEnd(task_call(task_id, description), result),
    ]


def inside(task_id: str, *events: Event) -> list[Event]:
    return [SubagentEvent(task_id, "s-" + task_id, e) for e in events]


def test_interleaved_children_print_grouped_under_their_tasks_with_a_summary() -> None:
    con, out = console(width=100)
    renderer = Renderer(con)
    # both children call their own "c1": their ids are their own
    a_read = tool("c1", READ, {"path": "auth.py"}, ToolResult("c1", "read_file", output="auth source"))
    b_read = tool("c1", READ, {"path": "calls.py"}, ToolResult("c1", "read_file", output="calls source"))
    b_run = tool("c2", RUN, {"command": "grep -r login"}, ToolResult("c2", "execute", error="exit 1\nmore"))
    events = [
        *started("t1", "Review auth"),
        *started("t2", "Find callers", name="general-purpose"),
        *inside("t1", a_read[0], a_read[1]),
        *inside("t2", b_read[0], *chunks("CHILD-TEXT of b"), b_read[1], b_read[2]),
        *inside("t1", a_read[2], *chunks("CHILD-TEXT of a")),
        *inside("t2", *b_run),
        *ended("t2", "Find callers", turns=1, cost=None),
        *ended("t1", "Review auth"),
        *chunks("Parent answer.", message_id="p2"),
    ]
    turn(renderer, *events)
    shown = plain(out)
    assert "CHILD-TEXT" not in shown, "a child's answer is the task's result, folded"
    assert "the answer" not in shown
    second = re.search(
        r"✓ general-purpose: Find callers · \d+\.\d s\n"
        r"  ✓ Read calls\.py · \d+\.\d s\n"
        r"  ✗ Run grep -r login · failed after \d+\.\d s\n"
        r"    │ Error: exit 1\n"
        r"  ↳ ✓ done · 1 model call · 1\.2k tokens in, 300 out · \d+\.\d s\n",
        shown,
    )
    first = re.search(
        r"✓ reviewer: Review auth · \d+\.\d s\n"
        r"  ✓ Read auth\.py · \d+\.\d s\n"
        r"  ↳ ✓ done · 2 model calls · 1\.2k tokens in, 300 out · \$0\.0020 · \d+\.\d s\n",
        shown,
    )
    assert first and second, shown
    assert second.start() < first.start() < shown.index("Parent answer.")
    assert renderer.expand() is True
    expanded = plain(out)[len(shown) :]
    assert "reviewer: Review auth › ✓ Read auth.py" in expanded and "auth source" in expanded
    assert "general-purpose: Find callers › ✓ Read calls.py" in expanded and "calls source" in expanded
    assert "CHILD-TEXT" not in expanded and "the answer" in expanded  # the task's result, whole


def test_the_live_part_shows_each_childs_calls_and_latest_line_under_its_task() -> None:
    con, out = console(terminal=True, width=100)
    renderer = Renderer(con)
    a_read = tool("c1", READ, {"path": "auth.py"}, ToolResult("c1", "read_file", output="x"))
    b_read = tool("c1", READ, {"path": "calls.py"}, ToolResult("c1", "read_file", output="y"))

    async def run() -> None:
        renderer.start_turn()
        for event in [*started("t1", "Review auth"), *started("t2", "Find callers", name="finder")]:
            await renderer.emit(event)
        for event in [
            *inside("t1", *a_read),
            *inside("t2", b_read[0]),
            *inside("t1", *chunks("first\nnow a")),
        ]:
            await renderer.emit(event)
        frame = re.compile(
            r"⋯ reviewer: Review auth\n  ✓ Read auth\.py · \d+\.\d s\n  │ now a\n"
            r"⋯ finder: Find callers\n  ⋯ Read calls\.py\n"
        )
        await until(lambda: frame.search(plain(out)))
        renderer.end_turn(TurnResult("end_turn"))

    anyio.run(run)


def test_a_childs_plan_usage_title_and_mode_leave_the_parents_alone() -> None:
    con, out = console(terminal=True)
    renderer = Renderer(con)

    async def run() -> None:
        renderer.start_turn()
        await renderer.emit(UsageUpdated(64000, 128000, 1.5))
        for event in started("t1", "Plan it"):
            await renderer.emit(event)
        child = [
            PlanUpdated([{"title": "CHILD STEP", "status": "pending"}]),
            UsageUpdated(1000, 9000, 0.01),
            TitleChanged("CHILD TITLE"),
            ModeChanged("plan"),
            Notice("CHILD INFO"),
            Notice("CHILD WARNING", severity="warning"),
        ]
        for event in inside("t1", *child):
            await renderer.emit(event)
        status = re.compile(r"Running Plan it · \d+\.\d s · 64k/128k tokens \(50% left\) · \$1\.50")
        await until(lambda: status.search(plain(out)))
        for event in ended("t1", "Plan it"):
            await renderer.emit(event)
        renderer.end_turn(TurnResult("end_turn"))

    anyio.run(run)
    shown = plain(out)
    for word in ("CHILD STEP", "CHILD TITLE", "Mode:", "CHILD INFO", "1k/9k"):
        assert word not in shown, word
    assert "  ⚠ CHILD WARNING\n" in shown
    assert re.search(r"^✓ \d+\.\d s · 64k/128k", shown, re.M), shown


def test_a_child_that_fails_says_why_in_its_summary() -> None:
    con, out = console()
    error = "The model failed: HTTP 500 from the server. Retried 3 times."
    turn(
        Renderer(con), *started("t1", "Fix it"), *ended("t1", "Fix it", "", stop_reason="failed", error=error)
    )
    assert re.search(
        r"✓ reviewer: Fix it · \d+\.\d s\n  ↳ ✗ failed · 2 model calls · 1\.2k tokens in, 300 out · \$0\.0020 · "
        r"\d+\.\d s\n    │ The model failed: HTTP 500 from the server\. Retried 3 times\.\n",
        plain(out),
    ), plain(out)
    assert "\x1b[31m↳ ✗ failed" in out.getvalue()  # red


def test_a_cancelled_child_and_its_call_say_so() -> None:
    con, out = console()
    call = ToolCall("c1", "execute", {"command": "sleep 9"})
    cancelled = ToolResult("c1", "execute", error=CANCELLED)
    events = [
        *started("t1", "Wait"),
        *inside("t1", ToolCallStart(call, RUN), ToolCallRunning(call), ToolCallEnd(call, cancelled)),
        *ended("t1", "Wait", stop_reason="cancelled", turns=1, cost=None, input_tokens=0, output_tokens=0),
    ]
    turn(Renderer(con), *events, result=TurnResult("cancelled"), cancelled=True)
    assert re.search(
        r"■ reviewer: Wait · cancelled after \d+\.\d s\n"
        r"  ■ Run sleep 9 · cancelled after \d+\.\d s\n"
        r"  ↳ ■ cancelled · 1 model call · \d+\.\d s\n",
        plain(out),
    ), plain(out)


def test_hostile_child_text_shows_literally() -> None:
    con, out = console(terminal=True, width=200)
    renderer = Renderer(con)
    bad = ToolCall("c1", "execute", {"command": HOSTILE})
    events = [
        *started("t1", HOSTILE + "\nDESC", name=HOSTILE + "\nNAME"),
        *inside(
            "t1",
            ToolCallStart(bad, RUN),
            TextDelta(HOSTILE, "m"),
            ToolCallEnd(bad, ToolResult("c1", "execute", error=HOSTILE)),
            Notice(HOSTILE, severity="error"),
        ),
        *ended("t1", HOSTILE, HOSTILE, stop_reason="failed", error=HOSTILE),
    ]
    turn(renderer, *events)
    renderer.expand()
    raw = ANSI.sub("", out.getvalue())
    assert "\x1b" not in raw and "\x07" not in raw
    shown = plain(out)
    assert "[red]fake[/red] \\x1b[8mhidden" in shown
    assert shown.count("[red]fake[/red]") >= 6  # name, title, the call, its error, the notice, the summary
    assert not re.search(r"^(NAME|DESC)", shown, re.M), "a name or a title stays on its line"


def test_on_a_20_column_terminal_no_child_line_is_wider() -> None:
    con, out = console(terminal=True, width=20)
    long = "编辑文件 " * 10
    read = tool("c1", READ, {"path": long}, ToolResult("c1", "read_file", error=long))
    events = [
        *started("t1", long, name="a-very-long-agent-name-indeed"),
        *inside("t1", *read, *chunks(long), Notice(long, severity="warning")),
        *ended("t1", long, stop_reason="failed", error=long, cost=12.5, input_tokens=10**7),
    ]
    renderer = Renderer(con)
    turn(renderer, *events, UsageUpdated(5000, 8000, 0.5))
    renderer.expand()
    for line in plain(out).splitlines():
        assert cell_len(line) <= 20, line
    assert "↳ ✗ failed" in plain(out)


def test_a_child_with_many_calls_folds_the_rest_for_expand() -> None:
    con, out = console()
    renderer = Renderer(con)
    calls = [
        e
        for n in range(15)
        for e in tool(
            f"c{n}", READ, {"path": f"f{n}.py"}, ToolResult(f"c{n}", "read_file", output=f"body {n}")
        )
    ]
    turn(renderer, *started("t1", "Read all"), *inside("t1", *calls), *ended("t1", "Read all"))
    shown = plain(out)
    assert "Read f8.py" in shown and "Read f9.py" not in shown
    assert "  … 6 more lines (Ctrl-O to expand)\n  ↳ ✓ done" in shown
    renderer.expand()
    assert "reviewer: Read all › ✓ Read f14.py" in plain(out) and "body 14" in plain(out)


def test_fifty_children_at_once_keep_the_live_part_within_half_the_screen() -> None:
    from crow.tui.live import LiveView

    con, _ = console(width=60)
    renderer = Renderer(con)

    async def run() -> None:
        renderer.start_turn()
        for n in range(50):
            read = tool("c1", READ, {"path": f"f{n}.py"}, ToolResult("c1", "read_file", output="x"))
            for event in [
                *started(f"t{n}", f"Task {n}"),
                *inside(f"t{n}", *read, read[0], *chunks("text\nmore")),
            ]:
                await renderer.emit(event)

    anyio.run(run)
    assert renderer._state is not None
    lines = con.render_lines(LiveView(renderer._state), con.options)
    assert len(lines) <= 12, lines  # a 24-line screen: the live part takes half at most
    shown = "\n".join("".join(s.text for s in line).rstrip() for line in lines)
    assert "reviewer: Task 49\n  ✓ Read f49.py" in shown and "│ more" in shown
