"""Skills, memory and tracing hooks, and the snippets of docs/hooks.md, through real turns
against the scripted model server."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from builtin_hooks import memory as memory_mod
from builtin_hooks import skills as skills_mod
from builtin_hooks import tracing as tracing_mod
from builtin_hooks.memory import MemoryHook
from builtin_hooks.skills import SkillsHook, discover
from builtin_hooks.tracing import TracingHook
from crow import Compact, CompactService, Hook, HookContext, ModelRequest, ToolCall, ToolResult, prompt_files
from crow.agent import Agent
from crow.config import Config, HooksConfig
from crow.messages import Message, human
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec

pytestmark = pytest.mark.anyio


# ------------------------------------------------------------------ helpers
@pytest.fixture
def model_env(llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch) -> ScriptedLLM:
    monkeypatch.setenv("OPENAI_BASE_URL", llm.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.delenv("CROW_TRACE", raising=False)
    return llm


@pytest.fixture
async def make_agent(tmp_path: Path, model_env: ScriptedLLM) -> AsyncIterator[Callable[..., Agent]]:
    agents: list[Agent] = []

    def make(*hooks: Any, **config: Any) -> Agent:
        config.setdefault("home", tmp_path / "home")
        agent = Agent(Config(model="openai:scripted", **config), builtin_hooks=False)
        for hook in hooks:
            agent.hooks.register(hook)
        agents.append(agent)
        return agent

    yield make
    for agent in agents:
        await agent.aclose()


async def _ignore(event: Any) -> None:
    return None


async def turn(agent: Agent, cwd: Path, text: str = "hi", session: Any = None) -> Any:
    session = session or agent.create_session(str(cwd))
    await agent.run_turn(session, human(text), _ignore)
    return session


def write_skill(root: Path, folder: str, frontmatter: str, body: str = "Do the thing.\n") -> Path:
    path = root / folder / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{frontmatter}{body}", encoding="utf-8")
    return path


# ------------------------------------------------------------------ skills
def test_discover_skips_broken_skills_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "skills"
    good = write_skill(root, "csv", "---\nname: csv-analyzer\ndescription: Analyze CSV files\n---\n")
    fallback = write_skill(root, "code-review", "---\ndescription: Review code for bugs\n---\n")
    write_skill(root, "broken", "---\nname: [unclosed\ndescription: x\n---\n")
    write_skill(root, "unclosed", "---\nname: nope\ndescription: never closed\n")
    write_skill(root, "no-frontmatter", "# Just markdown\n")
    write_skill(root, "no-description", "---\nname: nodesc\n---\n")
    write_skill(root, "list", "---\n- a\n- b\n---\n")
    write_skill(root, "long-name", f"---\nname: {'n' * 65}\ndescription: too long a name\n---\n")
    long_desc = write_skill(root, "long-desc", f"---\ndescription: {'d' * 2000}\n---\n")
    (root / "not-a-skill").mkdir()
    (root / "stray.md").write_text("ignored", encoding="utf-8")
    write_skill(root / "csv", "nested", "---\nname: too-deep\ndescription: x\n---\n")

    with caplog.at_level(logging.WARNING, logger="crow.hooks.skills"):
        skills = discover([root, tmp_path / "missing"])

    by_name = {s.name: s for s in skills}
    assert sorted(by_name) == ["code-review", "csv-analyzer", "long-desc"]
    assert by_name["csv-analyzer"].path == good.absolute()
    assert by_name["code-review"].path == fallback.absolute()
    assert by_name["code-review"].description == "Review code for bugs"
    assert len(by_name["long-desc"].description) == 1024
    assert by_name["long-desc"].path == long_desc.absolute()
    warned = caplog.text
    for folder in (
        "broken",
        "unclosed",
        "no-frontmatter",
        "no-description",
        "list",
        "long-name",
        "long-desc",
    ):
        assert f"{folder}/SKILL.md" in warned, folder


def test_a_skill_md_past_the_limit_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prompt_files, "MAX_BYTES", 1024)
    write_skill(tmp_path, "big", "---\nname: big\ndescription: x\n---\n" + "y" * 1024)
    write_skill(tmp_path, "small", "---\nname: small\ndescription: x\n---\n")
    with caplog.at_level(logging.WARNING, logger="crow.hooks.skills"):
        assert [s.name for s in discover([tmp_path])] == ["small"]
    assert "big/SKILL.md skipped: over 1 KB" in caplog.text


def test_first_skill_of_a_name_wins(tmp_path: Path) -> None:
    first = write_skill(tmp_path / "a", "x", "---\nname: same\ndescription: first\n---\n")
    write_skill(tmp_path / "b", "y", "---\nname: same\ndescription: second\n---\n")
    [skill] = discover([tmp_path / "a", tmp_path / "b"])
    assert (skill.description, skill.path) == ("first", first.absolute())


async def test_read_skill_reads_skills_outside_the_workspace(
    tmp_path: Path, workspace: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM
) -> None:
    home = tmp_path / "home"
    write_skill(home / "skills", "g", "---\nname: global\ndescription: G\n---\n", body="Step one.\n")
    (home / "skills" / "g" / "ref.md").write_text("reference text")
    model_env.push(
        Reply(
            tool_calls=[
                ToolCallSpec(name="read_skill", arguments={"name": "global"}),
                ToolCallSpec(name="read_skill", arguments={"name": "global", "file": "ref.md"}),
                ToolCallSpec(name="read_skill", arguments={"name": "global", "file": "../../x"}),
                ToolCallSpec(name="read_skill", arguments={"name": "nope"}),
            ]
        ),
        Reply(text="ok"),
    )
    await turn(agent=make_agent(SkillsHook([], home=home)), cwd=workspace)
    calls = [c["id"] for m in model_env.requests[-1].messages for c in m.get("tool_calls") or ()]
    by_id = {m["tool_call_id"]: m["content"] for m in model_env.requests[-1].messages if m["role"] == "tool"}
    results = [by_id[c] for c in calls]  # results arrive in completion order; match by id
    assert "Step one." in results[0] and results[1] == "reference text"
    assert "not a file in the folder" in results[2] and "no skill named 'nope'" in results[3]


def test_with_system_appends_to_the_system_message_without_mutating() -> None:
    request = ModelRequest(messages=[Message("system", "base"), human("hi")])
    changed = request.with_system("CATALOG")
    assert changed.messages[0].content == "base\n\nCATALOG"
    assert request.messages[0].content == "base"
    bare = ModelRequest(messages=[human("hi")])
    inserted = bare.with_system("CATALOG")
    assert [m.role for m in inserted.messages] == ["system", "user"]
    assert inserted.messages[0].content == "CATALOG"
    assert len(bare.messages) == 1


async def test_skills_catalog_reaches_the_model(
    tmp_path: Path, workspace: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM
) -> None:
    home = tmp_path / "home"
    configured = write_skill(tmp_path / "mine", "csv", "---\nname: csv-analyzer\ndescription: CSV\n---\n")
    local = write_skill(workspace / ".crow" / "skills", "review", "---\ndescription: Reviews\n---\n")
    agents = write_skill(
        workspace / ".agents" / "skills", "a", "---\nname: from-agents\ndescription: A\n---\n"
    )
    claude = write_skill(
        workspace / ".claude" / "skills", "c", "---\nname: from-claude\ndescription: C\n---\n"
    )
    glob_ = write_skill(home / "skills", "g", "---\nname: global\ndescription: G\n---\n")
    write_skill(workspace / ".crow" / "skills", "bad", "---\nname: : :\n---\n")
    agent = make_agent(SkillsHook([str(tmp_path / "mine")], home=home))

    session = await turn(agent, workspace)
    system = model_env.requests[-1].system
    assert skills_mod.HEADER.splitlines()[0] in system
    assert f"- csv-analyzer: CSV ({configured})" in system
    assert f"- review: Reviews ({local})" in system
    assert f"- from-agents: A ({agents})" in system
    assert f"- from-claude: C ({claude})" in system
    assert f"- global: G ({glob_})" in system
    assert system.index("csv-analyzer") < system.index("review") < system.index("global")
    assert "You are crow" in system  # appended to the configured system prompt
    assert [s.name for s in session.state["skills"]][0] == "csv-analyzer"

    # discovery is once per session: a skill added later shows up in a new session only
    write_skill(workspace / ".crow" / "skills", "late", "---\ndescription: Late\n---\n")
    await turn(agent, workspace, session=session)
    assert "- late:" not in model_env.requests[-1].system
    await turn(agent, workspace)
    assert "- late: Late" in model_env.requests[-1].system


async def test_no_skills_no_catalog(
    workspace: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM
) -> None:
    agent = make_agent(SkillsHook())
    await turn(agent, workspace)
    assert "## Skills" not in model_env.requests[-1].system


def test_skills_factory_reads_settings(tmp_path: Path) -> None:
    config = Config(home=tmp_path, hooks=HooksConfig(settings={"skills": {"paths": ["/x/skills"]}}))
    hook = skills_mod.factory(Agent(config, builtin_hooks=False))
    assert hook.paths == ["/x/skills"]
    assert hook.roots(Path("/w"))[-1] == tmp_path / "skills"


# ------------------------------------------------------------------ memory
async def test_memory_order_and_block(
    tmp_path: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    repo = tmp_path / "repo"
    cwd = repo / "pkg" / "sub"
    cwd.mkdir(parents=True)
    (repo / ".git").mkdir()
    (tmp_path / "AGENTS.md").write_text("ABOVE THE REPO", encoding="utf-8")  # outside: not read
    (home / "AGENTS.md").write_text("GLOBAL", encoding="utf-8")
    (repo / "AGENTS.md").write_text("ROOT", encoding="utf-8")
    (cwd / "AGENTS.md").write_text("CWD\n", encoding="utf-8")  # pkg/ has none: skipped
    extra = tmp_path / "notes.md"
    extra.write_text("EXTRA", encoding="utf-8")
    agent = make_agent(MemoryHook([str(extra), "missing.md"], home=home))

    session = await turn(agent, cwd)
    system = model_env.requests[-1].system
    block = "<agent_memory>\nGLOBAL\n\n---\n\nROOT\n\n---\n\nCWD\n\n---\n\nEXTRA\n</agent_memory>"
    assert block in system
    assert "ABOVE THE REPO" not in system
    assert "Guidelines for agent memory:" in system
    assert str(cwd / "AGENTS.md") in system.split("</agent_memory>")[1]

    # edited between prompts: read again
    (cwd / "AGENTS.md").write_text("CWD EDITED, longer", encoding="utf-8")
    await turn(agent, cwd, session=session)
    assert "CWD EDITED, longer" in model_env.requests[-1].system


async def test_memory_is_checked_on_the_event_loop_not_in_a_worker_thread(
    tmp_path: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM
) -> None:
    # A few stats per prompt (and a bounded read when a file changed): handed to a worker
    # thread, each prompt paid a GIL hand-off that cost more than the work under load.
    threads: list[str] = []

    class Recording(MemoryHook):
        def load(self, cwd: Path) -> str:
            threads.append(threading.current_thread().name)
            return super().load(cwd)

    (tmp_path / "AGENTS.md").write_text("REMEMBER", encoding="utf-8")
    agent = make_agent(Recording(home=tmp_path / "home"))
    session = await turn(agent, tmp_path)
    await turn(agent, tmp_path, session=session)
    assert threads == [threading.current_thread().name] * 2
    assert "REMEMBER" in model_env.requests[-1].system


def test_memory_files_without_a_repo(tmp_path: Path) -> None:
    cwd = tmp_path / "a" / "b"
    cwd.mkdir(parents=True)
    files = memory_mod.memory_files(cwd, tmp_path / "home", [])
    assert files == [tmp_path / "home" / "AGENTS.md", cwd / "AGENTS.md"]
    (tmp_path / "a" / ".git").write_text("gitdir: elsewhere", encoding="utf-8")  # a worktree file
    files = memory_mod.memory_files(cwd, tmp_path / "home", [])
    assert files[1:] == [tmp_path / "a" / "AGENTS.md", cwd / "AGENTS.md"]


def test_memory_reads_only_changed_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "AGENTS.md").write_text("one", encoding="utf-8")
    hook = MemoryHook(home=tmp_path / "home")
    reads: list[Path] = []
    real = memory_mod.read_text_file

    def counting(path: Path, **kwargs: Any) -> str:
        reads.append(path)
        return real(path, **kwargs)

    monkeypatch.setattr(memory_mod, "read_text_file", counting)
    assert "one" in hook.load(tmp_path)
    assert "one" in hook.load(tmp_path)
    assert len(reads) == 1
    (tmp_path / "AGENTS.md").write_text("two!", encoding="utf-8")
    assert "two!" in hook.load(tmp_path)
    assert len(reads) == 2


def test_a_fifo_named_agents_md_is_skipped_not_waited_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A repository's AGENTS.md may be a FIFO: reading it used to block every prompt of the
    session forever (in a worker thread the turn waited on, a cancel too)."""
    cwd = tmp_path / "repo"
    cwd.mkdir()
    os.mkfifo(cwd / "AGENTS.md")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "AGENTS.md").write_text("GLOBAL", encoding="utf-8")
    hook = MemoryHook(home=tmp_path / "home")
    loaded: list[str] = []
    reader = threading.Thread(target=lambda: loaded.append(hook.load(cwd)), daemon=True)
    with caplog.at_level(logging.WARNING, logger="crow.hooks.memory"):
        reader.start()
        reader.join(10)
    if reader.is_alive():  # the old code: let it go before failing
        os.close(os.open(cwd / "AGENTS.md", os.O_WRONLY | os.O_NONBLOCK))
    assert not reader.is_alive()
    assert "GLOBAL" in loaded[0] and "not a regular file" in caplog.text


def test_an_agents_md_linking_to_itself_costs_only_itself(tmp_path: Path) -> None:
    # Path.resolve() raises on a symlink loop (RuntimeError on 3.11): every memory file of
    # the prompt was lost with it, a traceback each prompt.
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "AGENTS.md").write_text("GLOBAL", encoding="utf-8")
    (tmp_path / "AGENTS.md").symlink_to(tmp_path / "AGENTS.md")
    assert "GLOBAL" in MemoryHook(home=tmp_path / "home").load(tmp_path)


def test_a_memory_file_reached_by_several_paths_is_read_once(tmp_path: Path) -> None:
    """The home is the workspace, a configured path is a symlink to AGENTS.md, another a
    hard link: one file, in the prompt once (under the first path it was reached by)."""
    (tmp_path / "AGENTS.md").write_text("ONCE", encoding="utf-8")
    (tmp_path / "link.md").symlink_to(tmp_path / "AGENTS.md")
    os.link(tmp_path / "AGENTS.md", tmp_path / "hard.md")
    (tmp_path / "other.md").write_text("OTHER", encoding="utf-8")
    block = MemoryHook(["link.md", "hard.md", "other.md", "AGENTS.md"], home=tmp_path).load(tmp_path)
    assert block.count("ONCE") == 1 and block.count("OTHER") == 1
    assert f"read from: {tmp_path / 'AGENTS.md'}, {tmp_path / 'other.md'}" in block


def test_memory_with_windows_line_ends_reads_as_text(tmp_path: Path) -> None:
    (tmp_path / "AGENTS.md").write_bytes(b"one\r\ntwo\rthree\n")
    assert "one\ntwo\nthree" in MemoryHook(home=tmp_path / "home").load(tmp_path)


def test_an_agents_md_past_the_limit_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prompt_files, "MAX_BYTES", 1024)
    (tmp_path / "AGENTS.md").write_text("x" * 1025, encoding="utf-8")
    (tmp_path / "notes.md").write_text("KEPT", encoding="utf-8")
    hook = MemoryHook(["notes.md"], home=tmp_path / "home")
    with caplog.at_level(logging.WARNING, logger="crow.hooks.memory"):
        block = hook.load(tmp_path)
        assert hook.load(tmp_path) == block  # the next prompt: the same, not said again
    assert "KEPT" in block and "x" * 1025 not in block
    assert caplog.text.count("AGENTS.md skipped: over 1 KB") == 1


async def test_no_memory_no_block(
    workspace: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM
) -> None:
    agent = make_agent(MemoryHook(home=workspace / "nohome"))
    await turn(agent, workspace)
    assert "<agent_memory>" not in model_env.requests[-1].system


# ------------------------------------------------------------------ tracing
def echo(text: str) -> str:
    """Echo the text back."""
    return text * 2


def fail(text: str) -> str:
    """Always fails."""
    raise ValueError("no good")


async def test_tracing_writes_spans(
    tmp_path: Path, workspace: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM
) -> None:
    trace = tmp_path / "traces" / "crow.jsonl"
    agent = make_agent(TracingHook(trace))
    agent.tool(echo)
    agent.tool(fail)
    model_env.push(
        Reply(tool_calls=[ToolCallSpec("echo", {"text": "x" * 400}), ToolCallSpec("fail", {"text": "y"})]),
        Reply(text="done " * 200, usage=(1234, 56)),
    )
    session = await turn(agent, workspace)

    spans = [json.loads(line) for line in trace.read_text(encoding="utf-8").splitlines()]
    assert sorted(s["name"] for s in spans) == ["llm.call", "llm.call", "tool.call", "tool.call"]
    for span in spans:
        assert span["session_id"] == session.id
        assert span["model"] == "scripted"
        assert span["duration_ms"] >= 0 and span["start"] > 1_600_000_000
    first, last = (s for s in spans if s["name"] == "llm.call")
    assert (first["status"], first["tool_calls_count"], first["tool_call_names"]) == (
        "ok",
        2,
        ["echo", "fail"],
    )
    assert first["message_count"] == 2 and first["iteration"] == 0 and first["tool_count"] == 2
    assert last["message_count"] == 5 and last["content_length"] == len("done " * 200)
    assert len(last["content_preview"]) == 500
    assert (last["input_tokens"], last["output_tokens"]) == (1234, 56)
    tools = {s["tool_name"]: s for s in spans if s["name"] == "tool.call"}
    ok = tools["echo"]
    assert ok["status"] == "ok" and ok["is_error"] is False and ok["tool_call_id"]
    assert json.loads(ok["tool_args"]) == {"text": "x" * 400}
    assert ok["output_length"] == 800 and len(ok["output_preview"]) == 500
    bad = tools["fail"]
    assert bad["status"] == "error" and bad["is_error"] is True and "fail" in bad["error"]


async def test_tracing_records_a_failed_model_call(
    tmp_path: Path, workspace: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM
) -> None:
    from tests.llm_server import Fault

    trace = tmp_path / "t.jsonl"
    agent = make_agent(TracingHook(trace), providers={"openai": {"max_retries": 0}})
    model_env.push(Fault(status=400, message="bad request"))
    await turn(agent, workspace)
    [span] = [json.loads(line) for line in trace.read_text(encoding="utf-8").splitlines()]
    assert span["name"] == "llm.call" and span["status"] == "error" and span["error"]


async def test_tracing_never_breaks_a_turn(
    tmp_path: Path, workspace: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    agent = make_agent(TracingHook(blocker / "sub" / "trace.jsonl"))  # cannot be created
    model_env.push(Reply(text="fine"))
    session = await turn(agent, workspace)
    assert session.messages[-1].content == "fine"


def test_tracing_off_means_no_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CROW_TRACE", raising=False)
    assert tracing_mod.factory(Agent(Config(home=tmp_path), builtin_hooks=False)) is None
    hook = tracing_mod.factory(Agent(Config(home=tmp_path, trace=str(tmp_path / "t")), builtin_hooks=False))
    assert isinstance(hook, TracingHook)
    monkeypatch.setenv("CROW_TRACE", str(tmp_path / "env.jsonl"))
    hook = tracing_mod.factory(Agent(Config(home=tmp_path), builtin_hooks=False))
    assert isinstance(hook, TracingHook) and hook.writer.path == tmp_path / "env.jsonl"


async def test_discovery_registers_tracing_only_with_a_trace_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the real discovery (crow's own entry points): outermost when on, absent when off."""
    monkeypatch.delenv("CROW_TRACE", raising=False)
    hooks = HooksConfig(entry_points=False)
    off = Agent(Config(home=tmp_path / "a", hooks=hooks), builtin_hooks=True)
    on = Agent(Config(home=tmp_path / "b", hooks=hooks, trace=str(tmp_path / "t.jsonl")), builtin_hooks=True)
    try:
        await off.ready()
        await on.ready()
        assert "tracing" not in off.hooks and "permissions" in off.hooks
        assert on.hooks.names("wrap_tool_call")[:3] == ["tracing", "subagents", "permissions"]
        assert isinstance(on.hooks.hooks[0], TracingHook)
    finally:
        await off.aclose()
        await on.aclose()


# ------------------------------------------------------------------ docs/hooks.md snippets
# Copied from docs/hooks.md: keep them in sync.
async def log_all_requests(ctx: HookContext) -> None:
    """Log every prompt and its token usage (post_request = after_agent)."""
    with open(os.environ["AGENT_LOG"], "a", encoding="utf-8") as f:
        f.write(f"Request: {ctx.prompt}\n")
        f.write(f"Usage: {ctx.usage.input_tokens} in, {ctx.usage.output_tokens} out\n")


def fetch_weather() -> str:
    return "sunny, 21°C"


async def weather_skill(ctx: HookContext) -> None:
    """Inject weather context when the user mentions weather (pre_request = before_agent)."""
    if "weather" in ctx.prompt.lower():
        ctx.inject_context(f"Current weather: {fetch_weather()}")


async def compaction_hook(ctx: HookContext) -> Compact | None:
    """Compact when the context is over the threshold (mid_react = after_model_call)."""
    if ctx.should_compact():
        return Compact(instructions="Keep the file names we touched.")
    return None


class RecordingCompactor(CompactService):
    """The agent's service with its `due` (the snippet's `should_compact`), recording instead
    of compacting."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict[str, Any]] = []

    async def compact(
        self, session: Any, provider: Any, instructions: str | None = None, emit: Any = None
    ) -> None:
        self.calls.append({"session": session, "instructions": instructions})


async def test_docs_snippets_work(
    tmp_path: Path,
    workspace: Path,
    make_agent: Callable[..., Agent],
    model_env: ScriptedLLM,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log_file = tmp_path / "agent.log"
    monkeypatch.setenv("AGENT_LOG", str(log_file))
    agent = make_agent()
    agent.hooks.register("post_request", log_all_requests)
    agent.hooks.register("pre_request", weather_skill)
    agent.hooks.register("mid_react", compaction_hook)
    agent.compactor = RecordingCompactor()

    model_env.push(Reply(text="small", usage=(100, 5)))
    session = await turn(agent, workspace, "what's the weather?")
    assert "Current weather: sunny, 21°C" in model_env.requests[-1].system
    assert agent.compactor.calls == []

    model_env.push(Reply(text="big", usage=(120_000, 10)))  # over 85% of 128k
    await turn(agent, workspace, "tell me more", session=session)
    assert "Current weather" not in model_env.requests[-1].system  # injected for one turn only
    assert agent.compactor.calls == [{"session": session, "instructions": "Keep the file names we touched."}]
    assert log_file.read_text(encoding="utf-8").splitlines() == [
        "Request: what's the weather?",
        "Usage: 100 in, 5 out",
        "Request: tell me more",
        "Usage: 120000 in, 10 out",
    ]


class NoForcePush(Hook):
    """Copied from docs/hooks.md ("A class hook")."""

    name = "no-force-push"

    async def modify_request(self, ctx: HookContext, request: ModelRequest) -> ModelRequest:
        return request.replace(temperature=0.2)

    async def wrap_tool_call(self, ctx: HookContext, call: ToolCall, call_next: Any) -> ToolResult:
        if call.name == "execute" and "push --force" in call.args.get("command", ""):
            # Blocking is a return value, not an exception: the model reads the error.
            return ToolResult(call.id, call.name, error="Force-pushing is not allowed here.")
        return await call_next(call)


def execute(command: str) -> str:
    """Pretend to run a command."""
    return f"ran {command}"


async def test_docs_class_hook_blocks_a_tool(
    workspace: Path, make_agent: Callable[..., Agent], model_env: ScriptedLLM
) -> None:
    agent = make_agent(NoForcePush())
    agent.tool(execute)
    model_env.push(
        Reply(
            tool_calls=[
                ToolCallSpec("execute", {"command": "git push --force"}, id="c1"),
                ToolCallSpec("execute", {"command": "git status"}, id="c2"),
            ]
        ),
        Reply(text="ok"),
    )
    await turn(agent, workspace)
    assert model_env.requests[0].body["temperature"] == 0.2
    results = {m["tool_call_id"]: m["content"] for m in model_env.requests[1].messages if m["role"] == "tool"}
    assert results == {"c1": "Error: Force-pushing is not allowed here.", "c2": "ran git status"}
