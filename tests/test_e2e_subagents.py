"""End to end: the `task` tool runs a child agent (builtin_hooks/subagents.py).

The child is a real crow session with its own context, run through the same loop and
hooks against the scripted model server; its events reach the parent's front end wrapped
(`SubagentStarted`, `SubagentEvent`, `SubagentFinished`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crow import Agent, Message, SubagentEvent, SubagentFinished, SubagentStarted
from crow.config import Config
from tests.llm_server import RecordedRequest, Reply, ScriptedLLM, ToolCallSpec

pytestmark = pytest.mark.anyio


@pytest.fixture
def model_env(llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch) -> ScriptedLLM:
    monkeypatch.setenv("OPENAI_BASE_URL", llm.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.delenv("CROW_TRACE", raising=False)
    return llm


def is_child(request: RecordedRequest) -> bool:
    return "task" not in request.tool_names or "CHILD" in request.last_user_text


async def test_a_task_runs_a_child_with_its_own_context_and_returns_its_answer(
    model_env: ScriptedLLM, tmp_path: Path
) -> None:
    llm = model_env
    llm.rule(lambda r: "CHILD" in r.last_user_text, Reply(text="the child found 42"), times=1)
    llm.push(Reply(tool_calls=[ToolCallSpec("task", {"description": "Find it", "prompt": "CHILD: find it"})]))
    llm.push(Reply(text="parent done"))
    events: list[Any] = []

    async def emit(event: Any) -> None:
        events.append(event)

    async with Agent(Config(model="openai:scripted", home=tmp_path / "home", mode="yolo")) as agent:
        session = agent.create_session(tmp_path)
        result = await agent.prompt(session, Message("user", "delegate"), emit)
        assert result.stop_reason == "end_turn"
        child_request = next(r for r in llm.requests if "CHILD" in r.last_user_text)
        # the child's model saw its own prompt, not the parent's
        assert "delegate" not in str(child_request.messages)
        final = llm.requests[-1]
        assert "the child found 42" in str(final.messages)
        started = [e for e in events if isinstance(e, SubagentStarted)]
        assert len(started) == 1 and started[0].description == "Find it"
        assert any(isinstance(e, SubagentEvent) for e in events)
        finished = [e for e in events if isinstance(e, SubagentFinished)]
        assert finished and finished[0].stop_reason == "end_turn"
        child = await agent.store.get_session(started[0].session_id)
        assert child is not None and child.parent_id == session.id
