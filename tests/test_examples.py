"""The examples/ hooks, installed as real packages and driven through real turns.

The two example packages are built by pip into a private directory (never the shared
venv) that is put on sys.path for this module, so their entry points are found by
`importlib.metadata` exactly as if they were pip-installed. The build is cached in the
temp dir, keyed by the examples' contents: only the first run pays for it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from crow.agent import Agent
from crow.config import CommandHookEntry, Config, HooksConfig
from crow.messages import human
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec
from tests.support.site import on_sys_path

pytestmark = pytest.mark.anyio

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PACKAGES = ("audit_hook", "ralph_hook")
COMPACT_SCRIPT = EXAMPLES / "command_hooks" / "compact_over_threshold.py"


def _fingerprint() -> str:
    digest = hashlib.sha256(sys.version.encode())
    for package in PACKAGES:
        for path in sorted((EXAMPLES / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(EXAMPLES)).encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def _build(target: Path) -> None:
    """pip-install both packages into `target` (fast without build isolation when the
    build backend is already importable)."""
    if target.is_dir():
        return
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--disable-pip-version-check"]
    if importlib.util.find_spec("hatchling") is not None:
        cmd.append("--no-build-isolation")
    cmd += ["--target", str(staging), *(str(EXAMPLES / p) for p in PACKAGES)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        if proc.returncode != 0:
            pytest.skip(f"cannot pip-install the example packages: {proc.stderr.strip()[-800:]}")
        try:
            staging.rename(target)
        except OSError:  # another run finished first
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@pytest.fixture(scope="module")
def installed() -> Iterator[Path]:
    cache = Path(tempfile.gettempdir()) / "crow-test-examples"
    cache.mkdir(exist_ok=True)
    target = cache / _fingerprint()
    _build(target)
    with on_sys_path(target, "crow_audit_hook", "crow_ralph_hook"):
        yield target


@pytest.fixture
def model_env(llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch) -> ScriptedLLM:
    monkeypatch.setenv("OPENAI_BASE_URL", llm.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.delenv("CROW_AUDIT_FILE", raising=False)
    monkeypatch.delenv("CROW_RALPH", raising=False)
    return llm


class RecordingCompactor:
    def __init__(self) -> None:
        self.calls: list[str | None] = []

    async def compact(
        self, session: Any, provider: Any, instructions: str | None = None, emit: Any = None
    ) -> None:
        self.calls.append(instructions)


@pytest.fixture
async def make_agent(
    tmp_path: Path, installed: Path, model_env: ScriptedLLM
) -> AsyncIterator[Callable[..., Agent]]:
    """An agent that finds hooks the way `crow` does (entry points on), without crow's
    builtin hooks so only the examples act."""
    agents: list[Agent] = []

    def make(**hooks: Any) -> Agent:
        config = Config(model="openai:scripted", home=tmp_path / "home", mode="yolo", hooks=HooksConfig(**hooks))
        agent = Agent(config, builtin_hooks=False)
        agent.compactor = RecordingCompactor()
        agents.append(agent)
        return agent

    yield make
    for agent in agents:
        await agent.aclose()


def shout(text: str) -> str:
    """Upper-case the text."""
    return text.upper()


async def _ignore(event: Any) -> None:
    return None


async def run(agent: Agent, cwd: Path, text: str = "hi", session: Any = None) -> Any:
    session = session or agent.create_session(str(cwd))
    await agent.run_turn(session, human(text), _ignore)
    return session


# ------------------------------------------------------------------ audit_hook
async def test_audit_hook_writes_one_line_per_tool_call(
    workspace: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CROW_AUDIT_FILE", ".crow-audit.jsonl")
    agent = make_agent()
    agent.tool(shout)
    model_env.push(
        Reply(tool_calls=[ToolCallSpec("shout", {"text": "a"}), ToolCallSpec("nope", {"x": 1})]),
        Reply(text="done"),
    )
    await run(agent, workspace)

    assert "audit" in agent.hooks
    lines = [json.loads(line) for line in (workspace / ".crow-audit.jsonl").read_text().splitlines()]
    got = sorted((d["name"], d["args"], d["is_error"]) for d in lines)
    assert got == [("nope", {"x": 1}, True), ("shout", {"text": "a"}, False)]


async def test_audit_hook_is_inert_without_its_variable(
    workspace: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM
) -> None:
    agent = make_agent()
    agent.tool(shout)
    model_env.push(Reply(tool_calls=[ToolCallSpec("shout", {"text": "a"})]), Reply(text="done"))
    await run(agent, workspace)
    assert "audit" in agent.hooks
    assert list(workspace.iterdir()) == []


# ------------------------------------------------------------------ ralph_hook
async def test_ralph_asks_once_per_prompt(
    workspace: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CROW_RALPH", "1")
    agent = make_agent()
    model_env.push(Reply(text="done"), Reply(text="yes, checked"))
    session = await run(agent, workspace, "fix the bug")

    assert "ralph" in agent.hooks
    assert len(model_env.requests) == 2
    users = [m["content"] for m in model_env.requests[1].messages if m["role"] == "user"]
    assert users == ["fix the bug", "Are you sure? Check your work."]
    assert session.messages[-1].content == "yes, checked"

    model_env.push(Reply(text="done again"), Reply(text="sure"))
    await run(agent, workspace, "and the other one", session=session)  # a new prompt: asked again
    assert len(model_env.requests) == 4
    users = [m["content"] for m in model_env.requests[3].messages if m["role"] == "user"]
    assert users.count("Are you sure? Check your work.") == 2


async def test_ralph_is_inert_without_its_variable(
    workspace: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM
) -> None:
    agent = make_agent()
    await run(agent, workspace)
    assert len(model_env.requests) == 1


async def test_examples_can_be_disabled_by_name(
    workspace: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CROW_RALPH", "1")
    agent = make_agent()
    agent.config.hooks.disable.extend(["ralph", "audit"])
    await run(agent, workspace)
    assert "ralph" not in agent.hooks and "audit" not in agent.hooks
    assert len(model_env.requests) == 1


# ------------------------------------------------------------------ command_hooks/compact_over_threshold.py
def _script(payload: dict[str, Any], *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(COMPACT_SCRIPT), *args],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_compact_script_thresholds() -> None:
    usage = {"usage": {"context_tokens": 90_000, "context_window": 100_000}}
    assert _script(usage) == {"action": "compact"}  # default 0.8
    assert _script(usage, "0.95") == {}
    assert _script(usage, "80000") == {"action": "compact"}  # over 1: tokens
    assert _script(usage, env={"CROW_COMPACT_AT": "0.95"}) == {}
    assert _script({"usage": {"context_tokens": 10, "context_window": 100_000}}) == {}


async def test_command_hook_script_triggers_compaction(
    workspace: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM
) -> None:
    entry = CommandHookEntry(
        command=f"{sys.executable} {COMPACT_SCRIPT}", phases=["agent_stop"], name="compact-80"
    )
    agent = make_agent(commands=[entry], entry_points=False)
    model_env.push(Reply(text="small", usage=(1_000, 10)))
    session = await run(agent, workspace)
    assert "compact-80" in agent.hooks
    assert agent.compactor.calls == []

    model_env.push(Reply(text="big", usage=(120_000, 10)))  # over 0.8 x 128k
    await run(agent, workspace, "more", session=session)
    assert agent.compactor.calls == [None]
