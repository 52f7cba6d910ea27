"""End to end: `backend: {type: docker}` through a spawned `crow` driven by the ACP client,
against a real Podman engine over its Docker API socket (the `podman` fixture). Every tool
acts in the session's own container, made at its first tool call and removed when the
session or crow ends (a killed crow's by the next one); a broken engine or image is a clear
tool error while the session keeps answering."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import acp
import pytest

from mcp_servers.filesystem.container.owner import start_time
from tests.conftest import crow_env, raw_request, spawn_crow
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec

pytestmark = pytest.mark.anyio


def configure(home: Path, image: str, **backend: Any) -> None:
    lines = [f"  {key}: {value}" for key, value in {"type": "docker", "image": image, **backend}.items()]
    (home / "config.yaml").write_text("backend:\n" + "\n".join(lines) + "\n")


def env(llm: ScriptedLLM, home: Path, podman: Any, **extra: str) -> dict[str, str]:
    return crow_env(llm, home, **{"DOCKER_HOST": podman.docker_host, "CROW_SECRET_PROBE": "hush", **extra})


def call(name: str, id: str, **args: Any) -> Reply:
    return Reply(tool_calls=[ToolCallSpec(name, args, id=id)])


def results(llm: ScriptedLLM) -> dict[str, str]:
    """Every tool result the model was sent, by call id."""
    found: dict[str, str] = {}
    for request in llm.requests:
        for message in request.messages:
            if message["role"] == "tool":
                found[message["tool_call_id"]] = message["content"]
    return found


def ours(podman: Any, sid: str) -> list[str]:
    return podman.containers(f"label=crow.session={sid}")


def wait_until(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.1)


async def start(conn: Any, workspace: Path) -> str:
    await conn.initialize(protocol_version=1)
    return str((await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id)


async def prompt(conn: Any, sid: str, text: str = "go") -> Any:
    return await conn.prompt(session_id=sid, prompt=[acp.text_block(text)])


async def test_every_tool_acts_in_the_sessions_container_made_at_the_first_call_and_reused(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any
) -> None:
    configure(home, podman.image, env="{GREETING: hello}")
    (workspace / "notes.md").write_text("a needle here\n")
    os.symlink("/etc/passwd", workspace / "out")
    llm.push(
        Reply(  # two first calls at once: one container
            tool_calls=[
                ToolCallSpec(
                    "execute", {"command": "python3 -c 'print(1+1)'; cat /etc/debian_version"}, id="py"
                ),
                ToolCallSpec("ls", {"path": "."}, id="ls"),
            ]
        ),
        call("write_file", "w", path="made.txt", content="written by the model\n"),
        call("execute", "cat", command="cat made.txt; cat /proc/1/cmdline | tr '\\0' ' '"),
        call("grep", "g", pattern="needle"),
        call("glob", "gl", pattern="*.md"),
        call("read_file", "pw", path="/etc/passwd"),
        call("read_file", "ln", path="out"),
        call("execute", "env", command="env"),
        Reply(text="first turn done"),
        call("execute", "again", command="hostname"),
        Reply(text="second turn done"),
    )
    async with spawn_crow(env(llm, home, podman)) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        assert ours(podman, sid) == []  # nothing on the session/new path
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
        (first,) = ours(podman, sid)
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
        assert ours(podman, sid) == [first]  # reused across turns
    out = results(llm)
    assert "2\n" in out["py"] and "12." in out["py"]  # the image's Python and Debian
    assert "notes.md" in out["ls"]
    assert "written by the model" in out["cat"] and "python3 -c" in out["cat"]  # PID 1: the reaper
    assert (workspace / "made.txt").read_text() == "written by the model\n"  # mounted: the same file
    assert "notes.md" in out["g"] and "needle" in out["g"]
    assert "notes.md" in out["gl"]
    assert out["pw"].startswith("Error:") and "outside" in out["pw"]
    assert out["ln"].startswith("Error:") and "outside" in out["ln"]
    assert "GREETING=hello" in out["env"]
    for leaked in ("CROW_SECRET_PROBE", "OPENAI_API_KEY", "test-key", "CROW_HOME", "DOCKER_HOST"):
        assert leaked not in out["env"]
    assert first.startswith(out["again"].split("\n")[0].strip()[:12])
    assert ours(podman, sid) == []  # crow exited (stdin closed): removed


async def test_a_timed_out_command_leaves_no_process_in_the_container(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any
) -> None:
    configure(home, podman.image)
    procs = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done"
    llm.push(
        call("execute", "slow", command="sleep 301 & (sleep 302 &) ; sleep 303", timeout=1),
        call("execute", "ps", command=procs),
        Reply(text="done"),
    )
    async with spawn_crow(env(llm, home, podman)) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
    out = results(llm)
    assert "timed out" in out["slow"]
    assert "python3 -c" in out["ps"]  # the listing worked
    assert "sleep 30" not in out["ps"]


@pytest.mark.parametrize("how", ["session/close", "session/delete", "SIGTERM"])
async def test_the_container_goes_with_the_session(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any, how: str
) -> None:
    configure(home, podman.image)
    llm.push(call("execute", "x", command="true"), Reply(text="done"))
    async with spawn_crow(env(llm, home, podman), unstable=True) as (conn, proc, _client):
        sid = await start(conn, workspace)
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
        assert len(ours(podman, sid)) == 1
        if how == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
        else:
            await raw_request(conn, how, {"sessionId": sid})
        assert ours(podman, sid) == []


async def test_a_killed_crows_container_is_removed_by_the_next_crow_and_no_other(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any
) -> None:
    configure(home, podman.image)
    alive = {"crow.pid": str(os.getpid()), "crow.started": start_time(os.getpid())}
    decoys = {  # a live crow's container here, a dead one's on another machine: both kept
        "live": {**alive, "crow.host": socket.gethostname()},
        "elsewhere": {"crow.pid": "999999", "crow.started": "1", "crow.host": "another-machine"},
    }
    kept = []
    for name, labels in decoys.items():
        labels = {**labels, **podman.labels, "crow.session": f"decoy-{name}"}
        flags = [f"--label={k}={v}" for k, v in labels.items()]
        kept.append(podman.podman("create", *flags, podman.image, "python3", "-c", "0").stdout.strip())
    try:
        llm.push(call("execute", "x", command="true"), Reply(text="done"))
        async with spawn_crow(env(llm, home, podman)) as (conn, proc, _client):
            sid = await start(conn, workspace)
            assert (await prompt(conn, sid)).stop_reason == "end_turn"
            proc.kill()
            await proc.wait()
        assert len(ours(podman, sid)) == 1  # SIGKILL: left behind
        async with spawn_crow(env(llm, home, podman)) as (conn, _proc, _client):
            await start(conn, workspace)  # the warm-up, which the first session starts, looks
            wait_until(lambda: ours(podman, sid) == [], "the orphan is removed")
            assert podman.containers("label=crow.session=decoy-live") == [kept[0]]
            assert podman.containers("label=crow.session=decoy-elsewhere") == [kept[1]]
    finally:
        podman.podman("rm", "-f", *kept, check=False)


def two_turns(llm: ScriptedLLM, first: tuple[str, str], second: tuple[str, str]) -> None:
    """Each turn: one `execute` (call id, command), then an answer."""
    llm.push(
        call("execute", first[0], command=first[1]),
        Reply(text="one"),
        call("execute", second[0], command=second[1]),
        Reply(text="two"),
    )


@pytest.mark.parametrize("sync", ["mount", "copy"])
async def test_a_container_killed_under_crow_is_made_again_and_the_model_told(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any, sync: str
) -> None:
    configure(home, podman.image, sync=sync)
    (workspace / "a.txt").write_text("in the workspace\n")
    two_turns(llm, ("mark", "echo kept > /tmp/marker && echo marked"), ("look", "cat /tmp/marker a.txt"))
    async with spawn_crow(env(llm, home, podman)) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
        (first,) = ours(podman, sid)
        podman.podman("rm", "-f", "-t", "0", first)
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
        (second,) = ours(podman, sid)
        assert second != first
    told = f"[the container was gone (killed or removed); a new one was started from {podman.image}"
    look = results(llm)["look"]
    assert look.startswith(told) and "/tmp/marker: No such file" in look and "in the workspace" in look
    assert ("the workspace was copied in again" in look) == (sync == "copy")


async def bad_engine_call(llm: ScriptedLLM, home: Path, workspace: Path, environment: dict[str, str]) -> str:
    """The first tool call's result; the session answers a chat prompt after it."""
    llm.push(call("execute", "x", command="true"), Reply(text="told"), Reply(text="still here"))
    async with spawn_crow(environment) as (conn, _proc, client):
        sid = await start(conn, workspace)
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
        assert (await prompt(conn, sid, "just chat")).stop_reason == "end_turn"
        assert "still here" in client.text(sid)
    return results(llm)["x"]


async def test_an_unreachable_engine_is_a_clear_error_and_the_session_still_chats(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any, tmp_path: Path
) -> None:
    configure(home, podman.image)
    missing = f"unix://{tmp_path}/no-engine.sock"
    error = await bad_engine_call(llm, home, workspace, env(llm, home, podman, DOCKER_HOST=missing))
    assert error.startswith("Error:") and "cannot reach the container engine" in error and missing in error


async def test_a_missing_image_is_named_with_how_to_get_it(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any
) -> None:
    configure(home, "localhost/crow-no-such-image:1")
    error = await bad_engine_call(llm, home, workspace, env(llm, home, podman))
    assert "image localhost/crow-no-such-image:1 is not on the engine" in error and "pull" in error


async def test_an_image_without_python_is_a_clear_error(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any
) -> None:
    configure(home, podman.no_python_image)
    error = await bad_engine_call(llm, home, workspace, env(llm, home, podman))
    assert f"the image {podman.no_python_image} has no python3" in error and "python:3.12-slim" in error
    assert podman.containers("label=crow.session", f"ancestor={podman.no_python_image}") == []


async def test_a_command_that_kills_the_helper_is_told_and_the_next_call_works(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any
) -> None:
    configure(home, podman.image)
    llm.push(
        call("execute", "kill", command="kill -9 $PPID; sleep 5"),  # the shell's parent: the helper
        call("execute", "after", command="echo still here"),
        Reply(text="done"),
    )
    async with spawn_crow(env(llm, home, podman)) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
        assert len(ours(podman, sid)) == 1  # the same container: only the helper was started again
    out = results(llm)
    assert out["kill"].startswith("Error: the helper process in the container stopped while this command ran")
    assert "still here" in out["after"]


async def test_copy_mode_copies_the_workspace_in_and_brings_changes_back_each_turn(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any
) -> None:
    configure(home, podman.image, sync="copy")
    (workspace / "a.txt").write_text("from the host\n")
    two_turns(llm, ("first", "cat a.txt; echo made in the container > b.txt"), ("second", "cat a.txt"))
    async with spawn_crow(env(llm, home, podman)) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
        assert (workspace / "b.txt").read_text() == "made in the container\n"  # pulled at turn end
        (workspace / "a.txt").write_text("changed on the host\n")
        assert (await prompt(conn, sid)).stop_reason == "end_turn"  # pushed at turn start
    out = results(llm)
    assert "from the host" in out["first"] and "changed on the host" in out["second"]
    assert ours(podman, sid) == []
