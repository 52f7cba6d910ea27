"""End to end: agent definitions as the `task` tool uses them (builtin_hooks/subagents.py).

The tool's description lists the agents of the session's folder (and follows changes to
the files); a definition's body is the child's system prompt and its `tools` what the
child's model is offered (a call to another tool is refused, never asked about); its mode
is taken only when stricter than the parent's; its model only when the user chose it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crow import Agent, Message, Notice, SubagentStarted
from crow.config import DEFAULT_SYSTEM_PROMPT
from tests.llm_server import RecordedRequest, Reply, ScriptedLLM, ToolCallSpec
from tests.test_e2e_subagents import (
    Events,
    calls_then_answers,
    config,
    is_child,
    model_env,
    task,
    tool_results,
)

pytestmark = pytest.mark.anyio
__all__ = ["model_env"]  # the fixture, shared


def agent_file(folder: Path, name: str, body: str = "", **meta: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"name: {name}", *(f"{k}: {v}" for k, v in meta.items())]
    path = folder / f"{name}.md"
    path.write_text("---\n" + "\n".join(lines) + "\n---\n" + (body or f"You are {name}.") + "\n")
    return path


def task_spec(request: RecordedRequest) -> dict[str, Any]:
    return next(t["function"] for t in request.tools if t["function"]["name"] == "task")


async def test_the_task_tool_lists_the_folders_agents_and_follows_their_files(
    model_env: ScriptedLLM, tmp_path: Path
) -> None:
    llm = model_env
    ws, other = tmp_path / "ws", tmp_path / "other"
    other.mkdir()
    agents = ws / ".crow" / "agents"
    agent_file(agents, "reviewer", description="Reviews a change for bugs")
    agent_file(agents, "rambler", description="word " * 100)
    llm.default = Reply(text="ok")
    async with Agent(config(tmp_path / "home")) as agent:
        session = agent.create_session(ws)
        await agent.prompt(session, Message("user", "hi"), Events())
        listed = task_spec(llm.requests[-1])["description"]
        assert "- reviewer: Reviews a change for bugs" in listed
        assert "- general-purpose: " in listed
        rambling = next(line for line in listed.splitlines() if line.startswith("- rambler: "))
        assert len(rambling) == len("- rambler: ") + 200 and rambling.endswith("…")
        # a new file shows at the next request; a removed one goes
        agent_file(agents, "tester", description="Runs the tests")
        (agents / "reviewer.md").unlink()
        await agent.prompt(session, Message("user", "again"), Events())
        listed = task_spec(llm.requests[-1])["description"]
        assert "- tester: Runs the tests" in listed and "reviewer" not in listed
        # another folder, its own agents
        elsewhere = agent.create_session(other)
        await agent.prompt(elsewhere, Message("user", "hi"), Events())
        listed = task_spec(llm.requests[-1])["description"]
        assert "tester" not in listed and "- general-purpose: " in listed


async def test_the_listing_is_capped(model_env: ScriptedLLM, tmp_path: Path) -> None:
    llm = model_env
    for i in range(60):
        agent_file(tmp_path / ".crow" / "agents", f"agent{i:02d}", description=f"Agent number {i}")
    llm.default = Reply(text="ok")
    async with Agent(config(tmp_path / "home")) as agent:
        session = agent.create_session(tmp_path)
        await agent.prompt(session, Message("user", "hi"), Events())
        listed = task_spec(llm.requests[-1])["description"]
        assert sum(line.startswith("- ") for line in listed.splitlines()) == 50
        assert listed.endswith("(11 more not listed)")  # 60 and the default


async def test_a_definitions_prompt_and_tools_are_what_the_childs_model_gets(
    model_env: ScriptedLLM, tmp_path: Path
) -> None:
    llm = model_env
    agent_file(
        tmp_path / ".crow" / "agents",
        "reviewer",
        "You review code and report bugs. REVIEWER-PROMPT",
        description="Reviews",
        tools="read_file, grep, NoSuchTool",
    )

    write = ToolCallSpec("write_file", {"path": "x.txt", "content": "no"}, id="w1")  # not offered
    llm.rule(is_child, calls_then_answers(write, answer="reviewed"))
    llm.push(Reply(tool_calls=[task("t1", "CHILD review", agent="reviewer")]), Reply(text="parent done"))
    events = Events()
    async with Agent(config(tmp_path / "home", mode="ask")) as agent:
        session = agent.create_session(tmp_path)
        await agent.prompt(session, Message("user", "delegate"), events)
        first = next(r for r in llm.requests if is_child(r))
        assert first.system.startswith("You review code and report bugs. REVIEWER-PROMPT")
        assert DEFAULT_SYSTEM_PROMPT[:60] not in first.system
        assert sorted(first.tool_names) == ["grep", "read_file"]
        assert not (tmp_path / "x.txt").exists()
        (started,) = events.of(SubagentStarted)
        assert started.name == "reviewer"
        result = tool_results(await agent.store.load_context(started.session_id))["w1"].content
        assert result == (
            "Error: write_file was not offered to this subagent (agent reviewer); it was not run. "
            "Its tools are: grep, read_file."
        )
        assert tool_results(list(session.messages))["t1"].meta["crow/subagent"]["agent"] == "reviewer"


@pytest.mark.parametrize(
    ("parent", "wanted", "child"),
    [("yolo", "read_only", "read_only"), ("ask", "yolo", "ask"), ("plan", "accept_edits", "read_only")],
)
async def test_a_definitions_mode_applies_only_when_stricter(
    model_env: ScriptedLLM, tmp_path: Path, parent: str, wanted: str, child: str
) -> None:
    llm = model_env
    agent_file(tmp_path / ".crow" / "agents", "worker", description="Works", mode=wanted)
    llm.rule(is_child, Reply(text="done"))
    llm.push(Reply(tool_calls=[task("t1", "CHILD work", agent="worker")]), Reply(text="parent done"))
    events = Events()
    async with Agent(config(tmp_path / "home", mode=parent)) as agent:
        session = agent.create_session(tmp_path)
        await agent.prompt(session, Message("user", "delegate"), events)
        (started,) = events.of(SubagentStarted)
        assert (await agent.store.get_session(started.session_id)).mode == child
        assert session.mode == parent


async def test_a_repositorys_agent_cannot_choose_a_model_the_user_did_not(
    model_env: ScriptedLLM, tmp_path: Path
) -> None:
    llm = model_env
    agent_file(tmp_path / ".crow" / "agents", "pricey", description="Costly", model="openai:gpt-4.5-preview")
    agent_file(tmp_path / ".crow" / "agents", "listed", description="Listed", model="openai:mini")
    llm.rule(is_child, Reply(text="done"))
    llm.push(
        Reply(
            tool_calls=[
                task("t1", "CHILD one", agent="pricey"),
                task("t2", "CHILD two", agent="pricey"),
                task("t3", "CHILD three", agent="listed"),
            ]
        ),
        Reply(text="parent done"),
    )
    events = Events()
    async with Agent(config(tmp_path / "home", models=["openai:mini"])) as agent:
        session = agent.create_session(tmp_path)
        await agent.prompt(session, Message("user", "delegate"), events)
    models = {r.last_user_text: r.model for r in llm.requests if is_child(r)}
    assert models == {"CHILD one": "scripted", "CHILD two": "scripted", "CHILD three": "mini"}
    (told,) = [e for e in events if isinstance(e, Notice)]  # once, not per call
    assert told.text == (
        "Agent pricey asks for model openai:gpt-4.5-preview, but it is not one of your configured "
        "models (model, models or model_settings in your crow config), and a project's agent file "
        "may not choose another. It runs on openai:scripted."
    )


async def test_the_users_own_agent_may_choose_its_model(model_env: ScriptedLLM, tmp_path: Path) -> None:
    llm = model_env
    home = tmp_path / "home"
    agent_file(home / "agents", "mine", description="Mine", model="openai:my-model")
    agent_file(home / "agents", "broken", description="Broken", model="nowhere:model")
    llm.rule(is_child, Reply(text="done"))
    llm.push(
        Reply(tool_calls=[task("t1", "CHILD one", agent="mine"), task("t2", "CHILD two", agent="broken")]),
        Reply(text="parent done"),
    )
    events = Events()
    async with Agent(config(home)) as agent:
        session = agent.create_session(tmp_path)
        await agent.prompt(session, Message("user", "delegate"), events)
    models = {r.last_user_text: r.model for r in llm.requests if is_child(r)}
    assert models == {"CHILD one": "my-model", "CHILD two": "scripted"}
    (told,) = [e for e in events if isinstance(e, Notice)]
    assert told.text.startswith("Agent broken asks for model nowhere:model, but it cannot be used: ")


async def test_an_agent_file_crow_skips_is_told_once_per_session(model_env: ScriptedLLM, tmp_path: Path) -> None:
    llm = model_env
    ws = tmp_path / "ws"
    agents = ws / ".crow" / "agents"
    agent_file(agents, "reviewer", description="Reviews")
    (agents / "broken.md").write_text("---\nname: broken\nmode: sideways\n---\nYou are broken.\n")
    llm.default = Reply(text="ok")
    async with Agent(config(tmp_path / "home")) as agent:
        session = agent.create_session(ws)
        first, second = Events(), Events()
        await agent.prompt(session, Message("user", "hi"), first)
        await agent.prompt(session, Message("user", "again"), second)
    told = [e for e in first if isinstance(e, Notice) and e.title == "Agent definitions skipped"]
    assert len(told) == 1 and "broken.md" in told[0].text and "sideways" in told[0].text, told
    assert not [e for e in second if isinstance(e, Notice) and e.title == "Agent definitions skipped"]
    assert "- reviewer: Reviews" in task_spec(llm.requests[-1])["description"]
