"""End to end, the container's life under cancels, crashes and races: a spawned `crow`
driven by the ACP client against a real Podman engine (the `podman` fixture). A cancelled
call settles the turn and leaves no process behind; `/undo` puts a file back where the
tools see it; a subagent's tools act in its parent's container."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import raw_request, spawn_crow
from tests.llm_server import Reply, ScriptedLLM
from tests.test_container_e2e import call, configure, env, ours, prompt, results, start, wait_until

pytestmark = pytest.mark.anyio

PROCS = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done"


def in_container(podman: Any, cid: str, command: str) -> str:
    return podman.podman("exec", cid, "sh", "-c", command).stdout


async def test_a_cancelled_long_command_settles_fast_and_leaves_no_process(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any
) -> None:
    configure(home, podman.image)
    llm.push(
        call("execute", "long", command="touch started; sleep 333", timeout=120),
        call("execute", "after", command="echo next"),
        Reply(text="done"),
    )
    async with spawn_crow(env(llm, home, podman)) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        turn = await command_started(conn, sid, workspace)
        await conn.cancel(session_id=sid)
        done = await asyncio.wait_for(turn, 15)
        assert done.stop_reason == "cancelled"
        (cid,) = ours(podman, sid)
        assert "sleep 333" not in in_container(podman, cid, PROCS)
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
        assert ours(podman, sid) == [cid]
    assert "next" in results(llm)["after"]
    assert ours(podman, sid) == []


@pytest.mark.parametrize("sync", ["mount", "copy"])
async def test_undo_puts_a_file_back_on_the_host_and_in_the_container(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any, sync: str
) -> None:
    configure(home, podman.image, sync=sync)
    (workspace / "a.txt").write_text("one\n")
    llm.push(
        call("edit_file", "e", path="a.txt", old_text="one", new_text="two"),
        Reply(text="edited"),
        call("execute", "look", command="cat a.txt"),
        Reply(text="looked"),
    )
    async with spawn_crow(env(llm, home, podman)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
        assert (workspace / "a.txt").read_text() == "two\n"
        assert (await prompt(conn, sid, "/undo")).stop_reason == "end_turn"
        assert (workspace / "a.txt").read_text() == "one\n", client.text(sid)
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
    assert results(llm)["look"].startswith("one\n")


async def test_a_subagents_tools_act_in_its_parents_container(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any
) -> None:
    configure(home, podman.image)
    llm.push(
        call("execute", "parent", command="echo from parent > /tmp/mark; hostname"),
        call("task", "t", description="look", prompt="look at the mark"),
        call("execute", "child", command="cat /tmp/mark; hostname"),
        Reply(text="child done"),
        Reply(text="parent done"),
    )
    async with spawn_crow(env(llm, home, podman)) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
        assert len(ours(podman, sid)) == 1
        await raw_request(conn, "session/close", {"sessionId": sid})
        assert ours(podman, sid) == []
    out = results(llm)
    assert "from parent" in out["child"]
    assert out["child"].split()[-1] == out["parent"].split()[-1]


@pytest.mark.parametrize("delay", [0.0, 0.3, 0.8, 1.5, 3.0])
async def test_a_first_call_cancelled_at_any_moment_settles_and_leaves_nothing(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any, delay: float
) -> None:
    configure(home, podman.image, sync="copy")
    (workspace / "a.txt").write_text("from the host\n")
    llm.push(call("execute", "first", command="sleep 30"))
    async with spawn_crow(env(llm, home, podman)) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        turn = asyncio.create_task(prompt(conn, sid))
        await asyncio.to_thread(llm.wait_for_requests, 1, 30)
        await asyncio.sleep(delay)  # from the model's answer: the container being made, or in use
        await conn.cancel(session_id=sid)
        done = await asyncio.wait_for(turn, 15)
        assert done.stop_reason == "cancelled"
        assert len(ours(podman, sid)) <= 1
        llm.push(call("execute", "after", command="cat a.txt; " + PROCS), Reply(text="done"))
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
        assert len(ours(podman, sid)) == 1
        await raw_request(conn, "session/close", {"sessionId": sid})
        assert ours(podman, sid) == []
    after = results(llm)["after"]
    assert "from the host" in after and "sleep 30" not in after


@pytest.mark.parametrize("sync", ["mount", "copy"])
async def test_an_engine_stopped_mid_call_is_a_clear_error_and_once_back_the_same_container_serves(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any, tmp_path: Path, sync: str
) -> None:
    from tests.support.podman import podman_service

    configure(home, podman.image, sync=sync)
    (workspace / "a.txt").write_text("before\n")
    llm.push(
        call("execute", "mark", command="echo kept > /tmp/marker"),
        Reply(text="one"),
        call("execute", "long", command="touch started; sleep 20"),
        Reply(text="two"),
        call("execute", "look", command="cat /tmp/marker a.txt"),
        Reply(text="three"),
    )
    (tmp_path / "own").mkdir()
    own: Any = podman_service(tmp_path / "own")
    engine = own.__enter__()
    try:
        async with spawn_crow(env(llm, home, engine)) as (conn, _proc, _client):
            sid = await start(conn, workspace)
            assert (await prompt(conn, sid)).stop_reason == "end_turn"
            (cid,) = ours(podman, sid)
            turn = asyncio.create_task(prompt(conn, sid))

            def started() -> bool:
                return podman.podman("exec", cid, "test", "-e", "started", check=False).returncode == 0

            await asyncio.to_thread(wait_until, started, "the command runs")
            own.__exit__(None, None, None)  # the engine's API goes away; the container stays
            own = None
            assert (await asyncio.wait_for(turn, 30)).stop_reason == "end_turn"
            (workspace / "a.txt").write_text("changed on the host meanwhile\n")
            own = podman_service(tmp_path / "own")
            engine = own.__enter__()
            assert (await prompt(conn, sid)).stop_reason == "end_turn"
            assert ours(podman, sid) == [cid]  # the same container, not a second one
        assert ours(podman, sid) == []
    finally:
        if own is not None:
            own.__exit__(None, None, None)
    out = results(llm)
    assert out["long"].startswith("Error:") and "engine" in out["long"], out["long"]
    assert out["look"].startswith("kept\nchanged on the host meanwhile"), out["look"]


async def test_ten_sessions_making_their_first_call_at_once_get_ten_containers_without_cross_talk(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any, tmp_path: Path
) -> None:
    configure(home, podman.image)
    n = 10
    folders = []
    for i in range(n):
        folder = tmp_path / f"ws{i}"
        folder.mkdir()
        (folder / "who.txt").write_text(f"session {i}\n")
        folders.append(folder)
    llm.rule(
        lambda r: r.last_user_text.startswith("s") and not any(m["role"] == "tool" for m in r.messages),
        lambda r: call("execute", r.last_user_text, command="cat who.txt; echo $$ > /tmp/me; hostname"),
    )
    llm.rule(lambda r: True, Reply(text="done"))
    async with spawn_crow(env(llm, home, podman)) as (conn, _proc, _client):
        await conn.initialize(protocol_version=1)
        sids = [str((await conn.new_session(cwd=str(f), mcp_servers=[])).session_id) for f in folders]
        done = await asyncio.gather(*(prompt(conn, sid, f"s{i}") for i, sid in enumerate(sids)))
        assert {d.stop_reason for d in done} == {"end_turn"}
        containers = [ours(podman, sid) for sid in sids]
        assert all(len(c) == 1 for c in containers) and len({c[0] for c in containers}) == n
    out = results(llm)
    hosts = set()
    for i in range(n):
        said = out[f"s{i}"].split("\n")
        assert said[0] == f"session {i}", out[f"s{i}"]
        hosts.add(said[1])
    assert len(hosts) == n
    assert all(ours(podman, sid) == [] for sid in sids)


@pytest.mark.parametrize("how", ["kill -TERM 1; sleep 3", "kill -KILL 1; kill -INT 1; sleep 3"])
async def test_the_model_signalling_pid_1_is_told_and_the_next_call_works(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any, how: str
) -> None:
    configure(home, podman.image)
    llm.push(
        call("execute", "mark", command="echo kept > /tmp/marker"),
        call("execute", "kill", command=how),
        call("execute", "after", command="echo still here"),
        Reply(text="done"),
    )
    async with spawn_crow(env(llm, home, podman)) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
        assert len(ours(podman, sid)) == 1
    out = results(llm)
    assert "still here" in out["after"], out
    assert ours(podman, sid) == []


async def test_a_container_killed_during_a_call_is_an_error_and_the_next_call_gets_a_new_one(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any
) -> None:
    configure(home, podman.image)
    llm.push(
        # run again in the new container (as the docstring of backend.py says): says so
        call("execute", "long", command="test -e started && echo ran again || { touch started; sleep 60; }"),
        call("execute", "after", command="echo still here"),
        Reply(text="done"),
    )
    async with spawn_crow(env(llm, home, podman)) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        turn = await command_started(conn, sid, workspace)
        (first,) = ours(podman, sid)
        podman.podman("kill", first)
        assert (await asyncio.wait_for(turn, 60)).stop_reason == "end_turn"
        (second,) = ours(podman, sid)
        assert second != first
    out = results(llm)
    assert out["long"].startswith("[the container was gone") and "ran again" in out["long"], out
    assert "still here" in out["after"]
    assert ours(podman, sid) == []


@pytest.mark.parametrize("closed", [False, True], ids=["live", "closed"])
async def test_a_loaded_session_has_one_container(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any, closed: bool
) -> None:
    configure(home, podman.image)
    two_turns = (
        call("execute", "mark", command="echo kept > /tmp/marker; hostname"),
        Reply(text="one"),
        call("execute", "look", command="cat /tmp/marker; hostname"),
        Reply(text="two"),
    )
    llm.push(*two_turns)
    async with spawn_crow(env(llm, home, podman), unstable=True) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
        (first,) = ours(podman, sid)
        if closed:
            await raw_request(conn, "session/close", {"sessionId": sid})
            assert ours(podman, sid) == []
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
        now = ours(podman, sid)
        assert len(now) == 1, now
        assert (now == [first]) == (not closed)  # a live session's is reused
    out = results(llm)
    assert ("kept" in out["look"]) == (now == [first]), out
    assert ours(podman, sid) == []


async def command_started(conn: Any, sid: str, workspace: Path) -> asyncio.Task[Any]:
    """The prompt, running until its command has touched `started` in the workspace."""
    turn = asyncio.create_task(prompt(conn, sid))
    await asyncio.to_thread(wait_until, (workspace / "started").exists, "the command runs")
    return turn


def made_inside(podman: Any, sid: str, name: str) -> bool:
    """Whether the session's container exists and holds `name` in its workdir."""
    found = ours(podman, sid)
    return bool(found) and podman.podman("exec", found[0], "test", "-e", name, check=False).returncode == 0


async def test_crow_killed_mid_turn_in_copy_mode_loses_the_unsynced_changes_and_its_container(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any
) -> None:
    configure(home, podman.image, sync="copy")
    (workspace / "a.txt").write_text("from the host\n")
    llm.push(call("execute", "long", command="echo made in the container > b.txt; sleep 60"))
    async with spawn_crow(env(llm, home, podman)) as (conn, proc, _client):
        sid = await start(conn, workspace)
        turn = asyncio.create_task(prompt(conn, sid))
        await asyncio.to_thread(wait_until, lambda: made_inside(podman, sid, "b.txt"), "the command wrote")
        proc.kill()
        await proc.wait()
        turn.cancel()
    assert len(ours(podman, sid)) == 1  # SIGKILL: left behind, with b.txt in it
    async with spawn_crow(env(llm, home, podman)) as (conn, _proc, _client):
        await start(conn, workspace)
        await asyncio.to_thread(wait_until, lambda: ours(podman, sid) == [], "the orphan is removed")
    assert not (workspace / "b.txt").exists()  # never copied back: lost with the container


@pytest.mark.parametrize("delay", [0.1, 0.5, 1.2])
async def test_stdin_closed_while_the_first_call_makes_the_container_leaves_none(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any, delay: float
) -> None:
    configure(home, podman.image, sync="copy")
    llm.push(call("execute", "first", command="sleep 30"))
    async with spawn_crow(env(llm, home, podman)) as (conn, proc, _client):
        sid = await start(conn, workspace)
        turn = asyncio.create_task(prompt(conn, sid))
        await asyncio.to_thread(llm.wait_for_requests, 1, 30)
        await asyncio.sleep(delay)  # from the model's answer: the container being made
        proc.stdin.close()
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        turn.cancel()
    assert ours(podman, sid) == []


@pytest.mark.parametrize("user,project", [("docker", "local"), ("local", "docker")])
async def test_a_trusted_crow_yaml_switching_the_backend_governs_the_first_call(
    llm: ScriptedLLM, home: Path, podman: Any, tmp_path: Path, user: str, project: str
) -> None:
    from tests.test_e2e_trust import TrustClient, make_repo

    if user == "docker":
        configure(home, podman.image)
        backend: dict[str, Any] = {"type": "local"}
    else:
        backend = {"type": "docker", "image": podman.image}
    root, _sub = make_repo(tmp_path, {"backend": backend})
    where = "test -e /run/.containerenv && echo inside || echo outside"
    llm.push(call("execute", "where", command=where), Reply(text="done"))
    client = TrustClient("allow_once")
    async with spawn_crow(env(llm, home, podman, CROW_SANDBOX="off"), client=client, cwd=root) as (
        conn,
        _p,
        _c,
    ):
        sid = await start(conn, root)
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
        assert len(ours(podman, sid)) == (project == "docker")
    assert len(client.questions) == 1
    assert results(llm)["where"].startswith("inside" if project == "docker" else "outside")
    assert ours(podman, sid) == []


async def test_copy_mode_a_cancelled_turns_changes_come_back_at_its_end(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any
) -> None:
    configure(home, podman.image, sync="copy")
    llm.push(call("execute", "long", command="echo made in the container > b.txt; sleep 60"))
    async with spawn_crow(env(llm, home, podman)) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        turn = asyncio.create_task(prompt(conn, sid))
        await asyncio.to_thread(wait_until, lambda: made_inside(podman, sid, "b.txt"), "the command wrote")
        await conn.cancel(session_id=sid)
        assert (await asyncio.wait_for(turn, 15)).stop_reason == "cancelled"
        assert (workspace / "b.txt").read_text() == "made in the container\n"
        (cid,) = ours(podman, sid)
        in_container(podman, cid, "echo after the turn > c.txt")  # only a close brings it back
    assert (workspace / "c.txt").read_text() == "after the turn\n"


@pytest.mark.parametrize("delay", [0.05, 0.3, 0.8, 1.5])
async def test_a_session_closed_while_its_first_call_makes_the_container_leaves_none(
    llm: ScriptedLLM, home: Path, workspace: Path, podman: Any, delay: float
) -> None:
    configure(home, podman.image, sync="copy")
    llm.push(call("execute", "first", command="sleep 30"))
    async with spawn_crow(env(llm, home, podman), unstable=True) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        turn = asyncio.create_task(prompt(conn, sid))
        await asyncio.to_thread(llm.wait_for_requests, 1, 30)
        await asyncio.sleep(delay)  # from the model's answer: the container being made
        await asyncio.wait_for(raw_request(conn, "session/close", {"sessionId": sid}), 30)
        await asyncio.wait_for(turn, 15)
        assert ours(podman, sid) == []
        await asyncio.sleep(3)  # a creation still under way would show now
        assert ours(podman, sid) == []
