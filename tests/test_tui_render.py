"""crow.tui.render.Renderer fed events, read from its console: the streamed Markdown answer,
folded reasoning, tool lines, diffs, the plan, notices, the turn's summary, `paused()` and
`expand()`, and hostile text. The screen through a real terminal: tests/test_tui_chat.py."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from rich.cells import cell_len
from rich.console import Console

from crow.events import (
    CompactionFinished,
    CompactionStarted,
    Event,
    ModeChanged,
    Notice,
    PlanUpdated,
    TextDelta,
    ThoughtDelta,
    TitleChanged,
    ToolCallEnd,
    ToolCallRunning,
    ToolCallStart,
    UsageUpdated,
    UserMessageAdded,
)
from crow.llm.base import ToolSpec
from crow.loop import CANCELLED, TurnResult
from crow.messages import ToolCall, ToolResult, human
from crow.tui.blocks import MarkdownBlocks
from crow.tui.render import Renderer
from crow.tui.text import clip
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec
from tests.test_tui_chat import at_prompt, terminal_for  # noqa: F401 (a fixture)

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
HOSTILE = "[red]fake[/red] \x1b[8mhidden\x1b[0m \x1b]8;;http://evil\x07link \ud800 end"
RUN = ToolSpec("execute", "", {}, kind="execute", title="Run {command}")
EDIT = ToolSpec("edit_file", "", {}, kind="edit", title="Edit {path}")


def console(*, terminal: bool = False, width: int = 80) -> tuple[Console, io.StringIO]:
    """A console writing to a buffer; `terminal`: it is a terminal (the live part runs)."""
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=width, height=24, color_system="standard"), out


def turn(renderer: Renderer, *events: Event, result: TurnResult | None = None, **end: Any) -> None:
    async def feed() -> None:
        renderer.start_turn()
        for event in events:
            await renderer.emit(event)
        renderer.end_turn(result or TurnResult("end_turn"), **end)

    anyio.run(feed)


async def until(test: Any, timeout: float = 10.0) -> None:
    """Wait for the live part's thread to draw what `test` looks for."""
    with anyio.fail_after(timeout):
        while True:
            if test():
                return
            await anyio.sleep(0.02)


def plain(out: io.StringIO) -> str:
    return "\n".join(line.rstrip() for line in ANSI.sub("", out.getvalue()).splitlines())


def chunks(text: str, size: int = 3, message_id: str = "m1") -> list[Event]:
    return [TextDelta(text[i : i + size], message_id) for i in range(0, len(text), size)]


def tool(call_id: str, spec: ToolSpec, args: dict[str, Any], result: ToolResult) -> list[Event]:
    call = ToolCall(call_id, spec.name, args)
    return [ToolCallStart(call, spec), ToolCallRunning(call), ToolCallEnd(call, result)]


# ------------------------------------------------------------------ the answer


def test_markdown_blocks_end_at_blank_lines_headings_and_closed_fences() -> None:
    blocks = MarkdownBlocks()
    got: list[str] = []
    for piece in [
        "# Ti",
        "tle\nPara",
        " one\nstill one\n\n- a\n- b\n",
        "\n```py\nx = 1\n\ny = 2\n",
        "``",
        "`\nafter",
    ]:
        got += blocks.feed(piece)
    assert got == ["# Title", "Para one\nstill one", "- a\n- b", "```py\nx = 1\n\ny = 2\n```"]
    assert blocks.tail() == "after"
    assert blocks.flush() == "after" and blocks.tail() == ""


def test_a_fence_interrupts_a_paragraph_and_closes_only_on_its_own_marker() -> None:
    blocks = MarkdownBlocks()
    got = blocks.feed("text\n~~~~\n```\n~~~\nstill code\n~~~~~\n")
    assert got == ["text", "~~~~\n```\n~~~\nstill code\n~~~~~"]
    assert blocks.feed("```\nopen\n") == [] and blocks.in_fence and blocks.fence_opening() == "```"


def test_the_answer_is_markdown_each_finished_block_printed_once() -> None:
    con, out = console()
    paragraphs = [f"Paragraph number {n} with **bold** words." for n in range(200)]
    answer = "\n\n".join(paragraphs) + "\n\n```python\ndef f():\n    return 1\n```\n\n- one\n- two\n"
    turn(Renderer(con), *chunks(answer))
    shown = plain(out)
    for n in range(200):
        assert shown.count(f"Paragraph number {n} with bold words.") == 1
    assert "**" not in shown and "```" not in shown
    assert "def f():" in shown and "• one" in shown and "• two" in shown


def test_code_blocks_are_highlighted_in_the_terminals_own_colours() -> None:
    con, out = console(terminal=True)
    turn(Renderer(con), *chunks("Code:\n\n```python\ndef f():\n    return 1\n```\n"))
    assert "\x1b[94mdef\x1b[0m" in out.getvalue()  # a keyword, in the palette's bright blue


def test_a_new_assistant_message_starts_a_new_block() -> None:
    con, out = console()
    turn(Renderer(con), TextDelta("First message", "m1"), TextDelta("Second message", "m2"))
    assert "First message\n\nSecond message" in plain(out)


def test_live_rendering_costs_a_bounded_amount_per_chunk_on_a_terminal() -> None:
    """Re-rendering the whole answer per chunk would write O(n²) to the terminal; the
    renderer writes each finished block once plus a few frames of the unfinished one."""
    answer = "\n\n".join(f"Paragraph {n}: " + "word " * 30 for n in range(150))
    con, out = console(terminal=True)
    began = time.process_time()
    turn(Renderer(con), *chunks(answer, size=4))
    cpu = time.process_time() - began
    assert all(f"Paragraph {n}:" in out.getvalue() for n in range(150))
    assert len(out.getvalue()) < 4 * len(answer) + 50_000, len(out.getvalue())
    assert cpu < 5.0  # ~6,000 chunks; O(n²) re-rendering takes minutes


def test_a_huge_chunk_of_many_lines_is_cut_in_linear_time() -> None:
    """One delta of 4 MB (a hostile model's): each line's cut once copied all that followed."""
    blocks = MarkdownBlocks()
    began = time.process_time()
    done = blocks.feed("word word word\n\n" * 250_000)
    assert time.process_time() - began < 5.0  # 0.2 s; line-by-line copying took 24 s
    assert len(done) == 250_000 and blocks.tail() == ""


def test_a_huge_line_without_newlines_streams_in_bounded_time() -> None:
    con, out = console(terminal=True, width=20)
    began = time.monotonic()
    turn(Renderer(con), *chunks("x" * 200_000, size=100))
    assert time.monotonic() - began < 10
    assert plain(out).count("x") >= 200_000


def test_hostile_text_shows_literally_everywhere() -> None:
    con, out = console(terminal=True, width=200)
    result = ToolResult("c1", "execute", output=HOSTILE)
    todos = [{"title": HOSTILE, "status": "pending"}]
    turn(
        Renderer(con),
        ThoughtDelta(HOSTILE, "m1"),
        *chunks(HOSTILE + "\n\n[link](http://evil.example)\n\n", size=5),
        *tool(
            "c1", ToolSpec("execute", "", {}, kind="execute", title="{command}"), {"command": HOSTILE}, result
        ),
        PlanUpdated(todos),
        Notice(HOSTILE, "warning"),
        ModeChanged(HOSTILE),
        TitleChanged(HOSTILE),
        UserMessageAdded(human(HOSTILE)),
        result=TurnResult("end_turn", error=HOSTILE),
    )
    raw = out.getvalue()
    assert "\x1b[8m" not in raw and "\x1b]8" not in raw and "\x07" not in raw and "\ud800" not in raw
    shown = plain(out)
    assert (
        shown.count("[red]fake[/red] \\x1b[8mhidden\\x1b[0m \\x1b]8;;http://evil\\x07link \\xd800 end") >= 8
    )
    assert "link (http://evil.example)" in shown  # the address shown, not hidden in an OSC 8 link


# ------------------------------------------------------------------ reasoning


def test_reasoning_is_folded_to_one_line_and_expand_prints_it() -> None:
    con, out = console()
    renderer = Renderer(con)
    assert renderer.expand() is False
    turn(
        renderer,
        ThoughtDelta("Secret plan: ", "m1"),
        ThoughtDelta("first A, then B.", "m1"),
        TextDelta("Answer.", "m1"),
    )
    shown = plain(out)
    assert re.search(r"∴ Thought for \d+\.\d s \(Ctrl-O to expand\)\n\nAnswer\.", shown), shown
    assert "Secret plan" not in shown
    assert renderer.expand() is True
    assert "Secret plan: first A, then B." in plain(out)


# ------------------------------------------------------------------ tools


def test_a_tool_call_is_one_line_with_a_preview_folded_and_expandable() -> None:
    con, out = console(width=40)
    renderer = Renderer(con)
    output = "alpha beta gamma delta epsilon zeta eta theta iota kappa\n" + "".join(
        f"row {n}\n" for n in range(10)
    )
    turn(
        renderer,
        *tool("c1", RUN, {"command": "pytest -q\nsecond line"}, ToolResult("c1", "execute", output=output)),
    )
    lines = plain(out).splitlines()
    assert re.fullmatch(r"✓ Run pytest -q … · \d+\.\d s", lines[0]), lines
    assert lines[1] == "  │ alpha beta gamma delta epsilon zeta…"  # cut after a word
    assert lines[2:5] == ["  │ row 0", "  │ row 1", "  … 8 more lines"]
    assert "row 9" not in plain(out)
    assert renderer.expand() is True
    assert "row 9" in plain(out) and "kappa" in plain(out)


def test_reasoning_and_a_tool_output_with_crlf_line_endings_expand_without_escapes() -> None:
    con, out = console()
    renderer = Renderer(con)
    output = "".join(f"row {n}\r\n" for n in range(10))  # a command printing a CRLF file
    events = tool("c1", RUN, {"command": "type a.txt"}, ToolResult("c1", "execute", output=output))
    turn(renderer, ThoughtDelta("first\r\nsecond\r\n", "t1"), *events)
    assert renderer.expand() is True
    assert "first\nsecond" in plain(out)
    assert "row 9" in plain(out) and "x0d" not in plain(out)


def test_failed_and_cancelled_calls_say_so() -> None:
    con, out = console()
    failed = ToolResult("c1", "execute", error="exit 2")
    cancelled = ToolResult("c2", "execute", error=CANCELLED)
    turn(
        Renderer(con),
        *tool("c1", RUN, {"command": "make"}, failed),
        *tool("c2", RUN, {"command": "sleep 9"}, cancelled),
    )
    shown = plain(out)
    assert re.search(r"✗ Run make · failed after \d+\.\d s\n  │ Error: exit 2", shown), shown
    assert re.search(r"■ Run sleep 9 · cancelled after \d+\.\d s", shown), shown


def test_an_edit_shows_its_diff_in_colour_folded_beyond_a_few_lines() -> None:
    con, out = console(width=60)
    renderer = Renderer(con)
    old = "".join(f"line {n}\n" for n in range(40))
    new = old.replace("line 3\n", "line three\n").replace("line 2", "line 2x")  # 2, 20-29: changed
    meta = {"crow/diff": {"path": "/w/a.py", "old_text": old, "new_text": new}}
    small = {"crow/diff": {"path": "/w/b.py", "old_text": "a\nb\n", "new_text": "a\nB\n"}}
    turn(
        renderer,
        *tool("c1", EDIT, {"path": "b.py"}, ToolResult("c1", "edit_file", output="ok", meta=small)),
        *tool("c2", EDIT, {"path": "a.py"}, ToolResult("c2", "edit_file", output="ok", meta=meta)),
    )
    raw = out.getvalue()
    assert "\x1b[31m-b" in raw and "\x1b[32m+B" in raw  # red, green
    shown = plain(out)
    assert re.search(r"✓ Edit b\.py · \d+\.\d s\n  @@ -1,2 \+1,2 @@\n   a\n  -b\n  \+B\n", shown), shown
    assert "+line three" in shown and "+line 2x9" not in shown and "more lines of diff" in shown
    assert renderer.expand() is True
    assert "+line 2x9" in plain(out)


def test_on_a_20_column_terminal_no_line_is_wider_and_wide_characters_count_double() -> None:
    con, out = console(terminal=True, width=20)
    title = {"command": "编辑文件 " * 10}
    result = ToolResult("c1", "execute", output="词 " * 50 + "\n" + "x" * 300)
    turn(
        Renderer(con),
        *chunks("A paragraph " * 20 + "\n\n"),
        *tool("c1", RUN, title, result),
        UsageUpdated(5000, 8000, 0.5),
    )
    for line in plain(out).splitlines():
        assert cell_len(line) <= 20, line


def test_clip_never_cuts_inside_an_escape() -> None:
    assert clip("abc\x1bdef", 6) == "abc…"
    assert clip("abc\x1bdef", 8) == "abc\\x1b…"
    assert clip("one two three", 10) == "one two…"


# ------------------------------------------------------------------ plan, notices, summary


def test_the_plan_is_a_checklist_printed_when_it_changes() -> None:
    con, out = console()
    plan = [
        {"title": "Read the code", "status": "done"},
        {"title": "Fix the bug", "status": "in_progress"},
        {"title": "Run the tests", "status": "pending"},
    ]
    later = [{**t, "status": "done"} for t in plan]
    turn(Renderer(con), PlanUpdated(plan), PlanUpdated(plan), PlanUpdated(later))
    shown = plain(out)
    assert "Plan\n☑ Read the code\n◐ Fix the bug\n☐ Run the tests" in shown
    assert shown.count("Plan\n") == 2 and "☑ Run the tests" in shown


def test_notices_compaction_mode_title_and_steering_are_shown_apart_from_the_answer() -> None:
    con, out = console(terminal=True)
    turn(
        Renderer(con),
        Notice("Disk almost full", "warning"),
        Notice("Hook failed", "error"),
        Notice("Compacted: 10 messages", "info", compaction="k1"),
        CompactionStarted("k1"),
        CompactionFinished("k1", "completed", summary="..."),
        CompactionStarted("k2"),
        CompactionFinished("k2", "failed", error="model down"),
        ModeChanged("yolo"),
        TitleChanged("Fix the parser"),
        UserMessageAdded(human("also run the linter")),
    )
    shown, raw = plain(out), out.getvalue()
    assert "⚠ Disk almost full" in shown and "\x1b[33m⚠" in raw
    assert "✗ Hook failed" in shown and "\x1b[31m✗" in raw
    assert "Compacted: 10 messages" not in shown  # CompactionFinished says it
    assert "⟳ Context compacted" in shown
    assert "✗ Compaction failed (the context is unchanged): model down" in shown
    assert "Mode: yolo" in shown and "Session: Fix the parser" in shown and "› also run the linter" in shown


@pytest.mark.parametrize(
    ("result", "cancelled", "expected"),
    [
        (TurnResult("end_turn"), False, r"✓ \d+\.\d s · 12\.4k/128k tokens \(90% left\) · \$0\.012$"),
        (None, True, r"■ Cancelled after \d+\.\d s · 12\.4k/128k"),
        (
            TurnResult("end_turn", error="HTTP 500 from the model"),
            False,
            r"✗ Failed after \d+\.\d s: HTTP 500 from the model",
        ),
        (
            TurnResult("max_turn_requests"),
            False,
            r"⚠ Stopped after \d+\.\d s: the turn reached its limit of model requests",
        ),
    ],
)
def test_the_turn_ends_with_a_one_line_summary(
    result: TurnResult | None, cancelled: bool, expected: str
) -> None:
    con, out = console(terminal=True)
    turn(Renderer(con), UsageUpdated(12400, 128000, 0.0123), result=result, cancelled=cancelled)
    assert re.search(expected, plain(out), re.M), plain(out)


def test_a_failure_is_told_once_in_full_and_summed_up_in_one_line() -> None:
    """The failed turn's notice carries the whole reason; the summary line repeated all of
    it (a wrapped paragraph twice on screen): now its first sentence."""
    why = (
        "No model is configured. Set CROW_MODEL=provider:model (for example openai:gpt-4.1-mini "
        "with OPENAI_API_KEY), or put model: in ~/.crow/config.yaml."
    )
    con, out = console(terminal=True, width=60)
    title, rest = why.split(". ", 1)
    turn(Renderer(con), Notice(rest, "error", title), result=TurnResult("end_turn", error=why))
    shown = plain(out)
    assert re.search(r"^✗ Failed after \d+\.\d s: No model is configured\.$", shown, re.M), shown
    assert shown.count("OPENAI_API_KEY") == 1, shown
    lines = shown.splitlines()
    head = lines.index("✗ No model is configured")
    detail = lines[head + 1 : head + 4]  # the reason, wrapped to three lines, each indented
    assert all(line.startswith("  ") for line in detail) and detail[-1].endswith("config.yaml."), shown


# ------------------------------------------------------------------ paused, live


def test_paused_clears_the_live_part_holds_output_and_nests() -> None:
    con, out = console(terminal=True)
    renderer = Renderer(con)
    with renderer.paused():  # no turn: harmless
        pass

    async def run() -> None:
        renderer.start_turn()
        await renderer.emit(TextDelta("Streaming tail", "m1"))
        await until(lambda: "Streaming tail" in out.getvalue())  # the live frame drew it
        with renderer.paused():
            with renderer.paused():
                cleared = out.getvalue()
                await renderer.emit(TextDelta("\n\nMore", "m1"))
                await renderer.emit(PlanUpdated([{"title": "step", "status": "pending"}]))
                await anyio.sleep(0.3)  # a live refresh would draw now: none may
                assert out.getvalue() == cleared
            assert out.getvalue() == cleared
        assert "☐ step" in out.getvalue()[len(cleared) :]
        await until(lambda: "Writing" in out.getvalue()[len(cleared) :])  # the status line is back
        renderer.end_turn(TurnResult("end_turn"))

    anyio.run(run)
    cleared_at = out.getvalue().index("Streaming tail")
    assert "\x1b[2K" in out.getvalue()[cleared_at:]  # the live lines were erased


def test_the_status_line_shows_the_phase_elapsed_time_and_usage_while_waiting() -> None:
    con, out = console(terminal=True)
    renderer = Renderer(con)

    async def run() -> None:
        renderer.start_turn()
        await renderer.emit(UsageUpdated(64000, 128000, 1.5))
        status = re.compile(r"Waiting for the model · \d\.\d s · 64k/128k tokens \(50% left\) · \$1\.50")
        await until(lambda: status.search(plain(out)))
        renderer.end_turn(TurnResult("end_turn"))

    anyio.run(run)


def test_a_turn_started_twice_shows_the_new_turn_live() -> None:
    con, out = console(terminal=True)
    renderer = Renderer(con)

    async def run() -> None:
        renderer.start_turn()
        renderer.start_turn()  # the front end lost an end_turn (a crash in its loop)
        await renderer.emit(UsageUpdated(64000, 128000))
        await until(lambda: "64k/128k tokens" in plain(out))
        renderer.end_turn(TurnResult("end_turn"))

    anyio.run(run)
    assert re.search(r"^✓ \d+\.\d s · 64k/128k", plain(out), re.M)


def test_log_lines_print_above_the_live_part_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    """crow's log handler writes to stderr: while the live part is drawn that would tear it
    (tmux showed a status line left behind); the renderer routes it through the console."""
    import logging
    import sys

    handler = logging.StreamHandler(sys.stderr)
    logging.getLogger().addHandler(handler)
    logging.getLogger().addHandler(other := logging.NullHandler())  # no stream: left alone
    try:
        con, out = console(terminal=True)
        renderer = Renderer(con)
        renderer.start_turn()
        logging.getLogger("crow.test").warning("a log line \x1b[8mnamed")
        assert handler.stream is not sys.stderr
        renderer.end_turn(TurnResult("end_turn"))
        assert handler.stream is sys.stderr
        assert "a log line \\x1b[8mnamed" in plain(out)
        assert "a log line" not in capsys.readouterr().err
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().removeHandler(other)


# ------------------------------------------------------------------ through a real terminal

ANSWER = """## Result

The notes say **hello**. Here is the greeting as code:

```python
def greet(name):
    return f"hello {name}"
```

- first point
- second point

Done [red]literally[/red].
"""


def test_crow_chat_on_a_terminal_shows_reasoning_tools_plan_and_markdown(
    terminal_for: Any,  # noqa: F811 (the fixture imported above)
    llm: ScriptedLLM,
    home: Path,
    workspace: Path,
) -> None:
    (workspace / "notes.txt").write_text("hello\n")
    todos = [
        {"id": "1", "title": "Read the notes", "status": "done"},
        {"id": "2", "title": "Answer", "status": "in_progress"},
        {"id": "3", "title": "Celebrate", "status": "pending"},
    ]
    llm.push(
        Reply(
            reasoning="I should read the notes first.",
            tool_calls=[
                ToolCallSpec("write_todos", {"todos": todos}),
                ToolCallSpec("read_file", {"path": "notes.txt"}),
            ],
        ),
        Reply(text=ANSWER, chunk_size=4, chunk_delay=0.002),
    )
    term = terminal_for(llm, home, workspace, "chat")
    term.wait_for("›")
    term.type("what do the notes say?")
    screen = term.wait_for(lambda s: re.search(r"^✓ \d+\.\d s", s, re.M) is not None, timeout=30)
    assert re.search(r"∴ Thought for \d+\.\d s \(Ctrl-O to expand\)", screen), screen
    assert "I should read the notes first." not in screen  # folded
    assert re.search(r"^✓ Read notes\.txt · \d+\.\d s$", screen, re.M), screen
    assert "☑ Read the notes\n◐ Answer\n☐ Celebrate" in screen
    assert "Result" in screen and "## Result" not in screen and "**" not in screen
    assert 'def greet(name):\n     return f"hello {name}"' in screen and "```" not in screen
    assert "• first point\n • second point" in screen
    assert "Done [red]literally[/red]." in screen
    assert "Traceback" not in screen and "Waiting for the model" not in screen
    # Ctrl-D once the prompt is back: typed before (the terminal not yet in raw mode) it is
    # the tty's end-of-file, which the prompt never reads (a 10 s wait, then a failure)
    term.wait_for(at_prompt)
    term.send("C-d")
    assert term.wait_exit() == 0


# Markdown the block splitter once cut wrong: each is rendered chunk by chunk as rich renders
# it whole (the blank lines between blocks aside), whatever the chunk size.
SPLIT_CASES = {
    # a fence in a nested list, indented 4: a blank line in its code cut it
    "nested fence": "- a\n  - b:\n    ```python\n    def __init__(self):\n\n    # comment\n    x = __name__\n    ```\n- c\n",
    # a fence after a list item's marker
    "fence after a marker": "1. ```bash\n   make\n\n   make __x__\n   ```\n2. done\n",
    # a closing marker indented 4 is a code line
    "indented closer": "```\n    ```\ncode __x__\n\n# not a heading\n```\n\nafter\n",
    "inline backticks": "Use ```x``` inline\n\n```\ncode __a__\n\n# not a heading\n```\n\n__bold__ after\n",
    "longer fence": "````md\n```\ninner\n\n```\n````\n\nafter __x__\n",
    "tilde fence": "~~~\na\n\n# b\n~~~\n",
    "setext and table": "Title\n=====\n\nSub\n---\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\ntext\n",
    "indented code": "text\n\n    code __a__\n\n    # more\n\nend\n",
    "a fence that never ends": "```\nnever\n\nends __x__\n",
    # outside a list, a "```" indented 4 (or a tab) is a code line or a paragraph's
    "indented backticks": "para\n    ```\n    ```\ncode # x\n\n\t```\n\n# head\n```\nx\n```\n",
    # a list's fence left open ends with its item
    "a list's open fence": "* star\n    ```\n\n# head\n~~~\n````\n# head\n",
}


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.strip()]


def _whole(text: str) -> list[str]:
    from crow.tui.live import markdown

    con = Console(record=True, file=io.StringIO(), width=80, color_system=None)
    con.print(markdown(text))
    return _lines(con.export_text())


@pytest.mark.parametrize("name", list(SPLIT_CASES))
def test_an_answer_cut_into_blocks_renders_as_the_whole_would(name: str) -> None:
    text = SPLIT_CASES[name]
    for size in (1, 3, 7, len(text)):
        con = Console(record=True, file=io.StringIO(), width=80, color_system=None)
        turn(Renderer(con), *chunks(text, size))
        shown = _lines(con.export_text())[:-1]  # the turn's summary line aside
        assert shown == _whole(text), (name, size)


def test_crlf_line_endings_show_as_lf_ones() -> None:
    text = "# Title\r\n\r\npara __x__\r\n\r\n```\r\ncode\r\n\r\n# not a heading\r\n```\r\n\r\nend\r\n"
    for size in (1, 2, 5):
        con = Console(record=True, file=io.StringIO(), width=80, color_system=None)
        turn(Renderer(con), *chunks(text, size))
        shown = _lines(con.export_text())[:-1]
        assert shown == _whole(text.replace("\r\n", "\n")), size
        assert "x0d" not in con.export_text()
