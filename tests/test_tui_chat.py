"""`crow chat` (and bare `crow` on a terminal) driven through a real terminal (tmux)."""

from __future__ import annotations

import os
import select
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from crow.tui.chat import hangup
from crow.tui.prompt_input import EXIT_HINT
from tests.conftest import CROW, crow_env
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec
from tests.support.tmux import Terminal


@pytest.fixture
def terminal_for(tmp_path: Path) -> Iterator[object]:
    opened: list[Terminal] = []

    def open_(
        llm: ScriptedLLM | None, home: Path, workspace: Path, *args: str, width: int = 120, **env: str
    ) -> Terminal:
        socket = tmp_path / f"tmux{len(opened)}.sock"
        term = Terminal(
            [*CROW, *args], env=crow_env(llm, home, **env), cwd=workspace, socket=socket, width=width
        )
        opened.append(term)
        return term

    yield open_
    for term in opened:
        term.close()


def at_prompt(screen: str) -> bool:
    """The input prompt is up and empty (its last line, or above the Ctrl-C hint)."""
    return screen.replace(EXIT_HINT, "").rstrip().endswith("›")


def recall(term: Terminal, prompt: str) -> None:
    """↑ until `prompt` is back at the prompt. The history file is read in a thread while
    the prompt is already up (off the start-up path): on a loaded machine an ↑ pressed
    before it was read finds nothing, and a person presses it again."""
    end = time.monotonic() + 15
    while True:
        term.send("Up")
        try:
            term.wait_for(lambda s: s.rstrip().endswith(f"› {prompt}"), timeout=1)
            return
        except AssertionError:
            if time.monotonic() > end:
                raise


def test_bare_crow_on_a_terminal_chats_and_ctrl_d_exits_cleanly(
    terminal_for, llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Reply(text="Hello from the scripted model."))
    term = terminal_for(llm, home, workspace)
    banner = term.wait_for("/help for commands, Ctrl-D to exit")
    assert "openai:scripted" in banner and "mode ask" in banner
    term.wait_for(at_prompt)
    term.type("say hello")
    term.wait_for("Hello from the scripted model.")
    term.wait_for(at_prompt)
    term.send("C-d")
    assert term.wait_exit() == 0
    assert "Traceback" not in term.screen()


def test_ctrl_c_cancels_a_slow_answer_and_the_next_prompt_works(
    terminal_for, llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Reply(text="slowly " * 400, chunk_size=7, chunk_delay=0.05), Reply(text="The second answer."))
    term = terminal_for(llm, home, workspace, "chat")
    term.wait_for(at_prompt)
    term.type("tell me slowly")
    term.wait_for("slowly slowly slowly")
    term.send("zzz")  # typed during the turn: neither echoed nor kept for the next prompt
    term.send("C-c")
    term.wait_for(at_prompt, timeout=20)
    # one more Ctrl-C would exit. prompt_toolkit draws its bottom toolbar once the terminal
    # answered where the cursor is, a frame after the prompt on a loaded machine
    term.wait_for(EXIT_HINT)
    assert "zzz" not in term.screen()
    assert term.screen().count("slowly") < 400  # it stopped
    term.type("and now?")
    term.wait_for("The second answer.")
    second = llm.requests[1].messages
    users = [m["content"] for m in second if m["role"] == "user"]
    assert users[0] == "tell me slowly" and users[-1] == "and now?"
    assert [m["role"] for m in second[1:]] == ["user", "assistant", "user"]  # after the system prompt
    term.wait_for(at_prompt)
    term.send("C-d")
    status = term.wait_exit()
    assert status == 0, term.screen()


def test_ctrl_c_twice_during_a_turn_exits(
    terminal_for, llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Reply(text="slowly " * 400, chunk_size=7, chunk_delay=0.05))
    term = terminal_for(llm, home, workspace, "chat")
    term.wait_for(at_prompt)
    term.type("tell me slowly")
    term.wait_for("slowly slowly slowly")
    term.send("C-c", "C-c")
    assert term.wait_exit(timeout=20) == 0
    assert "Traceback" not in term.screen()


def test_undo_and_usage(terminal_for, llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    llm.push(Reply(text="First answer.", usage=(1200, 34)), Reply(text="Third answer."))
    term = terminal_for(llm, home, workspace, "chat")
    term.wait_for(at_prompt)
    term.type("first prompt")
    term.wait_for("First answer.")
    term.wait_for(at_prompt)
    term.type("/usage")
    term.wait_for("1,200 in, 34 out")
    term.wait_for(at_prompt)
    term.type("/undo")
    term.wait_for("the conversation is back to before it")
    term.wait_for(at_prompt)
    term.type("third prompt")
    term.wait_for("Third answer.")
    assert [m["content"] for m in llm.requests[-1].messages if m["role"] == "user"] == ["third prompt"]
    assert len(llm.requests) == 2  # /usage and /undo asked the model nothing


def test_up_recalls_a_prompt_of_an_earlier_run_from_a_private_file(
    terminal_for, llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Reply(text="Noted."))
    first = terminal_for(llm, home, workspace, "chat")
    first.wait_for(at_prompt)
    first.type("remember this prompt")
    first.wait_for("Noted.")
    first.wait_for(at_prompt)
    first.send("C-d")
    assert first.wait_exit() == 0
    history = home / "prompt_history"
    assert stat.S_IMODE(os.stat(history).st_mode) == 0o600
    second = terminal_for(llm, home, workspace, "chat")
    second.wait_for(at_prompt)
    recall(second, "remember this prompt")


def test_a_loose_history_file_is_made_private(
    terminal_for, llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    history = home / "prompt_history"
    history.parent.mkdir(parents=True, exist_ok=True)
    history.write_text("\n# old\n+an old prompt\n")
    history.chmod(0o644)
    term = terminal_for(llm, home, workspace, "chat")
    term.wait_for(at_prompt)
    recall(term, "an old prompt")
    assert stat.S_IMODE(os.stat(history).st_mode) == 0o600


def test_tab_completes_a_slash_command(terminal_for, llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    term = terminal_for(llm, home, workspace, "chat")
    term.wait_for(at_prompt)
    term.send("/us")
    term.wait_for("Tokens, cost and context left")  # offered as it is typed, with its description
    term.send("Tab")
    term.wait_for(lambda s: "› /usage" in s)
    term.send("Enter")
    term.wait_for("Tokens since crow opened this session: no model call yet")
    assert llm.requests == []


def test_a_prompt_file_is_offered_once_the_catalog_is_gathered(
    terminal_for, llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    commands = workspace / ".crow" / "commands"
    commands.mkdir(parents=True)
    (commands / "review.md").write_text("---\ndescription: Review the staged change\n---\nReview it.\n")
    term = terminal_for(llm, home, workspace, "chat")
    term.wait_for(at_prompt)
    term.send("/rev")
    term.wait_for("Review the staged change")


def test_a_tiny_terminal_still_completes_and_chats(
    terminal_for, llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Reply(text="Short."))
    term = terminal_for(llm, home, workspace, "chat", width=20)
    term.wait_for(at_prompt)
    term.send("/us")
    # Tab once the menu is up: a Tab pressed while prompt_toolkit still gathers the
    # completions of what was typed is dropped (it runs one gathering at a time), as
    # happened on a loaded machine
    term.wait_for("/usage  Tokens")
    term.send("Tab")
    term.wait_for(lambda s: "› /usage" in s)
    term.send("Enter")
    term.wait_for(lambda s: "no model call yet" in " ".join(s.split()))  # wrapped at 20 columns
    term.wait_for(at_prompt)
    term.type("a prompt much longer than the twenty columns of this terminal")
    term.wait_for("Short.")
    assert llm.requests[0].last_user_text == "a prompt much longer than the twenty columns of this terminal"
    term.wait_for(at_prompt)
    term.send("C-d")
    assert term.wait_exit() == 0


def test_multi_line_input_reaches_the_model_as_one_prompt(
    terminal_for, llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Reply(text="Got three lines."), Reply(text="Got two lines."))
    term = terminal_for(llm, home, workspace, "chat")
    term.wait_for(at_prompt)
    term.send("line one", "M-Enter", "line two", "C-j", "line three", "Enter")
    term.wait_for("Got three lines.")
    assert llm.requests[0].last_user_text == "line one\nline two\nline three"
    term.wait_for(at_prompt)
    term.send("first half \\", "Enter", "second half", "Enter")  # a trailing backslash continues
    term.wait_for("Got two lines.")
    assert llm.requests[1].last_user_text == "first half \nsecond half"


def test_help_lists_the_commands_and_asks_the_model_nothing(
    terminal_for, llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    term = terminal_for(llm, home, workspace, "chat")
    term.wait_for(at_prompt)
    term.type("/help")
    screen = term.wait_for("Ctrl-D exits.")  # help's last line: the whole list is on screen
    for name in ("/exit", "/expand", "/clear", "/compact", "/undo", "/usage", "/mcp", "/init"):
        assert name in screen, name
    term.wait_for(at_prompt)
    term.type("/quit")
    assert term.wait_exit() == 0
    assert llm.requests == []


def test_ctrl_c_clears_the_line_then_twice_at_an_empty_prompt_exits(
    terminal_for, llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    term = terminal_for(llm, home, workspace, "chat")
    term.wait_for(at_prompt)
    term.send("some words")
    term.wait_for("› some words")
    term.send("C-c")
    term.wait_for(lambda s: "some words" not in s)
    term.send("C-c")
    term.wait_for(EXIT_HINT)
    assert term.exit_status() is None
    term.send("C-c")
    assert term.wait_exit() == 0
    assert "Traceback" not in term.screen()


def test_clear_starts_a_new_session(terminal_for, llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    llm.push(Reply(text="One."), Reply(text="Two."))
    term = terminal_for(llm, home, workspace, "chat")
    term.wait_for(at_prompt)
    term.type("before clearing")
    term.wait_for("One.")
    term.wait_for(at_prompt)
    term.type("/clear")
    term.wait_for("New session")
    term.wait_for(at_prompt)
    term.type("after clearing")
    term.wait_for("Two.")
    assert [m["content"] for m in llm.requests[-1].messages if m["role"] == "user"] == ["after clearing"]


def test_a_broken_plugin_is_an_error_and_the_chat_goes_on(
    terminal_for, llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text("tools: ['no_such_module_here:tool']\n")
    term = terminal_for(llm, home, workspace, "chat")
    term.wait_for(at_prompt)
    term.type("hello")
    term.wait_for("no_such_module_here")
    term.wait_for(at_prompt)
    term.type("/help")
    term.wait_for("Commands of the session:")
    term.wait_for(at_prompt)
    term.send("C-d")
    assert term.wait_exit() == 0
    assert "Traceback" not in term.screen()


def _cpu_and_switches(pid: int) -> tuple[float, int]:
    """CPU seconds and wake-ups (voluntary context switches: each time a thread that ran
    goes back to waiting) of all of `pid`'s threads. Not the involuntary ones: those count
    the times a running thread was preempted, which another busy process (a second test
    worker) adds to without a single wake-up more."""
    cpu, switches = 0.0, 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            cpu += int((task / "schedstat").read_text().split()[0]) / 1e9
            status = (task / "status").read_text().splitlines()
        except OSError:  # a thread that ended
            continue
        switches += sum(
            int(line.split()[1]) for line in status if line.startswith("voluntary_ctxt_switches:")
        )
    return cpu, switches


@pytest.mark.skipif(not Path("/proc/self/schedstat").exists(), reason="Linux /proc needed")
def test_a_chat_waiting_for_input_never_wakes_up(
    terminal_for, llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    term = terminal_for(llm, home, workspace, "chat")
    term.wait_for(at_prompt)
    pid = term.pid()
    before, _ = _cpu_and_switches(pid)
    for _ in range(60):  # the warm-up ends: a second without CPU
        time.sleep(1.0)
        now, _ = _cpu_and_switches(pid)
        if now - before < 0.005:
            break
        before = now
    _, woke = _cpu_and_switches(pid)
    time.sleep(3.0)  # measuring a quiet stretch: nothing to wait for
    assert _cpu_and_switches(pid)[1] - woke <= 2  # prompt_toolkit's size polling: 6 in 3 s


def test_a_closed_terminal_ends_the_chat_without_a_traceback(
    tmp_path: Path, llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Reply(text="slowly " * 400, chunk_size=7, chunk_delay=0.05))
    errors = tmp_path / "stderr.txt"
    cmd = ["sh", "-c", f'exec "$@" 2>{errors}', "sh", *CROW, "chat"]
    term = Terminal(cmd, env=crow_env(llm, home), cwd=workspace, socket=tmp_path / "tmux.sock")
    try:
        term.wait_for(at_prompt)
        pid = term.pid()
        term.type("tell me slowly")
        term.wait_for("slowly slowly slowly")
    finally:
        term.close()  # the terminal goes away mid-turn: SIGHUP
    deadline = time.monotonic() + 20
    while _alive(pid):
        assert time.monotonic() < deadline, "crow still runs after its terminal closed"
        time.sleep(0.05)
    assert "Traceback" not in errors.read_text()


@pytest.mark.parametrize("mid_turn", [False, True], ids=["at-the-prompt", "mid-turn"])
def test_a_terminal_that_fails_before_its_hangup_is_told_ends_the_chat_quietly(
    tmp_path: Path, llm: ScriptedLLM, home: Path, workspace: Path, mid_turn: bool
) -> None:
    """The shell ignores SIGHUP for crow (`trap "" HUP`): only the terminal's EIO says it is
    gone, as when a write fails before the SIGHUP is handled."""
    llm.push(Reply(text="slowly " * 400, chunk_size=7, chunk_delay=0.05))
    errors, status = tmp_path / "stderr.txt", tmp_path / "status.txt"
    script = f'trap "" HUP; "$@" 2>{errors}; echo $? >{status}'
    term = Terminal(["sh", "-c", script, "sh", *CROW, "chat"], env=crow_env(llm, home), cwd=workspace,
                    socket=tmp_path / "tmux.sock")  # fmt: skip
    try:
        term.wait_for(at_prompt)
        if mid_turn:
            term.type("tell me slowly")
            term.wait_for("slowly slowly slowly")
    finally:
        term.close()
    deadline = time.monotonic() + 20
    while not status.exists() or not status.read_text().strip():
        assert time.monotonic() < deadline, "crow still runs after its terminal closed"
        time.sleep(0.05)
    assert "Traceback" not in errors.read_text()
    assert status.read_text().strip() == "129"
    if mid_turn:  # the turn was stored as one the user cancelled, not as a failure
        env = crow_env(None, home)
        listed = subprocess.run(
            [*CROW, "sessions", "list"], env=env, capture_output=True, text=True, timeout=60
        )
        session_id = listed.stdout.split()[0]
        shown = subprocess.run([*CROW, "sessions", "show", session_id], env=env, capture_output=True, text=True,
                               timeout=60).stdout  # fmt: skip
        assert "tell me slowly" in shown and "[interrupted by the user]" in shown


@pytest.mark.anyio
async def test_the_hangup_watch_wakes_on_a_hangup_not_on_keys() -> None:
    """What notices a terminal closed mid-turn, as its window, tmux or ssh goes: the keys
    typed meanwhile leave it asleep (and unread, for a question's picker)."""
    master, slave = os.openpty()
    try:
        os.write(master, b"typed during the turn\n")
        with anyio.move_on_after(0.3) as waited:
            await hangup(slave)
        assert waited.cancelled_caught
        assert os.read(slave, 100) == b"typed during the turn\n"
        os.close(master)
        master = -1
        with anyio.fail_after(10):
            await hangup(slave)
    finally:
        for fd in (master, slave):
            if fd >= 0:
                os.close(fd)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_chat_without_a_terminal_points_to_crow_run(home: Path, workspace: Path) -> None:
    done = subprocess.run([*CROW, "chat"], input="hello\n", capture_output=True, text=True, timeout=60,
                          cwd=workspace, env=crow_env(None, home))  # fmt: skip
    assert done.returncode == 2
    assert "crow chat needs a terminal" in done.stderr and "crow run" in done.stderr
    assert "Traceback" not in done.stderr


def test_no_model_is_said_and_the_chat_goes_on(terminal_for, home: Path, workspace: Path) -> None:
    term = terminal_for(None, home, workspace, "chat")
    term.wait_for("no model set")
    term.wait_for(at_prompt)
    term.type("hello")
    term.wait_for("CROW_MODEL=")  # the notice says how to choose one
    term.wait_for(at_prompt)
    term.send("C-o")
    term.wait_for("Nothing to expand.")
    term.send("C-d")
    assert term.wait_exit() == 0


def test_a_history_file_that_cannot_be_used_costs_only_the_history(
    terminal_for, llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (home / "prompt_history").mkdir(parents=True)  # neither readable nor writable as a file
    llm.push(Reply(text="Still answered."))
    term = terminal_for(llm, home, workspace, "chat")
    term.wait_for(at_prompt)
    term.type("hello")
    term.wait_for("Still answered.")
    term.wait_for(at_prompt)
    term.send("C-d")
    assert term.wait_exit() == 0
    screen = term.screen()
    assert "Traceback" not in screen and "cannot keep the prompt" in screen


def test_a_plan_item_with_a_newline_cannot_draw_an_item_of_its_own(
    terminal_for, llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """A plan item is one line of the checklist: its newline shows as `\\x0a`, so the model
    cannot show a step as done (`☑`) that its plan does not hold."""
    todos = [{"content": "Read the code\n☑ Run the tests", "status": "pending"}]
    plan = ToolCallSpec(name="write_todos", arguments={"todos": todos}, id="p")
    llm.push(Reply(tool_calls=[plan]), Reply(text="Planned."))
    term = terminal_for(llm, home, workspace, "chat", "--yolo")
    term.wait_for(at_prompt)
    term.type("plan it")
    screen = term.wait_for("Planned.")
    assert "☐ Read the code\\x0a☑ Run the tests" in screen, screen
    assert "\n☑" not in screen


def _started_and_interrupted(home: Path, workspace: Path, delay: float) -> tuple[str, int]:
    """`crow chat` on a pty, sent SIGINT (a Ctrl-C) once it has run for `delay` seconds of
    CPU, or once at its prompt: what it printed, and its exit status (two more Ctrl-C end a
    chat that got to its prompt). CPU, not wall-clock, time: on a machine busy with other
    tests, a wall-clock moment falls earlier in crow's start-up, even before its code runs."""
    master, slave = os.openpty()
    proc = subprocess.Popen([*CROW, "chat"], stdin=slave, stdout=slave, stderr=slave, cwd=workspace,
                            env={**crow_env(None, home), "TERM": "dumb"}, start_new_session=True)  # fmt: skip
    os.close(slave)
    out = b""
    try:
        deadline = time.monotonic() + 30
        while proc.poll() is None and b"\xe2\x80\xba" not in out and _cpu_and_switches(proc.pid)[0] < delay:
            assert time.monotonic() < deadline, out.decode(errors="replace")
            if select.select([master], [], [], 0.001)[0]:
                out += os.read(master, 65536)
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 30
        while proc.poll() is None or select.select([master], [], [], 0)[0]:
            assert time.monotonic() < deadline, out.decode(errors="replace")
            if select.select([master], [], [], 0.5)[0]:
                try:
                    out += os.read(master, 65536)
                except OSError:  # EIO: the chat ended, its side of the pty is closed
                    break
            elif b"\xe2\x80\xba" in out and proc.poll() is None:  # at its prompt: "›"
                os.write(master, b"\x03\x03")
        return out.decode(errors="replace"), proc.wait(timeout=30)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()


def test_ctrl_c_while_crow_starts_never_shows_a_traceback(home: Path, workspace: Path) -> None:
    """Ctrl-C pressed while crow is still starting (importing) leaves quietly, with the
    status of an interrupted program; pressed later it is the chat's, as ever."""
    for delay in (0.03, 0.05, 0.07, 0.1, 0.12, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5):
        shown, status = _started_and_interrupted(home, workspace, delay)
        for sign in ("Traceback", "KeyboardInterrupt", "Exception ignored", "panicked"):
            assert sign not in shown, (delay, shown)
        assert status in (0, 130), (delay, status, shown)
