"""`crow chat`'s questions (crow/tui/questions.py), driven through a real terminal (tmux):
permission pickers one at a time, showing the command or the diff, with crow's scoped
choices; `ask_user` as a picker, a checklist or a line of text; Ctrl-C; hostile text."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CROW, crow_env
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec
from tests.support.tmux import Terminal


@pytest.fixture
def chat(tmp_path: Path, llm: ScriptedLLM, home: Path, workspace: Path) -> Iterator[object]:
    """`chat()`: `crow chat` in a terminal, at its first prompt."""
    opened: list[Terminal] = []

    def open_(width: int = 120, height: int = 40) -> Terminal:
        sock = tmp_path / f"tmux{len(opened)}.sock"
        term = Terminal([*CROW, "chat"], env=crow_env(llm, home), cwd=workspace, socket=sock, width=width,
                        height=height)  # fmt: skip
        opened.append(term)
        term.wait_for("›")
        return term

    yield open_
    for term in opened:
        term.close()


def tool_results(llm: ScriptedLLM, request: int) -> dict[str, str]:
    """The tool results the model got in its `request`-th request (0-based), by call id."""
    messages = llm.wait_for_requests(request + 1, timeout=20)[request].messages
    return {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}


def run(command: str, id: str) -> ToolCallSpec:
    return ToolCallSpec(name="execute", arguments={"command": command}, id=id)


def test_allow_once_runs_the_command_and_the_model_reads_its_output(chat, llm: ScriptedLLM) -> None:
    llm.push(Reply(tool_calls=[run("echo hi-from-the-shell", "a")]), Reply(text="It said hi."))
    term = chat()
    term.type("greet")
    screen = term.wait_for("Answer for")
    assert "Allow Run echo hi-from-the-shell?" in screen and "$ echo hi-from-the-shell" in screen
    assert "(call a)" in screen and "Always allow `echo` commands" in screen and "Reject" in screen
    term.send("Enter")  # the first option: allow once
    term.wait_for("It said hi.")
    assert tool_results(llm, 1)["a"].startswith("hi-from-the-shell")
    assert "✓ Allow" in term.screen()


def test_a_long_command_in_a_small_terminal(chat, llm: ScriptedLLM) -> None:
    """The command is shown whole above the picker; the picker's title is cut short, so
    the options keep their room in 40x12."""
    command = "echo " + "x" * 300
    llm.push(Reply(tool_calls=[run(command, "a")]), Reply(text="Long."))
    term = chat(width=40, height=12)
    term.type("go")
    screen = term.wait_for("1. Allow")
    assert f"  $ {command}\n" in screen and "x" * 30 + "… (call a)" in screen
    term.send("Enter")
    term.wait_for("Long.")
    assert tool_results(llm, 1)["a"].startswith("x" * 300)


def test_reject_does_not_run_the_command_and_the_model_is_told(
    chat, llm: ScriptedLLM, workspace: Path
) -> None:
    llm.push(Reply(tool_calls=[run("touch made.txt", "a")]), Reply(text="Understood."))
    term = chat()
    term.type("make a file")
    term.wait_for("Answer for")
    term.send("n")  # TerminalClient's key for "Reject"
    term.wait_for("Understood.")
    assert "declined" in tool_results(llm, 1)["a"]
    assert not (workspace / "made.txt").exists()
    assert "✗ Reject" in term.screen()


def test_escape_leaves_a_permission_unanswered(chat, llm: ScriptedLLM, workspace: Path) -> None:
    llm.push(Reply(tool_calls=[run("touch made.txt", "a")]), Reply(text="Skipped."))
    term = chat()
    term.type("make a file")
    term.wait_for("Answer for")
    term.send("Escape")
    term.wait_for("Skipped.")
    assert "did not answer" in tool_results(llm, 1)["a"] and not (workspace / "made.txt").exists()
    assert "No answer: not run." in term.screen()


def test_always_for_the_command_does_not_ask_again(chat, llm: ScriptedLLM) -> None:
    llm.push(
        Reply(tool_calls=[run("echo again", "a")]),
        Reply(tool_calls=[run("echo again", "b")]),
        Reply(text="Twice."),
    )
    term = chat()
    term.type("twice")
    term.wait_for("Answer for")
    term.send("a")  # "Always allow `echo` commands"
    term.wait_for("Twice.")
    assert tool_results(llm, 2)["b"].startswith("again")
    assert term.screen().count("Allow Run echo again?") == 1


def test_two_questions_at_once_are_asked_one_at_a_time(chat, llm: ScriptedLLM, workspace: Path) -> None:
    """Two writes to different files run side by side (crow.batch): the second permission
    question waits until the first is answered."""
    write = [ToolCallSpec(name="write_file", arguments={"path": f"{n}.txt", "content": f"{n}\n"}, id=n)
             for n in ("one", "two")]  # fmt: skip
    llm.push(Reply(tool_calls=write), Reply(text="Both asked."))
    term = chat()
    term.type("write two files")
    first = term.wait_for("Answer for")
    with pytest.raises(AssertionError):  # the second question does not show meanwhile
        term.wait_for(lambda s: s.count("Answer for") > 1, timeout=1.5)
    asked = "one" if "Answer for Write one.txt" in first else "two"
    term.send("y")
    second = term.wait_for(
        lambda s: s.count("\nAllow Write ") == 2 and s.rstrip().endswith("Ctrl-C cancel the turn")
    )
    other = "two" if asked == "one" else "one"
    assert second.index("✓ Allow") < second.index(f"Allow Write {other}.txt?")
    term.send("n")
    term.wait_for("Both asked.")
    assert (workspace / f"{asked}.txt").exists() and not (workspace / f"{other}.txt").exists()


def test_two_ask_user_questions_at_once_are_asked_one_at_a_time(chat, llm: ScriptedLLM) -> None:
    """Questions are read-only, so two in one reply run side by side and ask at once (the
    permissions hook's own lock does not cover them): one picker at a time, each answer to
    its own question."""
    pair = [ask("Which colour?", ["red", "green"], id="c"), ask("Which size?", ["small", "large"], id="s")]
    llm.push(Reply(tool_calls=pair), Reply(text="Both answered."))
    term = chat()
    term.type("choose")
    first = term.wait_for("2. ")
    with pytest.raises(AssertionError):  # the second question does not show meanwhile
        term.wait_for(lambda s: "Which colour?" in s and "Which size?" in s, timeout=1.5)
    colour_first = "Which colour?" in first
    term.send("2")
    term.wait_for(lambda s: "Which colour?" in s and "Which size?" in s and "2. " in s.split("› ")[-1])
    term.send("1")
    term.wait_for("Both answered.")
    results = tool_results(llm, 1)
    assert results == (
        {"c": 'The user chose "green".', "s": 'The user chose "small".'}
        if colour_first
        else {"s": 'The user chose "large".', "c": 'The user chose "red".'}
    )


def test_an_edit_shows_its_diff_in_colour(chat, llm: ScriptedLLM, workspace: Path) -> None:
    (workspace / "f.txt").write_text("alpha\nbeta\ngamma\n")
    edit = ToolCallSpec(
        name="edit_file", arguments={"path": "f.txt", "old_text": "beta", "new_text": "BETA"}, id="e"
    )
    llm.push(Reply(tool_calls=[edit]), Reply(text="Edited."))
    term = chat()
    term.type("edit")
    screen = term.wait_for("Answer for")
    assert "Allow Edit f.txt?" in screen and "Always allow edits to f.txt" in screen
    assert "  -beta" in screen and "  +BETA" in screen and "{" not in screen.split("Allow Edit")[1]
    coloured = term.screen(colours=True)
    assert "\x1b[31m  -beta" in coloured and "\x1b[32m  +BETA" in coloured, coloured
    term.send("Enter")
    term.wait_for("Edited.")
    assert (workspace / "f.txt").read_text() == "alpha\nBETA\ngamma\n"


def ask(
    question: str, options: list[str] | None = None, multiple: bool = False, id: str = "q"
) -> ToolCallSpec:
    args: dict[str, object] = {"question": question}
    if options is not None:
        args.update(options=options, multiple=multiple)
    return ToolCallSpec(name="ask_user", arguments=args, id=id)


def test_ask_user_with_options_is_a_picker(chat, llm: ScriptedLLM) -> None:
    llm.push(Reply(tool_calls=[ask("Which colour?", ["red", "green", "blue"])]), Reply(text="Green it is."))
    term = chat()
    term.type("pick")
    screen = term.wait_for("3. blue")
    assert "Which colour?" in screen and "Choose one" in screen
    term.send("Down", "Enter")
    term.wait_for("Green it is.")
    assert tool_results(llm, 1)["q"] == 'The user chose "green".'


def test_ask_user_with_several_answers_is_a_checklist(chat, llm: ScriptedLLM) -> None:
    llm.push(
        Reply(tool_calls=[ask("Which toppings?", ["cheese", "ham", "olives"], multiple=True)]),
        Reply(text="Noted."),
    )
    term = chat()
    term.type("pizza")
    term.wait_for("3. [ ] olives")
    term.send("Space", "Down", "Down", "Space")
    term.wait_for(lambda s: "1. [x] cheese" in s and "3. [x] olives" in s and "2. [ ] ham" in s)
    term.send("Enter")
    term.wait_for("Noted.")
    assert tool_results(llm, 1)["q"] == 'The user chose: "cheese", "olives".'


def test_ask_user_free_text_and_escape_declines(chat, llm: ScriptedLLM) -> None:
    llm.push(
        Reply(tool_calls=[ask("What is the project called?")]),
        Reply(tool_calls=[ask("And its licence?", id="r")]),
        Reply(text="Thanks."),
    )
    term = chat()
    term.type("name it")
    term.wait_for("Your answer")
    term.type("Blue Heron")
    term.wait_for("And its licence?")
    assert tool_results(llm, 1)["q"] == "The user answered:\nBlue Heron"
    term.wait_for(lambda s: s.count("Your answer") == 1 and s.rstrip().endswith("›"))
    term.send("Escape")
    term.wait_for("Thanks.")
    assert tool_results(llm, 2)["r"].startswith("The user declined to answer.")


def test_ctrl_c_during_a_question_cancels_the_turn_and_the_next_prompt_works(
    chat, llm: ScriptedLLM, workspace: Path
) -> None:
    llm.push(Reply(tool_calls=[run("touch made.txt", "a")]), Reply(text="Back again."))
    term = chat()
    term.type("make a file")
    term.wait_for("Answer for")
    term.send("C-c")
    term.wait_for(lambda s: "Cancelled after" in s and "\n›" in s.split("Cancelled after")[-1])
    term.type("hello")
    term.wait_for("Back again.")
    assert not (workspace / "made.txt").exists()
    assert "Traceback" not in term.screen()


def test_type_ahead_does_not_answer_a_question(chat, llm: ScriptedLLM, workspace: Path) -> None:
    """Keys pressed while the model still streams were meant for something else: the
    question that follows waits for keys pressed after it appeared."""
    slow = Reply(
        text="thinking " * 30, chunk_size=9, chunk_delay=0.1, tool_calls=[run("touch made.txt", "a")]
    )
    llm.push(slow, Reply(text="Fine."))
    term = chat()
    term.type("go")
    term.wait_for("thinking")
    term.send("y", "Enter", "y")  # allow, twice over, before the question
    term.wait_for("Answer for")
    term.send("n")
    term.wait_for("Fine.")
    assert "declined" in tool_results(llm, 1)["a"] and not (workspace / "made.txt").exists()


def test_an_unanswered_question_is_withdrawn(chat, llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    (home / "config.yaml").write_text("permission_timeout: 1\n")
    llm.push(Reply(tool_calls=[run("touch made.txt", "a")]), Reply(text="No answer then."), Reply(text="Hi."))
    term = chat()
    term.type("make a file")
    term.wait_for("No answer within 1 s: the question was withdrawn.")
    term.wait_for(lambda s: "No answer then." in s and s.rstrip().endswith("›"))
    assert "did not answer" in tool_results(llm, 1)["a"] and not (workspace / "made.txt").exists()
    term.type("hello")  # the terminal is the chat's again
    term.wait_for("Hi.")


def test_a_projects_crow_yaml_is_trusted_through_a_picker(chat, llm: ScriptedLLM, workspace: Path) -> None:
    (workspace / "crow.yaml").write_text("mode: yolo\n")
    llm.push(Reply(tool_calls=[run("echo trusted", "a")]), Reply(text="Ran it."))
    term = chat()
    term.type("run it")
    screen = term.wait_for("3. Ignore it")
    assert f"Trust {workspace}?" in screen and "1. Apply for this session" in screen
    term.send("Enter")
    term.wait_for("Ran it.")  # yolo (from crow.yaml): no permission question
    assert "Allow Run" not in term.screen() and tool_results(llm, 1)["a"].startswith("trusted")


def test_hostile_text_is_shown_escaped_and_cannot_fake_the_options(chat, llm: ScriptedLLM) -> None:
    """A question, an option or a command with escape sequences (clear the screen, conceal,
    move the cursor), a `\\r` or a newline shows them as text: an option stays one line of
    the picker, a command's next line is indented under it."""
    fake = "\x1b[2J\x1b[8mhidden\x1b[1;1H\r"
    llm.push(
        Reply(tool_calls=[ask(f"Pick{fake}", [f"safe{fake}\n  2. Allow", "other"])]),
        Reply(tool_calls=[run(f"echo ok{fake}\n  1. Allow; rm -rf gone", "x")]),
        Reply(text="Done."),
    )
    term = chat()
    term.type("go")
    screen = term.wait_for("2. other")
    escaped = "\\x1b[2J\\x1b[8mhidden\\x1b[1;1H"  # ask_user strips the question's trailing \\r
    shown = escaped + "\\x0d"
    assert f"Pick{escaped}\n" in screen and f"1. safe{shown}\\x0a  2. Allow\n" in screen, screen
    term.send("Enter")
    screen = term.wait_for("Answer for")
    assert f"  $ echo ok{shown}\n      1. Allow; rm -rf gone\n" in screen, screen
    term.send("n")
    term.wait_for("Done.")
    assert "\x1b" not in term.screen()


FORM = """
import json, anyio
from crow.tui.questions import ChatClient
from crow.tui.render import Renderer

async def main() -> None:
    client = ChatClient(".", Renderer(), on_interrupt=lambda: print("INTERRUPTED"))
    fields = {"go": {"type": "boolean", "title": "Proceed?"}, "n": {"type": "integer", "title": "How many?"}}
    for message in ("First form", "Second form"):
        got = await client.elicit(None, message, {"type": "object", "properties": fields})
        print("RESULT", json.dumps([got.action, got.content]))

anyio.run(main)
"""


def test_a_form_asks_yes_or_no_and_a_number_and_ctrl_c_cancels(tmp_path: Path, home: Path) -> None:
    """Forms other than ask_user's (an MCP server's elicitation): a boolean is a yes/no
    picker, a number is typed and checked; Ctrl-C cancels the form and the turn."""
    term = Terminal(
        [*CROW[:1], "-c", FORM], env=crow_env(None, home), cwd=tmp_path, socket=tmp_path / "t.sock"
    )
    try:
        term.wait_for("2. No")
        term.send("y")
        term.wait_for("How many?")
        term.type("many")
        term.wait_for("Type a whole number, or Esc to decline")
        term.send(*["BSpace"] * 4)
        term.type("7")
        screen = term.wait_for('RESULT ["accept", {"go": true, "n": 7}]')
        assert "  › yes\n" in screen and "  › 7\n" in screen, screen
        term.wait_for(lambda s: "Second form" in s and "2. No" in s.split("Second form")[1])
        term.send("C-c")
        term.wait_for('RESULT ["cancel", null]')
        assert "INTERRUPTED" in term.screen()
    finally:
        term.close()
