"""A subagent runs inside its parent's prompt: it gets the memory (AGENTS.md) and the skills
catalog that prompt loaded, without reading them again (builtin_hooks/memory.py, skills.py).
Each model request of a child otherwise costs a worker-thread hop and a folder walk on the
one event loop that every child of a reply shares."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from builtin_hooks import memory as memory_mod
from builtin_hooks import skills as skills_mod
from crow import Agent, Message
from crow.config import Config
from tests.llm_server import Reply, ScriptedLLM
from tests.test_e2e_subagents import is_child, model_env, task

pytestmark = pytest.mark.anyio
__all__ = ["model_env"]  # the fixture, shared


def tasks(n: int) -> Reply:
    return Reply(tool_calls=[task(f"t{i}", f"CHILD {i}", f"Part {i}") for i in range(n)])


async def sink(event: Any) -> None:
    pass


def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / ".crow" / "skills" / "csv").mkdir(parents=True)
    (ws / "AGENTS.md").write_text("The code word is ZEBRA.\n")
    (ws / ".crow" / "skills" / "csv" / "SKILL.md").write_text(
        "---\nname: csv-analyzer\ndescription: Analyze CSV files\n---\nDo it.\n"
    )
    return ws


async def test_children_get_the_parents_memory_and_skills_read_once_per_prompt(
    model_env: ScriptedLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm = model_env
    ws = workspace(tmp_path)
    loads: list[Path] = []
    walks: list[list[Path]] = []
    load, discover = memory_mod.MemoryHook.load, skills_mod.discover

    def counted_load(self: memory_mod.MemoryHook, cwd: Path) -> str:
        loads.append(cwd)
        return load(self, cwd)

    def counted_discover(roots: list[Path]) -> list[skills_mod.Skill]:
        walks.append(roots)
        return discover(roots)

    monkeypatch.setattr(memory_mod.MemoryHook, "load", counted_load)
    monkeypatch.setattr(skills_mod, "discover", counted_discover)
    llm.rule(is_child, Reply(text="child answer"), times=3)
    llm.push(tasks(3), Reply(text="parent done"))
    async with Agent(Config(model="openai:scripted", home=tmp_path / "home", mode="yolo")) as agent:
        session = agent.create_session(ws)
        result = await agent.prompt(session, Message("user", "delegate"), sink)
        assert result.stop_reason == "end_turn"
    children = [r for r in llm.requests if is_child(r)]
    parent = next(r for r in llm.requests if not is_child(r))
    assert len(children) == 3
    for request in [parent, *children]:
        assert "The code word is ZEBRA." in request.system
        assert "csv-analyzer: Analyze CSV files" in request.system
    assert len(loads) == 1, f"the memory was read {len(loads)} times for one prompt"
    assert len(walks) == 1, f"the skills were looked for {len(walks)} times for one session"


async def test_the_next_prompt_reads_changed_memory_for_parent_and_children(
    model_env: ScriptedLLM, tmp_path: Path
) -> None:
    llm = model_env
    ws = workspace(tmp_path)
    llm.rule(is_child, Reply(text="child answer"), times=2)
    llm.push(tasks(1), Reply(text="first done"), tasks(1), Reply(text="second done"))
    async with Agent(Config(model="openai:scripted", home=tmp_path / "home", mode="yolo")) as agent:
        session = agent.create_session(ws)
        await agent.prompt(session, Message("user", "first"), sink)
        (ws / "AGENTS.md").write_text("The code word is now YAK, a longer word.\n")
        await agent.prompt(session, Message("user", "second"), sink)
    children = [r for r in llm.requests if is_child(r)]
    assert "ZEBRA" in children[0].system and "ZEBRA" not in children[1].system
    assert "The code word is now YAK" in children[1].system
