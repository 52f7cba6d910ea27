"""Checkpoints under stress: two sessions sharing one workspace (and so one shadow git
dir), and a turn that never reached its closing snapshot. Real crow turns (every builtin
hook, the in-process filesystem server) driven by the scripted model server."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from crow.agent import Agent
from crow.checkpoints import restore_turns, session_dir
from crow.events import Notice
from crow.messages import human
from tests.llm_server import RecordedRequest, Reply, ScriptedLLM, ToolCallSpec
from tests.test_checkpoints import Turn, agent, session_of, tool, turn, ws  # noqa: F401 (fixtures)

pytestmark = pytest.mark.anyio


async def test_two_sessions_on_one_workspace_run_commands_at_once(
    agent: Agent,  # noqa: F811
    ws: Path,  # noqa: F811
    llm: ScriptedLLM,
) -> None:
    """Both sessions snapshot the workspace in the same git dir at the same moments: each
    snapshot lands (git refuses a second `git add` while the first holds the index lock),
    so neither session is told its commands are not checkpointed, and each undoes its own."""
    for i in range(300):
        (ws / f"f{i}.txt").write_text("x" * i)
    ids = itertools.count()

    def step(req: RecordedRequest) -> Reply:
        if req.messages[-1]["role"] == "tool":
            return Reply(text="done")
        who = req.last_user_text
        command = f"echo {who} >> {who}.txt"
        return Reply(tool_calls=[ToolCallSpec(name="execute", arguments={"command": command}, id=f"x{next(ids)}")])

    llm.rule(lambda req: True, step)
    sessions = [agent.create_session(str(ws)) for _ in range(2)]
    notices: list[Notice] = []

    async def emit(event: Any) -> None:
        if isinstance(event, Notice):
            notices.append(event)

    async def turns(session: Any, who: str) -> None:
        for _ in range(4):
            await agent.run_turn(session, human(who), emit)

    async with anyio.create_task_group() as tg:
        tg.start_soon(turns, sessions[0], "a")
        tg.start_soon(turns, sessions[1], "b")
    assert [n.text for n in notices] == []
    for session, who in zip(sessions, "ab", strict=True):
        last = [m for m in session.messages if m.role == "user"][-1]
        done = await restore_turns(session, [last.id], agent.config.home)
        assert (done.restored, done.skipped) == ((f"{who}.txt",), ())
        assert (ws / f"{who}.txt").read_text() == f"{who}\n" * 3


async def test_a_turn_without_its_closing_snapshot_names_what_is_not_restored(
    agent: Agent,  # noqa: F811
    ws: Path,  # noqa: F811
    turn: Turn,  # noqa: F811
) -> None:
    """crow stopped after the snapshot before the turn's first command and before the one
    when the turn ended (killed, or that snapshot failed): what the commands changed cannot
    be told apart from later changes, so nothing of it is put back, and the answer says so
    rather than "no file changes were recorded"."""
    (ws / "a.txt").write_text("a0\n")
    pid, _ = await turn(Reply(tool_calls=[tool("execute", "x1", command="echo a1 > a.txt")]))
    manifest = session_dir(agent.config.home, session_of(turn).id) / f"{pid}.json"  # type: ignore[operator]
    body = json.loads(manifest.read_text())
    assert body["git"]["before"] and body["git"].pop("after")
    manifest.write_text(json.dumps(body))  # what the checkpoint holds when crow stopped mid-turn
    done = await restore_turns(session_of(turn), [pid], agent.config.home)
    assert done.restored == done.removed == ()
    assert [path for path, _ in done.skipped] == ["(commands' changes)"]
    assert "ended before" in done.skipped[0][1]
    assert (ws / "a.txt").read_text() == "a1\n"
