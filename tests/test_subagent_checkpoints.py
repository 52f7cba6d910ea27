"""A subagent's file changes belong to the parent's turn that ran it: `/undo` of that turn
puts them back (builtin_hooks/checkpoints.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crow import Agent, Message
from crow.config import Config
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec

pytestmark = pytest.mark.anyio


async def _ignore(event: Any) -> None:
    return None


async def test_undo_of_the_parents_turn_puts_back_what_its_subagent_changed(
    llm: ScriptedLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", llm.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    work = tmp_path / "work"
    work.mkdir()
    (work / "app.py").write_text("print('old')\n")
    edit = ToolCallSpec("edit_file", {"path": "app.py", "old_text": "old", "new_text": "new"})
    created = ToolCallSpec("write_file", {"path": "notes.md", "content": "by the child\n"})
    llm.rule(lambda r: "CHILD" in r.last_user_text, Reply(tool_calls=[edit, created]), times=1)
    llm.rule(
        lambda r: "CHILD" in str(r.messages[1:2]) and r.messages[-1]["role"] == "tool", Reply(text="edited")
    )
    llm.push(
        Reply(tool_calls=[ToolCallSpec("task", {"description": "Edit", "prompt": "CHILD: edit app.py"})])
    )
    llm.push(Reply(text="parent done"))

    async with Agent(Config(model="openai:scripted", home=tmp_path / "home", mode="yolo")) as agent:
        session = agent.create_session(work)
        result = await agent.prompt(session, Message("user", "delegate the edit"), _ignore)
        assert result.stop_reason == "end_turn"
        assert (work / "app.py").read_text() == "print('new')\n"
        assert (work / "notes.md").exists()
        await agent.prompt(session, Message("user", "/undo"), _ignore)
        assert (work / "app.py").read_text() == "print('old')\n"
        assert not (work / "notes.md").exists()
