"""The agent's lifecycle: shared start-up work no waiter can cancel, one Session per id,
nothing left running after a close, no process-wide settings for library users."""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
import uuid
from asyncio.subprocess import PIPE
from pathlib import Path

import acp
import anyio.lowlevel
import pytest

from crow.acp.sessions import CANCELLED, FAILED
from crow.agent import Agent
from crow.config import Config
from crow.errors import SessionError
from crow.loop import CANCEL_GRACE
from crow.messages import human
from crow.tools import ServerSpec, ToolHub
from tests.conftest import CROW, crow_env, spawn_crow
from tests.llm_server import Reply, ScriptedLLM, Stall, ToolCallSpec
from tests.test_acp_wire import read_frames, request
from tests.test_drills import wait_until
from tests.test_e2e_sessions import long_history, open_session, running
from tests.test_startup import run_python

pytestmark = pytest.mark.anyio


async def test_an_early_cancel_leaves_start_up_work_to_the_others(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """A prompt cancelled while it waits for the warm-up and its session's tools cancels
    only itself: the same session and a new one still answer."""
    llm.default = lambda req: Reply(text=f"re: {req.last_user_text}")
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        first = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("one")]))
        await asyncio.sleep(0.03)  # the warm-up (MCP import, hooks, store) takes far longer
        await conn.cancel(session_id=sid)
        assert (await asyncio.wait_for(first, 20)).stop_reason == "cancelled"
        assert not llm.requests, "the cancelled prompt reached the model"
        again = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[acp.text_block("two")]), 20)
        other = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        third = await asyncio.wait_for(conn.prompt(session_id=other, prompt=[acp.text_block("three")]), 20)
    assert again.stop_reason == third.stop_reason == "end_turn"
    assert client.text(sid) == "re: two" and client.text(other) == "re: three"


def marked_server(marker: str) -> ServerSpec:
    """The todos MCP server over stdio, its command line marked (it ignores the argument)."""
    return ServerSpec(marker, "stdio", command=sys.executable, args=["-m", "mcp_servers.todos", marker])


def agent_in(home: Path) -> Agent:
    return Agent(Config(model="openai:scripted", home=home), builtin_hooks=False)


async def stored_session(home: Path, workspace: Path) -> str:
    async with agent_in(home) as agent:
        session = agent.create_session(workspace)
        await agent.session_ready(session)
        await session.add(human("remember me"))
        return session.id


async def test_two_concurrent_restores_make_one_session(home: Path, workspace: Path) -> None:
    sid = await stored_session(home, workspace)
    marker = f"crow-restore-{uuid.uuid4().hex}"
    async with agent_in(home) as agent:
        (loaded, transcript), resumed = await asyncio.gather(
            agent.load_session(sid, [marked_server(marker)]),
            agent.resume_session(sid, [marked_server(marker)]),
        )
        assert loaded is resumed is agent.sessions[sid]
        assert [m.content for m in transcript] == ["remember me"]
        await agent.session_ready(loaded)
        # type(), not isinstance(): isinstance asks a dead weakref.proxy for its
        # __class__, which raises ReferenceError (CI hit one left by another test).
        hubs = [o for o in gc.get_objects() if type(o) is ToolHub]
        assert hubs == [loaded.tools], "a second restore built a second ToolHub"
        assert len(running(marker)) == 1, "the editor's MCP server was started twice"
    assert not running(marker)


async def test_closing_a_session_during_the_warm_up_leaves_the_others_ready(
    home: Path, workspace: Path
) -> None:
    async with agent_in(home) as agent:
        closed = agent.create_session(workspace)
        kept = agent.create_session(workspace)
        waiter = asyncio.create_task(agent.session_ready(closed))
        await anyio.lowlevel.checkpoint()  # both setups are waiting for the warm-up
        await agent.close_session(closed.id)
        with pytest.raises(SessionError, match=f"session {closed.id} was closed"):
            await waiter
        await agent.session_ready(kept)
        assert kept.tools is not None and kept.tools.specs() == []


@pytest.mark.parametrize("moment", ["at once", "while its MCP server starts"])
async def test_aclose_leaves_nothing_running(home: Path, workspace: Path, moment: str) -> None:
    before = asyncio.all_tasks()
    marker = f"crow-aclose-{uuid.uuid4().hex}"
    agent = agent_in(home)
    agent.create_session(workspace, [marked_server(marker)])
    if moment != "at once":
        assert await wait_until(lambda: running(marker))
    await agent.aclose()
    assert asyncio.all_tasks() - before == set()
    assert not running(marker)
    await agent.aclose()  # idempotent


async def test_aclose_closes_the_sessions_side_by_side(
    home: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each session stops its own tools (a container's removal takes ~0.2 s): one after the
    # other, ten sessions outlasted the 2 s an editor gives crow to exit, and the containers
    # of those not reached were left behind.
    closing, most = 0, 0
    real = ToolHub.aclose

    async def slow(self: ToolHub, grace: float = 5.0) -> None:
        nonlocal closing, most
        closing += 1
        most = max(most, closing)
        await anyio.sleep(0.05)
        await real(self, grace)
        closing -= 1

    monkeypatch.setattr(ToolHub, "aclose", slow)
    agent = agent_in(home)
    sessions = [agent.create_session(workspace) for _ in range(4)]
    for session in sessions:
        await agent.session_ready(session)
    await agent.aclose()
    assert most == 4 and not agent.sessions
    assert all(s.tools is None for s in sessions)


async def test_close_session_stops_its_setup_and_its_server(home: Path, workspace: Path) -> None:
    marker = f"crow-close-{uuid.uuid4().hex}"
    async with agent_in(home) as agent:
        session = agent.create_session(workspace, [marked_server(marker)])
        assert await wait_until(lambda: running(marker))  # connecting: the setup is under way
        waiter = asyncio.create_task(agent.session_ready(session))
        await anyio.lowlevel.checkpoint()  # waiting
        await agent.close_session(session.id)
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith(("crow.session", "mcp:"))]
        assert not running(marker)
        with pytest.raises(SessionError, match="was closed"):
            await waiter
        assert session.id not in agent.sessions and session.tools is None


def test_a_new_session_creates_no_anyio_object(tmp_path: Path) -> None:
    """The first anyio primitive imports anyio's backend (~17 ms): not on the way to the
    `initialize` and `session/new` answers, where the warm-up and a session's setup start.
    Nor is slash-command discovery: 200 prompt files in the workspace are not even listed."""
    commands = tmp_path / ".crow" / "commands"
    commands.mkdir(parents=True)
    for i in range(200):
        (commands / f"c{i}.md").write_text(f"---\ndescription: c{i}\n---\nDo {i}\n")
    run_python(
        f"""
        import asyncio, sys
        from crow.agent import Agent
        from crow.config import Config

        async def main():
            agent = Agent(Config(home={str(tmp_path / "home")!r}), builtin_hooks=False)
            agent.warm_up()
            agent.create_session({str(tmp_path)!r})
            assert "anyio._backends._asyncio" not in sys.modules
            assert "crow.prompt_files" not in sys.modules and "yaml" not in sys.modules
            await agent.aclose()

        asyncio.run(main())
        """
    )


async def test_a_client_gone_mid_turn_lets_crow_exit_at_once(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """stdin closes while a tool call waits for the user's permission: the cancelled turn
    settles its history without waiting on a wire nobody writes any more (it waited out
    CANCEL_GRACE, 5 s), crow exits 0, stdout holds only JSON-RPC, and the editor's MCP
    server is stopped."""
    marker = f"crow-gone-{uuid.uuid4().hex}"
    llm.push(Reply(tool_calls=[ToolCallSpec("write_file", {"path": "a.txt", "content": "x"})]))
    server = {
        "name": "marked",
        "command": sys.executable,
        "args": ["-m", "mcp_servers.todos", marker],
        "env": [],
    }
    with open(home / "stderr.log", "wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *CROW, stdin=PIPE, stdout=PIPE, stderr=err, env=crow_env(llm, home)
        )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(request(1, "initialize", {"protocolVersion": 1}))
        proc.stdin.write(request(2, "session/new", {"cwd": str(workspace), "mcpServers": [server]}))
        frames = await read_frames(proc.stdout, 2)
        sid = frames[1]["result"]["sessionId"]
        proc.stdin.write(
            request(3, "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]})
        )
        while not any(f.get("method") == "session/request_permission" for f in frames):
            frames += await read_frames(proc.stdout, 1, timeout=30)
        assert running(marker)
        proc.stdin.close()
        started = time.monotonic()
        rest = await asyncio.wait_for(proc.stdout.read(), 30)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        took = time.monotonic() - started
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert took < CANCEL_GRACE / 2, f"crow took {took:.1f} s to exit after its client hung up"
    assert all(json.loads(line) for line in rest.splitlines() if line.strip())
    assert await wait_until(lambda: not running(marker), timeout=2)


BROKEN = "hook 'crow_exploding:Hook': importing crow_exploding raised RuntimeError: exploded at import"


def exploding_plugin(home: Path) -> dict[str, str]:
    """A user config naming a hook whose module raises at import; the env to find it."""
    folder = home / "plugins"
    folder.mkdir()
    (folder / "crow_exploding.py").write_text("raise RuntimeError('exploded at import')\n")
    (home / "config.yaml").write_text("hooks:\n  extra: ['crow_exploding:Hook']\n")
    return {"PYTHONPATH": str(folder)}


async def test_a_broken_plugin_fails_each_prompt_with_its_name(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """Not "Internal error": every prompt, in every session, and every request that needs
    the warm-up, is told which hook broke it and how; the traceback is logged once."""
    env = crow_env(llm, home, **exploding_plugin(home))
    async with spawn_crow(env) as (conn, _proc, _client):
        await conn.initialize(protocol_version=1)
        for _ in range(2):
            sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            with pytest.raises(acp.RequestError) as refused:
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[acp.text_block("hi")]), 30)
            assert (refused.value.code, str(refused.value)) == (FAILED, BROKEN)
        for request in (
            conn.set_session_mode(session_id=sid, mode_id="yolo"),
            conn.set_config_option(config_id="mode", session_id=sid, value="yolo"),
            conn.list_sessions(),
        ):
            with pytest.raises(acp.RequestError) as refused:
                await asyncio.wait_for(request, 30)
            assert (refused.value.code, str(refused.value)) == (FAILED, BROKEN)
    assert not llm.requests
    log = (home / "stderr.log").read_text()
    assert log.count("the warm-up failed") == 1 and "Unhandled error" not in log


class Trusting:
    """A front end that trusts the project at the question (`ask_choice`), asks nothing else."""

    can_read = can_write = can_terminal = False

    async def ask_choice(self, title: str, text: str, options: object, **kwargs: object) -> str:
        return "allow_once"


async def test_a_cancel_while_a_trusted_project_reconnects_the_tools_loses_nothing(
    llm: ScriptedLLM, home: Path, tmp_path: Path
) -> None:
    """The project trusted at the first prompt sets an environment, so the session's tool
    servers are built again for it; a cancel while they start must neither leave the old
    ones running nor the session with no tools at its next prompt."""
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "crow.yaml").write_text("environment: {set: {FROM_PROJECT: 'yes'}}\n")
    marker = f"crow-retrust-{uuid.uuid4().hex}"
    config = Config(model="openai:scripted", home=home, providers={"openai": {"base_url": llm.base_url}})
    llm.default = lambda req: Reply(text="ok")
    async with Agent(config, builtin_hooks=False) as agent:
        session = agent.create_session(repo, [marked_server(marker)])
        session.client = Trusting()
        await agent.session_ready(session)
        first = asyncio.create_task(agent.prompt(session, human("one"), _ignore))
        assert await wait_until(lambda: len(running(marker)) == 2), "the tools were not built again"
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await agent.prompt(session, human("two"), _ignore)
        assert [t["function"]["name"] for t in llm.requests[-1].body["tools"]] == ["write_todos"]
        assert len(running(marker)) == 1, "the tool servers built for the user's config still run"
    assert not running(marker)


async def _ignore(event: object) -> None:
    pass


async def test_session_cancel_stops_crow_compact_with_a_cancelled_error(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """session/cancel during `crow.compact`'s summary request: the answer is ACP's "request
    cancelled" (it was an UnboundLocalError, "Internal error"), and the session goes on."""
    long_history(llm, 4)
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await open_session(conn, workspace)
        for i in range(4):
            await conn.prompt(session_id=sid, prompt=[acp.text_block(f"q{i}")])
        llm.push(Stall(seconds=20))
        compacting = asyncio.create_task(conn.ext_method("crow.compact", {"sessionId": sid}))
        assert await wait_until(lambda: len(llm.requests) == 5)  # the summary request is out
        await conn.cancel(session_id=sid)
        with pytest.raises(acp.RequestError) as refused:
            await asyncio.wait_for(compacting, 20)
        assert (refused.value.code, str(refused.value)) == (CANCELLED, "compaction cancelled")
        llm.push(Reply(text="still here"))
        done = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[acp.text_block("next")]), 20)
    assert done.stop_reason == "end_turn" and client.text(sid).endswith("still here")


async def test_a_session_closed_while_it_loads_stays_closed(home: Path, workspace: Path) -> None:
    """session/close sent while a session/load of the id is under way: the load ends first,
    then the close; the session does not come back afterwards with its MCP servers running."""
    sid = await stored_session(home, workspace)
    marker = f"crow-close-load-{uuid.uuid4().hex}"
    async with agent_in(home) as agent:
        loading = asyncio.create_task(agent.load_session(sid, [marked_server(marker)]))
        await anyio.lowlevel.checkpoint()  # the load is under way: waiting for the warm-up
        await agent.close_session(sid)
        loaded, _transcript = await loading
        assert sid not in agent.sessions and loaded.tools is None
        assert await wait_until(lambda: not running(marker), timeout=5)


async def test_run_in_background_from_the_loop_or_a_hook_factorys_thread_ends_with_the_agent(
    home: Path,
) -> None:
    """`Agent.run_in_background`: hook factories run in a worker thread (plugins.install),
    and their housekeeping still belongs to the agent: cancelled and awaited at close."""
    agent = Agent(Config(home=home))
    ran, stopped = anyio.Event(), []

    async def forever() -> None:
        ran.set()
        try:
            await anyio.sleep_forever()
        finally:
            stopped.append("forever")

    async def once() -> None:
        stopped.append("once")

    done = agent.run_in_background("t.once", once)
    await anyio.to_thread.run_sync(agent.run_in_background, "t.forever", forever)
    await done.wait()
    await ran.wait()
    await agent.aclose()
    assert stopped == ["once", "forever"]
