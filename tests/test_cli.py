"""`crow run` and `crow mcp`: the terminal front ends."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import crow_env
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec
from tests.test_lifecycle import BROKEN, exploding_plugin


def crow(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crow", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_run_answers_on_stdout_and_shows_tools_on_stderr(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (workspace / "a.txt").write_text("hello\n")
    llm.push(
        Reply(tool_calls=[ToolCallSpec(name="read_file", arguments={"path": "a.txt"})]),
        Reply(text="The file says hello."),
    )
    done = crow("run", "what is in a.txt?", "--cwd", str(workspace), env=crow_env(llm, home), cwd=workspace)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "The file says hello.\n"
    assert "→ Read a.txt" in done.stderr and "✓" in done.stderr


def test_run_without_a_terminal_refuses_edits_unless_yolo(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    write = Reply(tool_calls=[ToolCallSpec(name="write_file", arguments={"path": "b.txt", "content": "x"})])
    llm.push(write, Reply(text="could not"), write, Reply(text="wrote it"))
    env = crow_env(llm, home)
    refused = crow("run", "write b", "--cwd", str(workspace), env=env, cwd=workspace)
    assert refused.returncode == 4 and "--yolo" in refused.stderr and not (workspace / "b.txt").exists()
    allowed = crow("run", "write b", "--yolo", "--cwd", str(workspace), env=env, cwd=workspace)
    assert allowed.returncode == 0 and (workspace / "b.txt").read_text() == "x"


def test_run_without_a_model_says_what_to_set(home: Path, workspace: Path) -> None:
    done = crow("run", "hi", env=crow_env(None, home), cwd=workspace)
    assert done.returncode == 1 and "CROW_MODEL" in done.stderr and done.stdout == ""


def test_bad_config_is_a_clear_error(home: Path, workspace: Path) -> None:
    bad = home / "bad.yaml"
    bad.write_text("max_iterations: many\n")
    done = crow("--config", str(bad), "run", "hi", env=crow_env(None, home), cwd=workspace)
    assert done.returncode == 2 and "invalid configuration" in done.stderr and "max_iterations" in done.stderr


def test_a_misspelt_hooks_disable_is_a_clear_error(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    # The warm-up's ConfigError (here an unknown hooks.disable name) ended `crow run` with
    # a traceback; it is a configuration error like any other: exit 2, one line naming it.
    config = home / "disable.yaml"
    config.write_text("hooks:\n  disable: [memroy]\n")
    done = crow(
        "--config", str(config), "run", "hi", "--cwd", str(workspace), env=crow_env(llm, home), cwd=workspace
    )
    assert done.returncode == 2, done.stderr
    assert (
        f"crow: invalid configuration in {config}: hooks.disable names unknown hook(s) 'memroy'"
        in done.stderr
    )
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert llm.requests == []


def _only_session(env: dict[str, str], cwd: Path) -> list[str]:
    """`crow sessions list` for a store holding one session: its fields (id ... title)."""
    listed = crow("sessions", "list", env=env, cwd=cwd)
    assert listed.returncode == 0, listed.stderr
    [line] = listed.stdout.splitlines()
    return line.split("\t")


def test_run_names_the_session_after_its_prompt(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    """The title is the Agent's job, not the ACP adapter's: `crow run` gets it too."""
    llm.push(Reply(text="done"))
    env = crow_env(llm, home)
    done = crow("run", "Fix  the\nlogin bug", "--cwd", str(workspace), env=env, cwd=workspace)
    assert done.returncode == 0, done.stderr
    assert _only_session(env, workspace)[4] == "Fix the login bug"


def test_run_slash_compact_is_a_command_and_its_notice_is_replayed(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """`/compact` in `crow run` compacts instead of asking the model, and what the user was
    told is stored: an editor that loads the session later shows it."""
    import acp
    import anyio

    from tests.conftest import spawn_crow

    env = crow_env(llm, home)
    done = crow("run", "/compact", "keep", "numbers", "--cwd", str(workspace), env=env, cwd=workspace)
    assert done.returncode == 0, done.stderr
    [notice] = [line for line in done.stderr.splitlines() if line.startswith("Nothing compacted: ")]
    assert llm.requests == [] and done.stdout == ""
    sid = _only_session(env, workspace)[0]

    async def replay() -> tuple[list[str], str]:
        async with spawn_crow(env) as (conn, _proc, client):
            await conn.initialize(protocol_version=1)
            await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
            await conn.prompt(session_id=sid, prompt=[acp.text_block("hello")])
        return [u.content.text for u in client.of_type("UserMessageChunk")], client.text()

    llm.push(Reply(text="hi there"))
    users, text = anyio.run(replay)
    assert users == ["/compact keep numbers"]
    assert text == f"{notice}\nhi there"
    sent = [m["content"] for m in llm.requests[-1].messages if m["role"] != "system"]
    assert sent == ["hello"], "neither the command nor the notice reaches the model"


def test_run_with_a_broken_plugin_names_it(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    env = crow_env(llm, home, **exploding_plugin(home))
    done = crow("run", "hi", "--cwd", str(workspace), env=env, cwd=workspace)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines()[-1] == f"crow: {BROKEN}"


def test_version(home: Path, workspace: Path) -> None:
    from crow import __version__

    done = crow("--version", env=crow_env(None, home), cwd=workspace)
    assert done.returncode == 0 and done.stdout == f"crow {__version__}\n"


def test_mcp_servers_answer_help(home: Path, workspace: Path) -> None:
    """`crow mcp todos --help` started the server, which waited on stdin."""
    for server in ("todos", "filesystem"):
        done = crow("mcp", server, "--help", env=crow_env(None, home), cwd=workspace)
        assert done.returncode == 0 and done.stdout.startswith(f"usage: crow mcp {server} "), done.stderr
    refused = crow("mcp", "todos", "--root", "x", env=crow_env(None, home), cwd=workspace)
    assert refused.returncode == 2 and refused.stderr.endswith("error: unrecognized arguments: --root\n")


def test_run_on_a_terminal_shows_hostile_text_harmlessly(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    """stdout a terminal: the answer goes through the renderer, control characters spelled out."""
    from tests.support.on_pty import stdout_on_pty

    llm.push(Reply(text="safe \x1b[8mhidden\x1b[0m end"))
    status, out = stdout_on_pty([sys.executable, "-m", "crow", "run", "hi"], env=crow_env(llm, home), cwd=workspace)
    assert status == 0
    assert b"\x1b[8m" not in out and b"\\x1b[8mhidden" in out


def test_serve_ends_quietly_when_the_editor_closes_both_pipes(home: Path, workspace: Path) -> None:
    """ACP's transport closes stdout itself: the closed-pipe handling in cli.main must not
    flush it again (ValueError, exit 1)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "crow", "serve"], env=crow_env(None, home), cwd=workspace,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n')
    proc.stdin.flush()
    assert b'"result"' in proc.stdout.readline()
    proc.stdin.close()
    proc.stdout.close()
    assert proc.wait(timeout=30) == 0
    assert b"Traceback" not in proc.stderr.read()


def test_a_crow_started_with_sigint_ignored_keeps_ignoring_it(home: Path, workspace: Path) -> None:
    """`crow serve &` in a script starts with SIGINT ignored (a Ctrl-C at the terminal is
    for the foreground job): crow keeps it so, at start-up and after."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "crow", "serve"], env=crow_env(None, home), cwd=workspace,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.send_signal(signal.SIGINT)  # while it starts
        proc.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n')
        proc.stdin.flush()
        assert b'"result"' in proc.stdout.readline()
        proc.send_signal(signal.SIGINT)  # once it serves
        proc.stdin.write(b'{"jsonrpc":"2.0","id":2,"method":"initialize","params":{"protocolVersion":1}}\n')
        proc.stdin.flush()
        assert b'"result"' in proc.stdout.readline()
    finally:
        proc.stdin.close()
    assert proc.wait(timeout=30) == 0


def test_main_in_process_gives_the_callers_sigint_handler_back(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from crow import cli

    def mine(signum: int, frame: object) -> None:
        pass

    monkeypatch.setenv("CROW_HOME", str(home))
    previous = signal.signal(signal.SIGINT, mine)
    try:
        with pytest.raises(SystemExit):
            cli.main(["sessions", "list"])
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, previous)
