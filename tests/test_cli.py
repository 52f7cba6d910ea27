"""`crow run` and `crow mcp`: the terminal front ends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import crow_env
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec


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
    assert refused.returncode == 0 and "--yolo" in refused.stderr and not (workspace / "b.txt").exists()
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
