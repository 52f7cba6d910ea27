"""End to end: a subagent attacked from around it (builtin_hooks/subagents.py,
builtin_hooks/permissions.py, builtin_hooks/plan.py, the store's locks): the user changing
the parent's mode while a child runs, a task sent beside exit_plan_mode, a running child's
session loaded, prompted or deleted by its id, a broken agent file read by every child, and
a cancel landing in the child's last store write."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import pytest

from crow import Agent, Message, Notice, SubagentEvent, SubagentStarted
from crow.config import HooksConfig
from crow.errors import SessionBusy
from crow.messages import validate
from tests.llm_server import RecordedRequest, Reply, ScriptedLLM, ToolCallSpec
from tests.test_e2e_subagents import Events, answered, config, is_child, model_env, task, tool_results

pytestmark = pytest.mark.anyio
__all__ = ["model_env"]  # the fixture, shared


@pytest.mark.parametrize("stricter", ["read_only", "plan"])
async def test_a_parent_made_stricter_while_its_child_runs_holds_the_child_too(
    model_env: ScriptedLLM, tmp_path: Path, stricter: str
) -> None:
    """The user sees a yolo child about to write and switches the session to a stricter
    mode: the child's next calls are judged by it, not by the mode it started in."""
    llm = model_env
    token = anyio.lowlevel.current_token()
    holder: dict[str, object] = {}
    write = ToolCallSpec("write_file", {"path": "x.txt", "content": "written"}, id="w1")

    def child(request: RecordedRequest) -> Reply:
        if answered(request):
            return Reply(text="child done")
        # the editor's session/set_mode, while the child's model is thinking
        anyio.from_thread.run(partial(holder["parent"].save, mode=stricter), token=token)  # type: ignore[attr-defined]
        return Reply(tool_calls=[write])

    llm.rule(is_child, child)
    llm.push(Reply(tool_calls=[task("t1", "CHILD write")]), Reply(text="parent done"))
    events = Events()
    async with Agent(config(tmp_path / "home", mode="yolo")) as agent:
        session = holder["parent"] = agent.create_session(tmp_path)
        await agent.prompt(session, Message("user", "delegate"), events)
        assert session.mode == stricter
        assert not (tmp_path / "x.txt").exists()
        (started,) = events.of(SubagentStarted)
        _, transcript = await agent.load_session(started.session_id)
        refused = tool_results(transcript)["w1"]
        assert refused.is_error and "not" in refused.content


@asynccontextmanager
async def child_held(llm: ScriptedLLM, tmp_path: Path) -> AsyncIterator[tuple[Agent, Any, SubagentStarted]]:
    """A parent's prompt running one task whose child waits on its model call for the
    block's duration: yields (agent, the parent session, the child's SubagentStarted)."""
    asked, release = threading.Event(), threading.Event()

    def child(request: RecordedRequest) -> Reply:
        asked.set()
        release.wait(20)
        return Reply(text="child done")

    llm.rule(is_child, child, times=1)
    llm.push(Reply(tool_calls=[task("t1", "CHILD slow")]), Reply(text="parent done"))
    events = Events()
    async with Agent(config(tmp_path / "home")) as agent:
        session = agent.create_session(tmp_path)
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.prompt, session, Message("user", "delegate"), events)
            await anyio.to_thread.run_sync(asked.wait, 20)
            (started,) = events.of(SubagentStarted)
            try:
                yield agent, session, started
            finally:
                release.set()


async def test_a_running_childs_session_loaded_again_is_busy_not_a_second_writer(
    model_env: ScriptedLLM, tmp_path: Path
) -> None:
    """An editor loads a running subagent's session by its id (from the tool call's meta)
    and prompts it: the child's turn holds it, as another process's would."""
    async with child_held(model_env, tmp_path) as (agent, _, started):
        loaded, _ = await agent.load_session(started.session_id)
        with pytest.raises(SessionBusy):
            await agent.prompt(loaded, Message("user", "me too"), Events())
    async with Agent(config(tmp_path / "home")) as agent:
        _, transcript = await agent.load_session(started.session_id)
    assert [m.content for m in transcript if m.role == "user"] == ["CHILD slow"]
    validate(transcript)


async def test_a_running_childs_session_is_not_deleted_under_it(
    model_env: ScriptedLLM, tmp_path: Path
) -> None:
    """Deleting a subagent's session (by its id, from an editor) while it runs is refused,
    as it is while another process runs a turn there: else the child's turn fails on a
    session gone under it and the parent reads a failure the user caused."""
    async with child_held(model_env, tmp_path) as (agent, session, started):
        with pytest.raises(SessionBusy):
            await agent.delete_session(started.session_id)
    result = tool_results(list(session.messages))["t1"]
    assert not result.is_error and result.content.startswith("child done")
    async with Agent(config(tmp_path / "home")) as agent:
        _, transcript = await agent.load_session(started.session_id)
        assert [m.content for m in transcript if m.role == "assistant"] == ["child done"]
        await agent.delete_session(session.id)  # once it is over, with its parent
        assert await agent.store.get_session(started.session_id) is None


async def test_a_skipped_agent_file_is_told_once_for_the_whole_tree(
    model_env: ScriptedLLM, tmp_path: Path
) -> None:
    """With max_depth 2 each child is offered `task` too, and reads the agent files again:
    a broken file is still told once, not once more per child."""
    llm = model_env
    agents = tmp_path / ".crow" / "agents"
    agents.mkdir(parents=True)
    (agents / "broken.md").write_text("---\nname: broken\nmode: sideways\n---\nYou are broken.\n")
    llm.rule(is_child, Reply(text="child answer"))
    llm.push(Reply(tool_calls=[task("t1", "CHILD one"), task("t2", "CHILD two")]), Reply(text="parent done"))
    events = Events()
    hooks = HooksConfig(settings={"subagents": {"max_depth": 2}})
    async with Agent(config(tmp_path / "home", hooks=hooks)) as agent:
        session = agent.create_session(tmp_path)
        await agent.prompt(session, Message("user", "delegate"), events)
    seen = [e.event if isinstance(e, SubagentEvent) else e for e in events]
    told = [e for e in seen if isinstance(e, Notice) and e.title == "Agent definitions skipped"]
    assert len(told) == 1, told


class ApprovesPlans:
    """A front end whose user approves every plan with "Yes, and auto-accept edits"."""

    can_read = can_write = can_terminal = can_elicit = False

    async def ask(self, call: Any, options: Any, **_: Any) -> str:
        return "accept_edits"

    async def ask_permission(self, call: Any, **_: Any) -> str | None:
        return None


async def test_a_task_sent_beside_the_plan_runs_as_plan_mode_whenever_the_approval_lands(
    model_env: ScriptedLLM, tmp_path: Path
) -> None:
    """A call written in the same reply as exit_plan_mode was written before anyone
    approved the plan: a task among them must not start a child that edits."""
    llm = model_env
    write = ToolCallSpec("write_file", {"path": "x.txt", "content": "early"}, id="w1")
    llm.rule(is_child, lambda r: Reply(text="child done") if answered(r) else Reply(tool_calls=[write]))
    plan = ToolCallSpec("exit_plan_mode", {"plan": "1. write x.txt"}, id="p1")
    llm.push(Reply(tool_calls=[plan, task("t1", "CHILD write x.txt")]), Reply(text="parent done"))
    async with Agent(config(tmp_path / "home", mode="plan")) as agent:
        session = agent.create_session(tmp_path)
        session.client = ApprovesPlans()
        events = Events()
        await agent.prompt(session, Message("user", "plan it"), events)
        assert session.mode == "accept_edits"  # approved
        assert not (tmp_path / "x.txt").exists()
        refused = tool_results(list(session.messages))["t1"]
        assert refused.is_error and "same reply as exit_plan_mode" in refused.content


class Checkpointing(Events):
    """A front end that awaits before it takes an event (as the ACP adapter's write does)."""

    async def __call__(self, event: Any) -> None:
        await anyio.lowlevel.checkpoint()
        self.append(event)


async def test_a_cancel_landing_during_the_childs_last_store_write_still_finishes_it(
    model_env: ScriptedLLM, tmp_path: Path
) -> None:
    """The user cancels just as the child's turn ends: while it releases its session (its
    last store write, shielded). The front end still hears the child finish, before the
    task call ends, and every history is valid."""
    llm = model_env
    llm.rule(is_child, Reply(text="child done"), times=1)
    llm.push(Reply(tool_calls=[task("t1", "CHILD quick")]), Reply(text="parent done"))
    events = Checkpointing()
    async with Agent(config(tmp_path / "home")) as agent:
        session = agent.create_session(tmp_path)
        await agent.ready()
        store = agent.store
        unlock = store.unlock_session
        with anyio.CancelScope() as scope:

            async def cancelled_meanwhile(session_id: str) -> None:
                if session_id != session.id:  # the child's
                    scope.cancel()
                await unlock(session_id)

            store.unlock_session = cancelled_meanwhile  # type: ignore[method-assign]
            await agent.prompt(session, Message("user", "delegate"), events)
        store.unlock_session = unlock  # type: ignore[method-assign]
        assert scope.cancelled_caught
        (started,) = events.of(SubagentStarted)
        kinds = [type(e).__name__ for e in events if type(e).__name__ in ("SubagentFinished", "ToolCallEnd")]
        assert kinds[:1] == ["SubagentFinished"], kinds
        assert "ToolCallEnd" in kinds
        _, parent = await agent.load_session(session.id)
        _, child = await agent.load_session(started.session_id)
        validate(parent)
        validate(child)


class AllowsWhenReleased:
    """A front end whose user answers a permission question ("allow once") when released."""

    can_read = can_write = can_terminal = can_elicit = False

    def __init__(self) -> None:
        self.asked, self.release = anyio.Event(), anyio.Event()

    async def ask_permission(self, call: Any, *, options: Any = (), **_: Any) -> str | None:
        self.asked.set()
        await self.release.wait()
        return next(c.id for c in options if c.kind == "allow_once")


async def test_loading_a_child_while_its_tool_call_waits_does_not_answer_that_call(
    model_env: ScriptedLLM, tmp_path: Path
) -> None:
    """A load repairs a session a crash left with unanswered tool calls, holding it. A
    running child's open call is not such a call: its real result comes, and its history
    must not get a made-up "interrupted" one beside it."""
    llm = model_env
    write = ToolCallSpec("write_file", {"path": "x.txt", "content": "written"}, id="w1")
    llm.rule(is_child, lambda r: Reply(text="child done") if answered(r) else Reply(tool_calls=[write]))
    llm.push(Reply(tool_calls=[task("t1", "CHILD write")]), Reply(text="parent done"))
    client = AllowsWhenReleased()
    events = Events()
    async with Agent(config(tmp_path / "home", mode="ask")) as agent:
        session = agent.create_session(tmp_path)
        session.client = client
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.prompt, session, Message("user", "delegate"), events)
            await client.asked.wait()
            (started,) = events.of(SubagentStarted)
            await agent.load_session(started.session_id)  # an editor opening it
            client.release.set()
        assert (tmp_path / "x.txt").read_text() == "written"
        _, transcript = await agent.load_session(started.session_id)
        validate(transcript)
        assert [m.content for m in transcript if m.role == "tool"] == [tool_results(transcript)["w1"].content]
