"""End to end, `backend: {type: docker}`: the paths the model is told, the ones its calls
name, and what the editor and the permission rules make of them. The model works in the
container (/workspace, /mnt/NAME); the editor and the rules see the files on this machine."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import acp
import pytest

from tests.conftest import CROW, spawn_crow
from tests.llm_server import Reply, ScriptedLLM
from tests.test_container_e2e import call, configure, env, results

pytestmark = pytest.mark.anyio


async def test_the_model_is_given_container_paths_and_the_editor_and_rules_see_this_machines(
    llm: ScriptedLLM, home: Path, workspace: Path, tmp_path: Path, podman: Any
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "data.txt").write_text("from the other root\n")
    (workspace / "secret").mkdir()
    (home / "config.yaml").write_text(
        f"backend:\n  type: docker\n  image: {podman.image}\n"
        "permissions:\n  deny: ['write_file(secret/**)']\n"
    )
    llm.push(
        call("write_file", "w", path="/workspace/made.txt", content="made\n"),
        call("write_file", "s", path="/workspace/secret/key", content="leaked\n"),
        call("read_file", "r", path="/mnt/other/data.txt"),
        Reply(text="done"),
    )
    async with spawn_crow(env(llm, home, podman)) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        new = await conn.new_session(cwd=str(workspace), mcp_servers=[], additional_directories=[str(other)])
        sid = str(new.session_id)
        assert (await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])).stop_reason == "end_turn"
    system = llm.requests[0].messages[0]["content"]
    assert "/workspace" in system and "/mnt/other" in system  # where the tools find them
    assert str(workspace) not in system and str(other) not in system  # not there in the container
    out = results(llm)
    assert (workspace / "made.txt").read_text() == "made\n"
    assert "denied by the permission rule" in out["s"]  # the rule holds for the container's path
    assert not (workspace / "secret" / "key").exists()
    assert "from the other root" in out["r"]
    (asked, _options), *_ = client.permission_requests
    assert [loc.path for loc in asked.locations] == [str(workspace / "made.txt")]
    assert asked.content[0].path == str(workspace / "made.txt")  # the preview's diff
    starts = {u.tool_call_id: u for u in client.of_type("ToolCallStart")}
    assert [loc.path for loc in starts["r"].locations] == [str(other / "data.txt")]
    ends = [u for u in client.of_type("ToolCallProgress") if u.tool_call_id == "w" and u.content]
    assert ends[-1].content[0].path == str(workspace / "made.txt")


def test_crow_run_on_a_terminal_shows_a_write_over_a_file_as_the_change_it_is(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any
) -> None:
    """The question for a write to /workspace/a.txt shows a.txt's lines going, not a new
    file: the file the container's path names is read on this machine."""
    (workspace / "a.txt").write_text("the old line\n")
    configure(home, podman.image)
    llm.push(call("write_file", "w", path="/workspace/a.txt", content="the new line\n"), Reply(text="done"))
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [*CROW, "run", "--cwd", str(workspace), "go"],
        stdin=slave, stdout=slave, stderr=slave, env=env(llm, home, podman), start_new_session=True,
    )  # fmt: skip
    os.close(slave)
    out = b""
    try:
        deadline = time.monotonic() + 60
        while b"Answer for" not in out:
            assert proc.poll() is None and time.monotonic() < deadline, out.decode(errors="replace")
            if select.select([master], [], [], 0.1)[0]:
                out += os.read(master, 65536)
        os.write(master, b"n\n")
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
    text = out.decode(errors="replace")
    assert "-the old line" in text and "+the new line" in text
    assert "new file" not in text
    assert (workspace / "a.txt").read_text() == "the old line\n"


def test_the_typescript_sdk_takes_a_docker_sessions_updates_with_this_machines_paths(
    llm: ScriptedLLM, home: Path, workspace: Path, tmp_path: Path, podman: Any
) -> None:
    from tests.support.ts_client import run_script

    other = tmp_path / "other"
    other.mkdir()
    (other / "o.txt").write_text("other\n")
    configure(home, podman.image)
    llm.push(
        call("write_file", "w", path="/workspace/made.txt", content="made\n"),
        call("read_file", "r", path="/mnt/other/o.txt", offset=0),
        call("execute", "x", command="exit 7"),
        Reply(text="done"),
    )
    prompt = {"sessionId": "${s.sessionId}", "prompt": [{"type": "text", "text": "go"}]}
    new = {"cwd": str(workspace), "mcpServers": [], "additionalDirectories": [str(other)]}
    out = run_script(
        {
            "permission": "allow_once",
            "steps": [
                {"request": "session/new", "params": new, "as": "s"},
                {"request": "session/prompt", "params": prompt, "as": "p"},
            ],
        },
        env(llm, home, podman),
        workspace,
    )
    assert out["results"]["p"]["result"]["stopReason"] == "end_turn", out["results"]
    (asked,) = [
        r["params"]["toolCall"] for r in out["requests"] if r["method"] == "session/request_permission"
    ][:1]
    assert asked["locations"] == [{"path": str(workspace / "made.txt")}]
    shown = [u["update"] for u in out["updates"]]
    starts = {u["toolCallId"]: u for u in shown if u["sessionUpdate"] == "tool_call"}
    assert starts["r"]["locations"] == [{"path": str(other / "o.txt"), "line": 1}]
    ends = [u for u in shown if u["sessionUpdate"] == "tool_call_update" and u.get("content")]
    diff = next(c for u in ends if u["toolCallId"] == "w" for c in u["content"] if c["type"] == "diff")
    assert diff["path"] == str(workspace / "made.txt") and diff["newText"] == "made\n"
    assert "[exit code 7]" in results(llm)["x"]


@pytest.mark.parametrize("sync", ["mount", "copy"])
async def test_undo_puts_back_a_write_the_model_made_through_the_containers_path(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any, sync: str
) -> None:
    """In copy mode too: the model's write and a command's change come back here after each
    call, so the checkpoint records what the turn left (it once recorded the file as it was
    before the turn's end pulled it back: /undo said it undid and left it changed)."""
    (workspace / "a.txt").write_text("before\n")
    (workspace / "b.txt").write_text("b before\n")
    configure(home, podman.image, sync=sync)
    llm.push(
        call("write_file", "w", path="/workspace/a.txt", content="after\n"),
        call("execute", "x", command="echo 'b after' > b.txt"),
        Reply(text="done"),
    )
    async with spawn_crow(env(llm, home, podman, CROW_MODE="yolo")) as (conn, _proc, _client):
        await conn.initialize(protocol_version=1)
        sid = str((await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id)
        assert (await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])).stop_reason == "end_turn"
        assert (workspace / "a.txt").read_text() == "after\n"
        assert (workspace / "b.txt").read_text() == "b after\n"
        await conn.prompt(session_id=sid, prompt=[acp.text_block("/undo")])
        assert (workspace / "a.txt").read_text() == "before\n"
        assert (workspace / "b.txt").read_text() == "b before\n"
        llm.push(call("execute", "c", command="cat a.txt b.txt"), Reply(text="seen"))
        await conn.prompt(session_id=sid, prompt=[acp.text_block("look")])
    assert "before\nb before\n" in results(llm)["c"]  # the container has the undone files too


def test_a_container_path_and_the_same_file_relative_wait_for_each_other_in_a_batch(workspace: Path) -> None:
    """Calls in one reply naming one file run in the order given: in a docker session
    /workspace/a.txt and a.txt are that one file."""
    from crow.batch import waits_for
    from crow.config import Config
    from crow.messages import ToolCall
    from crow.roots import editor_cwd
    from crow.session import Session

    config = Config.model_validate({"backend": {"type": "docker", "image": "img"}})
    session = Session(id="s", cwd=workspace, mode="ask", model="", config=config)
    calls = [
        ToolCall("w", "write_file", {"path": "/workspace/a.txt", "content": "x"}),
        ToolCall("r", "read_file", {"path": "a.txt"}),
        ToolCall("o", "read_file", {"path": "b.txt"}),
    ]
    assert waits_for(calls, lambda name: name == "read_file", editor_cwd(session)) == [[], [0], []]
