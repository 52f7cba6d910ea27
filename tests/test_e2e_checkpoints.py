"""End to end, crow spawned and driven by the Python SDK client and by the official TypeScript
SDK 2.4.0 client: a turn's write, edit and command are checkpointed in CROW_HOME, privately
(folders 0700, files 0600); a call the user refuses records nothing; `session/delete`
removes the session's checkpoints and its shadow git dir. (Putting the files back is driven
through `/undo` by the rewind work; tests/test_checkpoints.py restores with real turns.)"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import acp
import pytest

from tests.conftest import crow_env, initialize_125, raw_request, spawn_crow
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec
from tests.support.ts_client import run_script

pytestmark = pytest.mark.anyio


def turn_replies() -> list[Reply]:
    return [
        Reply(
            tool_calls=[
                ToolCallSpec("write_file", {"path": "new.txt", "content": "made\n"}, id="w"),
                ToolCallSpec("edit_file", {"path": "old.txt", "old_text": "one", "new_text": "two"}, id="e"),
            ]
        ),
        Reply(tool_calls=[ToolCallSpec("execute", {"command": "echo ran > cmd.txt"}, id="x")]),
        Reply(text="done"),
    ]


def private_modes(home: Path) -> dict[str, str]:
    """Every path under CROW_HOME/checkpoints whose mode lets anyone else in: none."""
    root = home / "checkpoints"
    loose = {}
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        in_git = "git" in path.relative_to(root).parts[:1] and path.parent != root / "git"
        if not in_git and mode & 0o077:  # git's own files live in a 0700 folder
            loose[str(path.relative_to(home))] = oct(mode)
    return loose


def checkpoint_of(home: Path, session_id: str) -> dict[str, Any]:
    manifests = list((home / "checkpoints" / session_id).glob("*.json"))
    assert len(manifests) == 1, manifests
    return json.loads(manifests[0].read_text())


async def test_a_turn_is_checkpointed_privately_and_deleting_the_session_forgets_it(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (workspace / "old.txt").write_text("one\n")
    llm.push(*turn_replies())
    async with spawn_crow(crow_env(llm, home, CROW_SANDBOX="off")) as (conn, _proc, client):
        await initialize_125(conn)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        done = await conn.prompt(session_id=sid, prompt=[acp.text_block("work")])
        assert done.stop_reason == "end_turn"
        assert len(client.permission_requests) == 3  # ask mode: each change was allowed
        record = checkpoint_of(home, sid)
        files = record["files"]
        assert files[str(workspace / "new.txt")]["before"] is None
        assert files[str(workspace / "old.txt")]["before"]["mode"] == stat.S_IMODE(
            (workspace / "old.txt").stat().st_mode
        )
        assert record["git"]["before"] and record["git"]["after"]
        assert private_modes(home) == {}
        assert len(shadow_dirs(home)) == 1

        # a refused write records nothing
        client.permission_answer = "reject_once"
        llm.push(
            Reply(tool_calls=[ToolCallSpec("write_file", {"path": "no.txt", "content": "x"}, id="n")]),
            Reply(text="ok"),
        )
        await conn.prompt(session_id=sid, prompt=[acp.text_block("again")])
        assert not (workspace / "no.txt").exists()
        assert len(list((home / "checkpoints" / sid).glob("*.json"))) == 1

        assert await raw_request(conn, "session/delete", {"sessionId": sid}) == {}
        assert not (home / "checkpoints" / sid).exists()
        assert shadow_dirs(home) == []
    assert (workspace / "cmd.txt").read_text() == "ran\n"


def shadow_dirs(home: Path) -> list[Path]:
    """The shadow git dirs (each workspace's lock file beside its dir stays)."""
    return [p for p in (home / "checkpoints" / "git").iterdir() if p.is_dir()]


async def test_crow_sessions_delete_forgets_the_checkpoints_too(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """`crow sessions delete` removes what `session/delete` does: the copies of the files'
    earlier content and the snapshot refs must not outlive the session."""
    import sys

    import anyio

    (workspace / "old.txt").write_text("one\n")
    llm.push(*turn_replies())
    env = crow_env(llm, home, CROW_SANDBOX="off")
    async with spawn_crow(env) as (conn, _proc, _client):
        await initialize_125(conn)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        assert (await conn.prompt(session_id=sid, prompt=[acp.text_block("work")])).stop_reason == "end_turn"
    assert checkpoint_of(home, sid)["git"]["after"]
    done = await anyio.run_process(
        [sys.executable, "-m", "crow", "sessions", "delete", sid], env=env, cwd=workspace, check=False
    )
    assert done.returncode == 0, done.stderr
    assert not (home / "checkpoints" / sid).exists()
    assert shadow_dirs(home) == []


def test_checkpoints_through_the_typescript_client(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    (workspace / "old.txt").write_text("one\n")
    llm.push(*turn_replies())
    new = {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "s"}
    prompt = {"sessionId": "${s.sessionId}", "prompt": [{"type": "text", "text": "work"}]}
    env = crow_env(llm, home, CROW_SANDBOX="off")
    steps = [new, {"request": "session/prompt", "params": prompt, "as": "p"}]
    out = run_script({"permission": "allow_once", "steps": steps}, env, workspace)
    assert out["results"]["p"]["result"]["stopReason"] == "end_turn"
    sid = out["results"]["s"]["result"]["sessionId"]
    assert (workspace / "new.txt").read_text() == "made\n"
    assert (workspace / "old.txt").read_text() == "two\n"
    record = checkpoint_of(home, sid)
    assert sorted(Path(p).name for p in record["files"]) == ["new.txt", "old.txt"]
    assert record["git"]["after"]
    assert private_modes(home) == {}
    delete = {"request": "session/delete", "params": {"sessionId": sid}, "as": "d"}
    out = run_script({"steps": [delete]}, env, workspace)  # another crow process deletes it
    assert out["results"]["d"] == {"result": {}}
    assert not (home / "checkpoints" / sid).exists()
    assert shadow_dirs(home) == []
