"""`crow run` in a terminal (a pty): permission prompts come one at a time, each naming its
call and showing the command or the diff, and each answer goes to the call it names."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CROW, crow_env
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec


@contextlib.contextmanager
def crow_run_on_a_terminal(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """`crow run go` with a pty as its terminal: the process and the pty's master; at the
    end the process is killed if it still runs, and the master closed."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [*CROW, "run", "--cwd", str(workspace), "go"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=crow_env(llm, home),
        start_new_session=True,
    )
    os.close(slave)
    try:
        yield proc, master
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)

def crow_run_answering(llm: ScriptedLLM, home: Path, workspace: Path, answers: list[bytes]) -> tuple[int, str]:
    """`crow run go` on a terminal, each of `answers` typed at the next question (b"\\x03":
    a Ctrl-C, sent as the SIGINT a terminal sends: the pty is not the process's controlling
    terminal); its exit status and all it showed."""
    out, answered, answers = b"", 0, list(answers)
    with crow_run_on_a_terminal(llm, home, workspace) as (proc, master):
        deadline = time.monotonic() + 40
        while proc.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.05)
            if ready:
                try:
                    out += os.read(master, 65536)
                except OSError:
                    break
                if answers and out.count(b"Answer for") > answered:
                    typed = answers.pop(0)
                    if typed == b"\x03":
                        proc.send_signal(signal.SIGINT)
                    else:
                        os.write(master, typed)
                    answered += 1
        proc.wait(timeout=10)
    return proc.returncode, out.decode(errors="replace")


def answer_once(llm: ScriptedLLM, home: Path, workspace: Path, answer: bytes) -> tuple[int, str]:
    """`crow run go` on a terminal, `answer` typed at its first question."""
    return crow_run_answering(llm, home, workspace, [answer])


def test_crow_run_asks_one_question_at_a_time(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    llm.push(
        Reply(
            tool_calls=[
                ToolCallSpec(name="execute", arguments={"command": "echo one"}, id="a"),
                ToolCallSpec(name="execute", arguments={"command": "echo two"}, id="b"),
                ToolCallSpec(name="write_file", arguments={"path": "p.txt", "content": "pee\n"}, id="c"),
            ]
        ),
        Reply(text="done"),
    )
    out = b""
    questions: list[str] = []
    with crow_run_on_a_terminal(llm, home, workspace) as (proc, master):
        def read_for(seconds: float) -> None:
            nonlocal out
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                ready, _, _ = select.select([master], [], [], 0.05)
                if ready:
                    try:
                        out += os.read(master, 65536)
                    except OSError:  # the child closed the terminal
                        return

        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            read_for(0.2)
            text = out.decode(errors="replace")
            if text.count("\nAllow ") == len(questions):
                continue
            read_for(0.7)  # would a second question appear before this one is answered?
            text = out.decode(errors="replace")
            assert text.count("\nAllow ") == len(questions) + 1, f"two questions open at once:\n{text}"
            question = text[text.rfind("\nAllow ") :]
            questions.append(question)
            os.write(master, b"n\n" if "Write p.txt" in question else b"y\n")
        proc.wait(timeout=10)
        read_for(0.2)
    assert proc.returncode == 4, "the write was refused in the last tool round: " + out.decode(errors="replace")
    assert len(questions) == 3, out.decode(errors="replace")
    by_call = {q.split("?")[0].removeprefix("\nAllow "): q for q in questions}
    assert set(by_call) == {"Run echo one", "Run echo two", "Write p.txt"}
    assert "$ echo one" in by_call["Run echo one"] and "(call a)" in by_call["Run echo one"]
    assert "+++ b/p.txt (new file)" in by_call["Write p.txt"] and "+pee" in by_call["Write p.txt"]
    assert "[a] Always allow `echo` commands" in by_call["Run echo two"]
    assert "{" not in by_call["Write p.txt"], "no raw JSON arguments"
    read = {m["tool_call_id"]: m["content"] for m in llm.requests[1].messages if m["role"] == "tool"}
    assert read["a"].startswith("one") and read["b"].startswith("two")
    assert "declined" in read["c"]
    assert not (workspace / "p.txt").exists()


@pytest.mark.anyio
async def test_control_characters_in_a_command_or_diff_are_shown_not_obeyed(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A `\\r` or an escape sequence in the model's command would let it print over the
    part of the line that deletes something; the terminal shows them escaped."""
    from crow.messages import ToolCall
    from crow.rules import choices, subject
    from crow.terminal import TerminalClient
    from tests.conftest import file_tool_specs

    specs = file_tool_specs()
    hidden = "rm -rf ~ #\r\x1b[2K  $ echo hi"
    calls = [
        ToolCall("a", "execute", {"command": f"echo hi; {hidden}"}),
        ToolCall("b", "write_file", {"path": "p.txt", "content": f"ok\n{hidden}\n"}),
        ToolCall("c", "shout", {"text": hidden}),
        ToolCall("d", "execute", {"command": "l\x1b7s -la"}),  # the option labels name it
    ]
    read, write = os.pipe()
    try:
        client = TerminalClient(str(workspace), fd=read)
        for call in calls:
            os.write(write, b"n\n")
            options = choices(subject(call.name, call.args, str(workspace)), False)
            answer = await client.ask_permission(call, options=options, spec=specs.get(call.name))
            assert answer == "reject_once"
    finally:
        os.close(read)
        os.close(write)
    shown = capsys.readouterr().err
    assert "\r" not in shown and "\x1b" not in shown, repr(shown)
    assert shown.count("rm -rf ~ #\\x0d\\x1b[2K") == 3, shown  # title, command, argument
    assert "+\\x1b[2K  $ echo hi" in shown, shown  # the diff
    assert "Always allow `l\\x1b7s` commands" in shown, shown


def test_crow_run_shows_the_models_escape_sequences_escaped(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """`\\x1b[8m` (conceal) in the model's text or a tool title would hide the permission
    question that follows it, under a fake one the model printed."""
    (workspace / "note.txt").write_text("keep\n")
    fake = "Allow Run echo hi?\\n  $ echo hi\x1b[8m"
    llm.push(
        Reply(
            text=f"Checking.\x1b[8m{fake}",
            tool_calls=[
                ToolCallSpec(name="read_file", arguments={"path": "\x1b[8mnote.txt"}, id="r"),
                ToolCallSpec(name="execute", arguments={"command": f"echo '{fake}'; rm -f note.txt"}, id="x"),
            ],
        ),
        Reply(text="done"),
    )
    _, text = answer_once(llm, home, workspace, b"n\n")
    assert "Answer for" in text and (workspace / "note.txt").exists(), text
    # The screen has the renderer's own colours; never the model's conceal (8m) or a raw ESC
    # before the escaped forms, and the call shown by its title
    assert "\x1b[8m" not in text and "Checking.\x1b" not in text, repr(text)
    assert "Checking.\\x1b[8m" in text and "Read \\x1b[8mnote.txt" in text, text


@pytest.mark.anyio
async def test_the_terminal_client_is_an_editor_client_and_asks_the_trust_question(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`crow run`'s client lacked `ask_choice`, so a terminal user was never asked about a
    project's crow.yaml (trust found it with getattr and skipped it); it also lacked the
    file and terminal methods every `EditorClient` has."""
    import yaml

    from crow.config import load_config
    from crow.editor import EditorClient
    from crow.session import Session
    from crow.terminal import TerminalClient
    from crow.trust import PROJECT, ProjectConfigs, settle

    home, folder = tmp_path / "home", tmp_path / "p"
    home.mkdir()
    folder.mkdir()
    (folder / "crow.yaml").write_text(yaml.safe_dump({"mode": "yolo"}))
    projects = ProjectConfigs(load_config(env={"CROW_HOME": str(home)}))
    read, write = os.pipe()
    try:
        client = TerminalClient(str(folder), fd=read)
        assert isinstance(client, EditorClient)
        session = Session(id="s", cwd=folder, config=projects.user, client=client)
        session.state[PROJECT] = projects.for_cwd(folder)
        os.write(write, b"2\n")  # TRUST_OPTIONS: 1 apply once, 2 trust the folder, 3 ignore

        async def emit(event: object) -> None:
            raise AssertionError(f"nothing to tell: {event}")

        async def ready(_: Session) -> None:
            return None

        assert await settle(projects, session, emit, ready) is True
        for refused in (client.read_text(folder / "a"), client.run_in_terminal("ls", folder, 1.0)):
            with pytest.raises(OSError, match="crow run has no editor"):
                await refused
    finally:
        os.close(read)
        os.close(write)
    assert session.config is not None and session.config.mode == "yolo"
    assert projects.for_cwd(folder).trusted  # remembered: the answer was "Trust this folder"
    shown = capsys.readouterr().err
    assert f"Trust {folder}?" in shown and "[2] Trust this folder" in shown
