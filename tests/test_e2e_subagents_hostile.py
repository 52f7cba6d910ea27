"""End to end: a subagent attacked from its parent's side (builtin_hooks/subagents.py,
builtin_hooks/permissions.py): the user changing the parent's mode while a child runs, and
a cancel at the child's last moments."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import anyio
import anyio.from_thread
import anyio.lowlevel
import pytest

from crow import Agent, Message, SubagentStarted
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
