"""`crow run` for scripts: real `crow` subprocesses against the scripted model server.

Session ids on stderr, --continue / --resume PREFIX, the prompt from stdin, the three
output formats, message boundaries when piped, and every exit status (crow run --help)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import crow_env
from tests.llm_server import Fault, Reply, ScriptedLLM, ToolCallSpec

SESSION_LINE = re.compile(r"^session ([0-9a-f]{8,})… · crow run --resume \1 to continue$", re.M)


def run(
    *args: str, env: dict[str, str], cwd: Path, stdin: bytes | None = None, config: Path | None = None
) -> subprocess.CompletedProcess[str]:
    before = ["--config", str(config)] if config else []
    return subprocess.run(
        [sys.executable, "-m", "crow", *before, "run", *args],
        env=env,
        cwd=cwd,
        input=stdin.decode("utf-8", "surrogateescape") if stdin is not None else None,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="surrogateescape",
        timeout=60,
    )


def run_bytes(*args: str, env: dict[str, str], cwd: Path, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "crow", "run", *args],
        env=env,
        cwd=cwd,
        input=stdin,
        capture_output=True,
        timeout=60,
    )


def user_texts(llm: ScriptedLLM, index: int = -1) -> list[str]:
    return [m["content"] for m in llm.requests[index].messages if m["role"] == "user"]


def session_id(done: subprocess.CompletedProcess[str]) -> str:
    found = SESSION_LINE.search(done.stderr)
    assert found, done.stderr
    return found[1]


@pytest.fixture(autouse=True)
def private_home(home: Path) -> None:
    home.chmod(0o700)  # else the first run warns that it made it private, on stderr


def make_sessions(home: Path, cwd: Path, ids: list[str], **fields: Any) -> None:
    """Sessions with chosen ids (and fields) in the store `crow` reads."""
    from crow.store import SQLiteStore

    async def go() -> None:
        async with SQLiteStore(home / "crow.db", home=home) as store:
            for sid in ids:
                await store.create_session(id=sid, cwd=str(cwd), **fields)

    anyio.run(go)


# ------------------------------------------------------------ sessions: id, --continue, --resume


def test_the_session_id_is_printed_and_continue_sees_the_first_prompt(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    env = crow_env(llm, home)
    llm.push(Reply(text="Noted: 42."), Reply(text="It was 42."))
    first = run("remember the number 42", env=env, cwd=workspace)
    assert first.returncode == 0 and first.stdout == "Noted: 42.\n", first.stderr
    short = session_id(first)
    assert len(short) == 8 and first.stderr.startswith("session "), "the id comes first"
    again = run("--continue", "which number?", env=env, cwd=workspace)
    assert again.returncode == 0 and again.stdout == "It was 42.\n", again.stderr
    assert session_id(again) == short, "the same session goes on"
    assert user_texts(llm) == ["remember the number 42", "which number?"]
    assistant = [m["content"] for m in llm.requests[-1].messages if m["role"] == "assistant"]
    assert assistant == ["Noted: 42."]


def test_continue_takes_the_most_recently_updated_session_of_this_folder(
    llm: ScriptedLLM, home: Path, workspace: Path, tmp_path: Path
) -> None:
    env = crow_env(llm, home)
    other = tmp_path / "other"
    other.mkdir()
    for text in ("in ws, older", "in ws, newer"):
        assert run(text, env=env, cwd=workspace).returncode == 0
    assert run("elsewhere", env=env, cwd=other).returncode == 0  # newest, but not here
    assert run("--continue", "go on", env=env, cwd=workspace).returncode == 0
    assert user_texts(llm) == ["in ws, newer", "go on"]


def test_continue_with_no_session_here_is_exit_2(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    done = run("--continue", "hi", env=crow_env(llm, home), cwd=workspace)
    assert done.returncode == 2 and done.stdout == "" and llm.requests == []
    assert done.stderr == f"crow: no session to continue in {workspace}: start one without --continue\n"


def test_resume_by_a_unique_prefix(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    env = crow_env(llm, home)
    make_sessions(home, workspace, ["abcdef0123", "abcdef4567"])
    llm.push(Reply(text="one"), Reply(text="two"))
    first = run("hello", env=env, cwd=workspace)
    sid = session_id(first)
    assert run("--resume", sid, "again", env=env, cwd=workspace).returncode == 0
    assert user_texts(llm) == ["hello", "again"]
    done = run("--resume", "abcdef4", "in the made one", env=env, cwd=workspace)
    assert done.returncode == 0, done.stderr
    assert session_id(done) == "abcdef45", "the shortest unique prefix, 8 characters at least"
    assert user_texts(llm) == ["in the made one"]


def test_an_ambiguous_prefix_lists_the_candidates(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    env = crow_env(llm, home)
    make_sessions(home, workspace, ["abcdef0123", "abcdef4567"], title="a title")
    done = run("--resume", "abcdef", "hi", env=env, cwd=workspace)
    assert done.returncode == 2 and llm.requests == [] and done.stdout == ""
    assert done.stderr == (
        "crow: session id 'abcdef' is ambiguous; it starts:\n"
        "  abcdef0123  a title\n  abcdef4567  a title\ntype more of the id\n"
    )


def test_a_one_character_prefix_matching_many_lists_ten(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    make_sessions(home, workspace, [f"a{n:02d}" + "0" * 29 for n in range(12)])
    done = run("--resume", "a", "hi", env=crow_env(llm, home), cwd=workspace)
    assert done.returncode == 2 and llm.requests == []
    listed = [line for line in done.stderr.splitlines() if line.startswith("  a")]
    assert len(listed) == 10 and "  … and more" in done.stderr.splitlines()


def test_an_unknown_or_deleted_session_is_exit_2(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    env = crow_env(llm, home)
    first = run("hello", env=env, cwd=workspace)
    sid = session_id(first)
    deleted = subprocess.run(
        [sys.executable, "-m", "crow", "sessions", "delete", sid], env=env, capture_output=True, text=True
    )
    assert deleted.returncode == 0, deleted.stderr
    for name in (sid, "ffff0000", ""):
        done = run("--resume", name, "hi", env=env, cwd=workspace)
        assert done.returncode == 2 and done.stderr == f"crow: unknown session {name!r}\n"
    assert len(llm.requests) == 1


def test_a_session_of_another_folder_keeps_its_folder(
    llm: ScriptedLLM, home: Path, workspace: Path, tmp_path: Path
) -> None:
    """Allowed: the user named it. Its tools work in its own folder, not the current one."""
    env = crow_env(llm, home)
    (workspace / "a.txt").write_text("from the session's folder\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "a.txt").write_text("from the current folder\n")
    sid = session_id(run("hello", env=env, cwd=workspace))
    llm.push(Reply(tool_calls=[ToolCallSpec("read_file", {"path": "a.txt"})]), Reply(text="read"))
    done = run("--resume", sid, "read a.txt", env=env, cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    [result] = [m["content"] for m in llm.requests[-1].messages if m["role"] == "tool"]
    assert "from the session's folder" in result


# ------------------------------------------------------------ the prompt from stdin


def test_dash_reads_the_whole_prompt_from_stdin(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    prompt = "first line\nsecond line, ünïcode ✓\n"
    done = run("-", env=crow_env(llm, home), cwd=workspace, stdin=prompt.encode())
    assert done.returncode == 0, done.stderr
    assert user_texts(llm) == [prompt]


@pytest.mark.parametrize(
    ("given", "says"),
    [
        (b"", "crow: crow run: the prompt is empty (stdin had nothing)\n"),
        (b" \n\t\n", "crow: crow run: the prompt is empty (stdin had nothing)\n"),
        (b"caf\xe9 au lait", "crow: crow run -: the prompt on stdin is not UTF-8 (byte 3)\n"),
    ],
)
def test_an_empty_or_undecodable_stdin_is_exit_2(
    llm: ScriptedLLM, home: Path, workspace: Path, given: bytes, says: str
) -> None:
    done = run_bytes("-", env=crow_env(llm, home), cwd=workspace, stdin=given)
    assert (done.returncode, done.stderr.decode(), done.stdout) == (2, says, b"")
    assert llm.requests == []


def test_dash_with_stdin_closed_is_exit_2(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    done = subprocess.run(
        ["sh", "-c", 'exec "$0" -m crow run - <&-', sys.executable],
        env=crow_env(llm, home),
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and llm.requests == []
    assert done.stderr == "crow: crow run -: stdin is closed; give the prompt as words instead\n"


# ------------------------------------------------------------ output formats


PRICED = "model_settings:\n  openai:scripted:\n    pricing: {input: 2, output: 10}\n"


def test_json_is_one_object_with_the_answer_usage_and_cost(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    config = home / "priced.yaml"
    config.write_text(PRICED)
    (workspace / "a.txt").write_text("hello\n")
    llm.push(
        Reply(
            text="Let me look.", tool_calls=[ToolCallSpec("read_file", {"path": "a.txt"})], usage=(1000, 100)
        ),
        Reply(text="It says hello.", usage=(2000, 50)),
    )
    done = run("what is in a.txt?", "--output", "json", env=crow_env(llm, home), cwd=workspace, config=config)
    assert done.returncode == 0, done.stderr
    obj = json.loads(done.stdout)
    assert done.stdout.count("\n") == 1, "one object, one line"
    assert obj == {
        "session_id": obj["session_id"],
        "stop_reason": "end_turn",
        "answer": "It says hello.",
        "usage": {
            "input_tokens": 3000,
            "output_tokens": 150,
            "cache_read_tokens": 0,
            "cache_write_tokens": 0,
        },
        "cost": pytest.approx((3000 * 2 + 150 * 10) / 1e6),
    }
    assert len(obj["session_id"]) == 32 and obj["session_id"].startswith(session_id(done))
    assert "→ Read a.txt" in done.stderr, "activity stays on stderr"


def test_json_of_a_failed_turn_says_why(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    llm.push(Fault(status=400, message="the request was bad"))
    done = run("hi", "--output", "json", env=crow_env(llm, home), cwd=workspace)
    assert done.returncode == 1, done.stderr
    obj = json.loads(done.stdout)
    assert obj["stop_reason"] == "end_turn" and "the request was bad" in obj["error"] and obj["cause"]
    assert obj["cost"] == 0 and obj["answer"] == "", "no call was charged"


def test_stream_json_is_one_object_per_line_ending_with_the_result(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (workspace / "a.txt").write_text("hello\n")
    script = (
        Reply(text="Looking.", reasoning="hmm", tool_calls=[ToolCallSpec("read_file", {"path": "a.txt"})]),
        Reply(text="It says \ud83d hello."),  # a lone surrogate from a hostile model
    )
    env = crow_env(llm, home)
    llm.push(*script)
    done = run("what is in a.txt?", "--output", "stream-json", env=env, cwd=workspace)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    types = [e["type"] for e in events]
    assert types[0] == "session" and types[-1] == "result"
    assert {"thought", "text", "tool_call", "tool_result", "usage", "title"} <= set(types)
    [call] = [e for e in events if e["type"] == "tool_call"]
    assert (call["name"], call["args"], call["kind"]) == ("read_file", {"path": "a.txt"}, "read")
    [result] = [e for e in events if e["type"] == "tool_result"]
    assert result["status"] == "completed" and "hello" in result["output"] and result["refused"] is False
    assert events[0]["session_id"] == events[-1]["session_id"]
    final = events[-1]
    llm.push(*script)
    as_json = json.loads(run("what is in a.txt?", "--output", "json", env=env, cwd=workspace).stdout)
    assert {**final, "type": None, "session_id": None} == {**as_json, "type": None, "session_id": None}
    assert final["answer"] == as_json["answer"] == "It says \ufffd hello."


def test_piped_text_keeps_message_boundaries(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    (workspace / "a.txt").write_text("hello\n")
    llm.push(
        Reply(text="First I look.", tool_calls=[ToolCallSpec("read_file", {"path": "a.txt"})]),
        Reply(text="Then I answer:\n", tool_calls=[ToolCallSpec("read_file", {"path": "a.txt"})]),
        Reply(text="hello."),
    )
    done = run("look", env=crow_env(llm, home), cwd=workspace)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "First I look.\n\nThen I answer:\n\nhello.\n"


def test_tool_output_on_stderr_is_one_line_cut_at_a_word() -> None:
    from crow.run_output import first_line

    long_line = " ".join(f"word{n:03d}" for n in range(40))  # 319 characters
    shown, more = first_line(long_line + "\nsecond\nthird").split("… (")
    assert long_line.startswith(shown) and long_line[len(shown)] == " " and 100 < len(shown) < 120
    assert more == "2 more lines)"
    assert first_line("x" * 300) == "x" * 119 + "…", "no space to cut at: cut at the width"
    assert first_line("short\nand one more") == "short (1 more line)"
    assert first_line("") == ""


def test_tool_activity_goes_to_stderr_in_one_line(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    (workspace / "a.txt").write_text("one\ntwo\nthree\n")
    llm.push(Reply(tool_calls=[ToolCallSpec("read_file", {"path": "a.txt"})]), Reply(text="done"))
    done = run("read", env=crow_env(llm, home), cwd=workspace)
    assert done.stdout == "done\n"
    assert "→ Read a.txt\n  ✓ [a.txt: lines 1-3 of 3] (3 more lines)\n" in done.stderr


# ------------------------------------------------------------ exit statuses


def test_a_turn_at_max_turn_requests_is_exit_3(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    config = home / "short.yaml"
    config.write_text("max_iterations: 1\n")
    (workspace / "a.txt").write_text("hello\n")
    llm.push(Reply(tool_calls=[ToolCallSpec("read_file", {"path": "a.txt"})]))
    done = run("read", "--output", "json", env=crow_env(llm, home), cwd=workspace, config=config)
    assert done.returncode == 3, done.stderr
    assert json.loads(done.stdout)["stop_reason"] == "max_turn_requests"


def test_a_turn_at_max_tokens_is_exit_3(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    llm.push(Reply(text="and then the", finish_reason="length"))
    done = run("tell me", env=crow_env(llm, home), cwd=workspace)
    assert done.returncode == 3 and done.stdout == "and then the\n", done.stderr


def test_a_refused_permission_that_ended_the_turn_is_exit_4(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    write = Reply(tool_calls=[ToolCallSpec("write_file", {"path": "b.txt", "content": "x"})])
    llm.push(write, Reply(text="I could not write it."))
    done = run("write b", "--output", "stream-json", env=crow_env(llm, home), cwd=workspace)
    assert done.returncode == 4, done.stderr
    [result] = [e for e in map(json.loads, done.stdout.splitlines()) if e["type"] == "tool_result"]
    assert result["refused"] is True and not (workspace / "b.txt").exists()


def test_a_refusal_the_model_got_past_is_exit_0(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    """Only the last tool round counts: the model went on and finished with a tool that ran."""
    (workspace / "a.txt").write_text("hello\n")
    llm.push(
        Reply(tool_calls=[ToolCallSpec("write_file", {"path": "b.txt", "content": "x"})]),
        Reply(tool_calls=[ToolCallSpec("read_file", {"path": "a.txt"})]),
        Reply(text="Read it instead."),
    )
    done = run("write b", env=crow_env(llm, home), cwd=workspace)
    assert done.returncode == 0 and done.stdout == "Read it instead.\n", done.stderr


def test_a_failed_tool_is_not_a_refusal(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    llm.push(Reply(tool_calls=[ToolCallSpec("read_file", {"path": "missing.txt"})]), Reply(text="no file"))
    done = run("read", env=crow_env(llm, home), cwd=workspace)
    assert done.returncode == 0 and "  ✗ " in done.stderr, done.stderr


def test_ctrl_c_cancels_the_turn_with_130_and_continue_works(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    env = crow_env(llm, home)
    llm.push(Reply(text="word " * 400, chunk_size=5, chunk_delay=0.02))
    proc = subprocess.Popen(
        [sys.executable, "-m", "crow", "run", "count slowly"],
        env=env,
        cwd=workspace,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdout.read(5) == b"word "  # streaming now
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err.decode()
    assert b"Traceback" not in err and err.decode().endswith("crow: cancelled\n")
    llm.push(Reply(text="going on"))
    again = run("--continue", "go on", env=env, cwd=workspace)
    assert again.returncode == 0 and again.stdout == "going on\n", again.stderr
    assert user_texts(llm)[0] == "count slowly" and user_texts(llm)[-1] == "go on"


@pytest.mark.parametrize("output", ["text", "stream-json"])
def test_a_reader_gone_mid_answer_cancels_the_turn_quietly(
    llm: ScriptedLLM, home: Path, workspace: Path, output: str
) -> None:
    """`crow run ... | head -c 10`: the BrokenPipeError came out of the model stream's
    generator as a page of tracebacks."""
    env = crow_env(llm, home)
    llm.push(Reply(text="word " * 20000, chunk_size=5))
    done = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m crow run --output {output} hi | head -c 10; echo "status ${{PIPESTATUS[0]}}" >&2'],
        env=env, cwd=workspace, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert len(done.stdout) == 10
    assert done.stderr.endswith("crow: stdout was closed: the turn was cancelled\nstatus 141\n"), done.stderr
    assert "Traceback" not in done.stderr
    llm.reset()  # stream-json: its first line filled the 10 bytes, the turn ended before the model call
    llm.push(Reply(text="again"))
    assert run("--continue", "go on", env=env, cwd=workspace).stdout == "again\n"
    assert user_texts(llm) == ["hi", "go on"]


def test_yolo_holds_for_a_resumed_session(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    """A resumed session keeps its stored mode ("ask"): --yolo given again must still apply."""
    env = crow_env(llm, home)
    write = Reply(tool_calls=[ToolCallSpec("write_file", {"path": "b.txt", "content": "x"})])
    llm.push(write, Reply(text="refused"), write, Reply(text="wrote it"))
    assert run("write b", env=env, cwd=workspace).returncode == 4
    done = run("--continue", "--yolo", "write b now", env=env, cwd=workspace)
    assert done.returncode == 0 and (workspace / "b.txt").read_text() == "x", done.stderr


# ------------------------------------------------------------ json output on every exit


def _last_object(done: subprocess.CompletedProcess[str], output: str) -> dict[str, Any]:
    """The result object json and stream-json output end with, whatever the exit."""
    lines = done.stdout.splitlines()
    assert lines, f"nothing on stdout; stderr: {done.stderr}"
    obj = json.loads(lines[-1])
    if output == "stream-json":
        assert obj.pop("type") == "result"
    else:
        assert len(lines) == 1
    return obj


@pytest.mark.parametrize("output", ["json", "stream-json"])
def test_an_error_instead_of_a_turn_still_ends_json_with_the_result(
    llm: ScriptedLLM, home: Path, workspace: Path, output: str
) -> None:
    """A script parsing stdout got nothing when the turn raised (unknown session, bad stdin,
    a broken plugin, a refused key): every exit ends with the object, `error` and `cause`."""
    env = crow_env(llm, home)
    unknown = run("--resume", "ffff0000", "hi", "--output", output, env=env, cwd=workspace)
    assert unknown.returncode == 2 and unknown.stderr == "crow: unknown session 'ffff0000'\n"
    assert _last_object(unknown, output) == {
        "session_id": None,
        "stop_reason": None,
        "answer": "",
        "usage": {"input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0, "cache_write_tokens": 0},
        "cost": None,
        "error": "unknown session 'ffff0000'",
        "cause": "session",
    }
    empty = run("-", "--output", output, env=env, cwd=workspace, stdin=b"\n")
    assert empty.returncode == 2 and _last_object(empty, output)["cause"] == "config"
    broken = home / "broken.yaml"
    broken.write_text("hooks:\n  extra: ['no_such_module_here:Hook']\n")
    plugin = run("hi", "--output", output, env=env, cwd=workspace, config=broken)
    obj = _last_object(plugin, output)
    assert plugin.returncode == 2 and obj["cause"] == "hook" and "no_such_module_here" in obj["error"]
    assert llm.requests == []


@pytest.mark.parametrize("output", ["json", "stream-json"])
def test_a_refused_key_is_a_failed_model_call_exit_1_with_the_result(
    llm: ScriptedLLM, home: Path, workspace: Path, output: str
) -> None:
    """It raised (exit 2, no object, the error said twice); now it ends like any failed
    model call: exit 1, `cause` "auth", the session id to resume once the key is fixed."""
    llm.keys = {"another-key"}
    done = run("hi", "--output", output, env=crow_env(llm, home), cwd=workspace)
    assert done.returncode == 1, done.stderr
    obj = _last_object(done, output)
    assert obj["cause"] == "auth" and "401" in obj["error"] and obj["stop_reason"] == "end_turn"
    assert obj["session_id"].startswith(session_id(done))
    told = done.stderr.count("HTTP 401")  # stream-json: the notice is an event on stdout
    assert "Authentication required" not in done.stderr and told == (output == "json")


def test_two_runs_in_one_session_at_once_one_is_busy(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    """The second gets a clear busy error (exit 2, in its JSON too); the first is not
    disturbed, and the second's prompt is not in the history."""
    env = crow_env(llm, home)
    llm.push(Reply(text="first"))
    sid = session_id(run("one", env=env, cwd=workspace))
    llm.push(Reply(text="word " * 300, chunk_size=5, chunk_delay=0.01))
    proc = subprocess.Popen(
        [sys.executable, "-m", "crow", "run", "--continue", "two"],
        env=env, cwd=workspace, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.read(5) == b"word "  # its turn holds the session
        busy = run("--continue", "three", "--output", "json", env=env, cwd=workspace)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert busy.returncode == 2 and busy.stderr.startswith(f"session {sid}… · ")
    assert "is running a turn in another crow process" in busy.stderr
    obj = _last_object(busy, "json")
    assert obj["cause"] == "busy" and obj["session_id"].startswith(sid) and obj["stop_reason"] is None
    assert proc.returncode == 0 and b"word " + out == b"word " * 300 + b"\n", err.decode()
    llm.push(Reply(text="four"))
    assert run("--continue", "four", env=env, cwd=workspace).returncode == 0
    assert user_texts(llm) == ["one", "two", "four"]


# ------------------------------------------------------------ closed standard streams


@pytest.mark.parametrize("output", ["text", "json", "stream-json"])
def test_stderr_closed_leaves_stdout_to_the_answer(
    llm: ScriptedLLM, home: Path, workspace: Path, output: str
) -> None:
    """With `2>&-` the session line (printed to a None `sys.stderr`) went to stdout: into
    the answer, and before the JSON."""
    llm.push(Reply(text="the answer"))
    done = subprocess.run(
        ["sh", "-c", 'exec "$0" -m crow run --output "$1" hi 2>&-', sys.executable, output],
        env=crow_env(llm, home), cwd=workspace, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and "crow run --resume" not in done.stdout
    if output == "text":
        assert done.stdout == "the answer\n"
    else:
        assert _last_object(done, output)["answer"] == "the answer"


@pytest.mark.parametrize("output", ["text", "json", "stream-json"])
def test_stdout_closed_is_exit_2_before_any_model_call(
    llm: ScriptedLLM, home: Path, workspace: Path, output: str
) -> None:
    done = subprocess.run(
        ["sh", "-c", 'exec "$0" -m crow run --output "$1" hi >&-', sys.executable, output],
        env=crow_env(llm, home), cwd=workspace, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and llm.requests == []
    assert done.stderr == "crow: crow run: stdout is closed; redirect it to /dev/null to discard the answer\n"


def test_dash_on_a_terminal_reads_to_ctrl_d_and_asks_nothing(
    llm: ScriptedLLM, home: Path, workspace: Path, tmp_path: Path
) -> None:
    """`crow run -` with stdin a terminal: the prompt is typed, ended by Ctrl-D (said on
    stderr, else the wait looks like a hang), and, as `crow run --help` says, no question is
    asked with `-`: the terminal's input ended (a question came up and waited before)."""
    from tests.support.tmux import Terminal

    llm.push(Reply(tool_calls=[ToolCallSpec("write_file", {"path": "b.txt", "content": "x"})]))
    llm.push(Reply(text="not written"))
    script = '"$0" -m crow run - > answer.txt; echo "status $?"'
    term = Terminal(["sh", "-c", script, sys.executable], env=crow_env(llm, home), cwd=workspace,
                    socket=tmp_path / "tmux.sock")  # fmt: skip
    try:
        term.wait_for("then Ctrl-D")
        term.type("write b")
        term.send("C-d")
        term.wait_for("status ", timeout=30)
        assert "status 4" in term.screen(), term.screen()
    finally:
        term.close()
    assert user_texts(llm, 0) == ["write b\n"] and not (workspace / "b.txt").exists()
    assert (workspace / "answer.txt").read_text() == "not written\n"


@pytest.mark.parametrize("output", ["text", "json"])
def test_ctrl_c_during_a_tool_is_130_and_the_history_stays_valid(
    llm: ScriptedLLM, home: Path, workspace: Path, output: str
) -> None:
    env = crow_env(llm, home)
    command = "touch started; sleep 30"
    llm.push(Reply(tool_calls=[ToolCallSpec("execute", {"command": command})]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "crow", "run", "--yolo", "--output", output, "run it"],
        env=env, cwd=workspace, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        end = time.monotonic() + 30
        while not (workspace / "started").exists():  # the tool runs now
            assert time.monotonic() < end and proc.poll() is None, "the tool never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130 and b"Traceback" not in err, err.decode()
    if output == "json":
        assert json.loads(out)["stop_reason"] == "cancelled"
    llm.push(Reply(text="going on"))
    again = run("--continue", "go on", env=env, cwd=workspace)
    assert again.returncode == 0 and again.stdout == "going on\n", again.stderr
    messages = llm.requests[-1].messages
    [call] = [m for m in messages if m["role"] == "assistant" and m.get("tool_calls")]
    [answer] = [m for m in messages if m["role"] == "tool"]
    assert answer["tool_call_id"] == call["tool_calls"][0]["id"], "every call has its result"
