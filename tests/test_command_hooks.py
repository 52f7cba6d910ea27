"""Command hooks: an external program gets a JSON payload on stdin and prints an action."""

from __future__ import annotations

import json
import logging
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from crow.agent import Agent
from crow.command_hooks import command_hook, parse_action
from crow.config import CommandHookEntry, Config, HooksConfig
from crow.errors import HookError
from crow.hooks import Compact, Continue, Replace, Stop
from crow.messages import human
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec

pytestmark = pytest.mark.anyio


@pytest.fixture
def model_env(llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch) -> ScriptedLLM:
    monkeypatch.setenv("OPENAI_BASE_URL", llm.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    return llm


@pytest.fixture
async def make_agent(tmp_path: Path, model_env: ScriptedLLM) -> AsyncIterator[Callable[..., Agent]]:
    agents: list[Agent] = []

    def make(*entries: CommandHookEntry) -> Agent:
        agent = Agent(Config(model="openai:scripted", home=tmp_path / "home"), builtin_hooks=False)
        for entry in entries:
            agent.hooks.register(command_hook(entry))
        agent.compactor = RecordingCompactor()
        agent.tool(echo)
        agents.append(agent)
        return agent

    yield make
    for agent in agents:
        await agent.aclose()


class RecordingCompactor:
    def __init__(self) -> None:
        self.calls: list[str | None] = []

    async def compact(
        self, session: Any, provider: Any, instructions: str | None = None, emit: Any = None
    ) -> None:
        self.calls.append(instructions)


ECHOED: list[str] = []


def echo(text: str) -> str:
    """Echo the text."""
    ECHOED.append(text)
    return f"echo: {text}"


def script(tmp_path: Path, body: str, name: str = "hook.py") -> str:
    """A hook command: Python with `payload` read from stdin and `out(obj)` to answer."""
    path = tmp_path / name
    head = "import json, os, sys, time\npayload = json.load(sys.stdin)\n"
    head += "def out(obj):\n    print(json.dumps(obj))\n"
    path.write_text(head + textwrap.dedent(body), encoding="utf-8")
    return f"{sys.executable} {path}"


async def _ignore(event: Any) -> None:
    return None


async def run(agent: Agent, cwd: Path, text: str = "hi", session: Any = None) -> Any:
    session = session or agent.create_session(str(cwd))
    await agent.run_turn(session, human(text), _ignore)
    return session


# ------------------------------------------------------------------ building
def test_only_configured_phases_are_overridden() -> None:
    hook = command_hook(CommandHookEntry(command="true", phases=["post_react_loop", "mid_react"]))
    assert hook.phases() == ["after_model_call", "agent_stop"]
    hook = command_hook(CommandHookEntry(command="true", phases=["BeforeToolExec", "AfterToolExec"]))
    assert hook.phases() == ["wrap_tool_call"]
    assert command_hook(CommandHookEntry(command="true")).phases() == ["agent_stop"]


def test_unsupported_phases_fail_at_load() -> None:
    with pytest.raises(HookError, match="modify_request"):
        command_hook(CommandHookEntry(command="true", phases=["modify_request"]))
    with pytest.raises(HookError, match="unknown hook phase"):
        command_hook(CommandHookEntry(command="true", phases=["whenever"]))


def test_parse_action() -> None:
    assert parse_action({}, "h") is None
    assert parse_action({"action": "compact", "instructions": "keep paths"}, "h") == Compact("keep paths")
    assert parse_action({"action": "stop"}, "h") == Stop()
    cont = parse_action({"action": "continue", "messages": ["a", {"content": "b"}]}, "h")
    assert isinstance(cont, Continue) and [m.content for m in cont.messages] == ["a", "b"]
    legacy = parse_action({"follow_up_messages": ["lint it"]}, "h")
    assert isinstance(legacy, Continue) and legacy.messages[0].role == "user"
    rep = parse_action({"action": "replace", "messages": [{"role": "user", "content": "summary"}]}, "h")
    assert isinstance(rep, Replace) and rep.messages[0].content == "summary"
    assert parse_action({"action": "continue", "messages": [""]}, "h") is None  # empty: invalid
    assert parse_action({"action": "continue", "messages": [{"role": "tool", "content": "x"}]}, "h") is None
    assert parse_action({"action": "dance"}, "h") is None


# ------------------------------------------------------------------ the payload and each action
async def test_payload_and_compact(
    tmp_path: Path, workspace: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM
) -> None:
    dump = tmp_path / "payload.json"
    cmd = script(
        tmp_path,
        f"""
        open({str(dump)!r}, "w").write(json.dumps({{"payload": payload, "cwd": os.getcwd(),
                                                   "event": os.environ["CROW_HOOK_EVENT"]}}))
        out({{"action": "compact", "instructions": "keep the todo list"}})
        """,
    )
    agent = make_agent(CommandHookEntry(command=cmd, phases=["agent_stop"]))
    model_env.push(Reply(text="all done", usage=(1000, 20)))
    session = await run(agent, workspace, "do it")

    assert agent.compactor.calls == ["keep the todo list"]
    seen = json.loads(dump.read_text())
    payload = seen["payload"]
    assert seen["cwd"] == str(workspace) and seen["event"] == "agent_stop"
    assert payload["event"] == "agent_stop"
    assert payload["session_id"] == session.id and payload["cwd"] == str(workspace)
    assert payload["prompt"] == "do it"
    assert payload["messages"] == [  # each with its id (`Message.id`), as stored
        {"role": "user", "content": "do it", "id": session.messages[0].id, "meta": {"crow/prompt": True}},
        {"role": "assistant", "content": "all done", "id": session.messages[1].id},
    ]
    assert session.messages[0].id != session.messages[1].id
    usage = payload["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (1000, 20)
    assert usage["context_tokens"] == session.context_tokens() and usage["context_window"] == 128_000


async def test_continue_then_nothing(
    tmp_path: Path, workspace: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM
) -> None:
    marker = tmp_path / "asked"
    cmd = script(
        tmp_path,
        f"""
        if not os.path.exists({str(marker)!r}):
            open({str(marker)!r}, "w").close()
            out({{"action": "continue", "messages": ["Run the tests.", {{"role": "user", "content": "And lint."}}]}})
        """,
    )
    agent = make_agent(CommandHookEntry(command=cmd, phases=["post_react_loop"]))
    model_env.push(Reply(text="first"), Reply(text="second"))
    session = await run(agent, workspace)
    assert len(model_env.requests) == 2
    assert [m["content"] for m in model_env.requests[1].messages if m["role"] == "user"] == [
        "hi",
        "Run the tests.",
        "And lint.",
    ]
    assert session.messages[-1].content == "second"


async def test_replace(
    tmp_path: Path, workspace: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM
) -> None:
    cmd = script(
        tmp_path,
        """
        out({"action": "replace", "messages": [{"role": "user", "content": "summary of it all"},
                                                {"role": "assistant", "content": "ok"}]})
        """,
    )
    agent = make_agent(CommandHookEntry(command=cmd, phases=["agent_stop"]))
    session = await run(agent, workspace)
    assert [(m.role, m.content) for m in session.messages] == [
        ("user", "summary of it all"),
        ("assistant", "ok"),
    ]


async def test_stop_after_model_call(
    tmp_path: Path, workspace: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM
) -> None:
    cmd = script(tmp_path, 'out({"action": "stop"})\n')
    agent = make_agent(CommandHookEntry(command=cmd, phases=["after_model_call"]))
    model_env.push(Reply(tool_calls=[ToolCallSpec("echo", {"text": "x"})]), Reply(text="two"))
    ECHOED.clear()
    await run(agent, workspace)
    assert len(model_env.requests) == 1
    assert ECHOED == []


async def test_context_injection_at_before_agent(
    tmp_path: Path, workspace: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM
) -> None:
    cmd = script(tmp_path, 'out({"context": "The build command is `make ci`."})\n')
    agent = make_agent(CommandHookEntry(command=cmd, phases=["pre_request"]))
    await run(agent, workspace)
    assert "The build command is `make ci`." in model_env.requests[-1].system


# ------------------------------------------------------------------ tool phases
async def test_block_a_tool(
    tmp_path: Path, workspace: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM
) -> None:
    seen = tmp_path / "tools.jsonl"
    cmd = script(
        tmp_path,
        f"""
        with open({str(seen)!r}, "a") as f:
            f.write(json.dumps([payload["event"], payload["tool"]]) + "\\n")
        if payload["event"] == "wrap_tool_call" and payload["tool"]["input"]["text"] == "rm -rf":
            out({{"action": "block", "reason": "Destructive commands are not allowed here."}})
        """,
    )
    agent = make_agent(CommandHookEntry(command=cmd, phases=["wrap_tool_call", "after_tool_exec"]))
    model_env.push(
        Reply(
            tool_calls=[
                ToolCallSpec("echo", {"text": "rm -rf"}, id="c1"),
                ToolCallSpec("echo", {"text": "hello"}, id="c2"),
            ]
        ),
        Reply(text="ok"),
    )
    ECHOED.clear()
    await run(agent, workspace)

    assert ECHOED == ["hello"]
    tool_msgs = {
        m["tool_call_id"]: m["content"] for m in model_env.requests[1].messages if m["role"] == "tool"
    }
    assert tool_msgs["c1"] == "Error: Destructive commands are not allowed here."
    assert tool_msgs["c2"] == "echo: hello"
    events = [json.loads(line) for line in seen.read_text().splitlines()]
    before = sorted(t["call_id"] for e, t in events if e == "wrap_tool_call")
    after = [t for e, t in events if e == "after_tool_exec"]
    assert before == ["c1", "c2"]
    assert after == [
        {"name": "echo", "input": {"text": "hello"}, "call_id": "c2", "output": "echo: hello", "error": None}
    ]


# ------------------------------------------------------------------ failures are skipped
async def test_timeout_kills_the_process_group(
    tmp_path: Path,
    workspace: Path,
    make_agent: Callable[..., Agent],
    model_env: ScriptedLLM,
    caplog: pytest.LogCaptureFixture,
) -> None:
    pid_file = tmp_path / "child.pid"
    cmd = script(
        tmp_path,
        f"""
        import subprocess
        child = subprocess.Popen(["sleep", "30"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(30)
        out({{"action": "compact"}})
        """,
    )
    agent = make_agent(CommandHookEntry(command=cmd, phases=["agent_stop"], timeout=0.5))
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="crow.command_hooks"):
        session = await run(agent, workspace)
    assert time.monotonic() - started < 5
    assert "timed out" in caplog.text
    assert agent.compactor.calls == []
    assert session.messages[-1].content == "ok"
    assert _gone(int(pid_file.read_text())), "the hook's child process survived the timeout"


def _gone(pid: int, wait: float = 3.0) -> bool:
    deadline = time.monotonic() + wait
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status  # a zombie is dead, just not reaped yet


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('print("not json {")\n', "invalid JSON"),
        ('print("[1, 2]")\n', "not a JSON object"),
        ('out({"action": "compact"})\nsys.exit(3)\n', "exited with 3"),
        ('out({"action": "warp"})\n', "unknown action"),
    ],
)
async def test_bad_answers_are_skipped(
    tmp_path: Path,
    workspace: Path,
    make_agent: Callable[..., Agent],
    model_env: ScriptedLLM,
    caplog: pytest.LogCaptureFixture,
    body: str,
    message: str,
) -> None:
    agent = make_agent(CommandHookEntry(command=script(tmp_path, body), phases=["agent_stop"]))
    with caplog.at_level(logging.WARNING, logger="crow.command_hooks"):
        session = await run(agent, workspace)
    assert message in caplog.text
    assert agent.compactor.calls == []
    assert session.messages[-1].content == "ok"


async def test_missing_command_is_skipped(
    workspace: Path,
    make_agent: Callable[..., Agent],
    model_env: ScriptedLLM,
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent = make_agent(
        CommandHookEntry(command="/nonexistent/hook --flag", phases=["before_agent", "agent_stop"])
    )
    with caplog.at_level(logging.WARNING, logger="crow.command_hooks"):
        session = await run(agent, workspace)
    assert "exited with 127" in caplog.text
    assert session.messages[-1].content == "ok"


async def test_configured_through_discovery(tmp_path: Path, workspace: Path, model_env: ScriptedLLM) -> None:
    cmd = script(tmp_path, 'out({"action": "compact"})\n')
    config = Config(
        model="openai:scripted",
        home=tmp_path / "home",
        hooks=HooksConfig(
            entry_points=False,
            commands=[CommandHookEntry(command=cmd, name="compactor"), CommandHookEntry(command="true")],
        ),
    )
    agent = Agent(config, builtin_hooks=False)  # the user's command hooks stay
    agent.compactor = RecordingCompactor()
    try:
        await run(agent, workspace)
        assert "compactor" in agent.hooks and "command-2" in agent.hooks
        assert agent.compactor.calls == [None]
    finally:
        await agent.aclose()


async def test_cancelled_turn_kills_the_command(
    tmp_path: Path, workspace: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM
) -> None:
    import anyio

    pid_file = tmp_path / "hook.pid"
    cmd = script(tmp_path, f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(30)\n")
    agent = make_agent(CommandHookEntry(command=cmd, phases=["agent_stop"], timeout=60))
    session = agent.create_session(str(workspace))
    started = time.monotonic()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.run_turn, session, human("hi"), _ignore)
            while not pid_file.exists() or not pid_file.read_text():  # noqa: ASYNC110
                await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
    assert time.monotonic() - started < 5
    assert _gone(int(pid_file.read_text()))
