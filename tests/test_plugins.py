"""Hook discovery (crow.plugins): one stack from every source, in documented bands; the
builtins found through crow's own entry points; the public extension points they use.

Entry-point plugins here are real distributions: a `*.dist-info` folder with an
`entry_points.txt` on sys.path, found by `importlib.metadata` as a pip install would be."""

from __future__ import annotations

import ast
import inspect
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import crow
from crow.agent import Agent
from crow.config import CommandHookEntry, Config, HooksConfig
from crow.context import HookContext
from crow.editor import EditorClient
from crow.errors import ConfigError, HookError
from crow.hooks import Hook
from crow.messages import human
from crow.plugins import CROW_DISTRIBUTION, GROUP
from crow.session import Session
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec
from tests.support.site import on_sys_path

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = '''
import os
from crow import Hook

def _record(entry):
    with open(os.environ["CROW_TEST_ORDER_FILE"], "a", encoding="utf-8") as f:
        f.write(entry + "\\n")

class Plugged(Hook):
    async def wrap_tool_call(self, ctx, call, call_next):
        _record("plugged")
        return await call_next(call)

async def at_stop(ctx):
    _record("plugin-function")
'''


def install_dist(site: Path, name: str, module: str, source: str, entry_points: str) -> None:
    """A distribution `name` holding `module`, as pip would leave it in `site`."""
    info = site / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (site / f"{module}.py").write_text(source, encoding="utf-8")
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Path]:
    """A folder on sys.path for the duration of the test, where `install_dist` installs."""
    folder = tmp_path / "site"
    folder.mkdir()
    with on_sys_path(folder, "crow_test_plugin", "crow_test_broken"):
        yield folder


@pytest.fixture
def plugin(site: Path) -> str:
    """An installed distribution `crow-test-plugin` with a Hook class (`plugged`) and a
    function at agent_stop (`stopper`)."""
    entry_points = (
        f"[{GROUP}]\nplugged = crow_test_plugin:Plugged\n\n[{GROUP}.agent_stop]\nstopper = crow_test_plugin:at_stop\n"
    )
    install_dist(site, "crow-test-plugin", "crow_test_plugin", PLUGIN, entry_points)
    return "crow-test-plugin"


def recorder(label: str, log: list[str]) -> Any:
    async def record(ctx: Any, call: Any, call_next: Any) -> Any:
        log.append(label)
        return await call_next(call)

    return record


# ------------------------------------------------------------------ one stack, in bands
async def test_a_mixed_stack_has_one_order_whatever_the_registration_time(
    tmp_path: Path, plugin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CROW_TRACE", raising=False)
    config = Config(
        home=tmp_path / "home",
        trace=str(tmp_path / "trace.jsonl"),
        hooks=HooksConfig(
            extra=["tests.support.e2e_plugins:Outer", "tests.support.e2e_plugins:Inner"],
            commands=[CommandHookEntry(command="true", phases=["BeforeToolExec"], name="cmd")],
        ),
    )
    agent = Agent(config)
    log: list[str] = []
    # before the warm-up found the builtins, with an order lower than any of theirs
    agent.hooks.register("wrap_tool_call", recorder("early", log), name="early", order=-500)
    try:
        await agent.ready()
        agent.hooks.register("wrap_tool_call", recorder("late", log), name="late")
        assert agent.hooks.names("wrap_tool_call") == [
            # band 0: crow's builtins by their order; permissions outside every tool runner,
            # subagents outside permissions (a child's tool it was not offered is never asked)
            "tracing",
            "subagents",
            "permissions",
            "plan",
            "ask",
            "checkpoints",
            "filesystem",
            "todolist",
            # band 1: everyone else's, by order (early -500, outer -1), then name
            "early",
            "outer",
            "cmd",
            "inner",
            "late",
            "plugged",
            "project_commands",  # order 1000: inside the user's own hooks
        ]
        assert agent.hooks.names("modify_request") == ["subagents", "plan", "skills", "memory"]
        assert agent.hooks.names("agent_stop") == ["ask", "stopper", "project_commands"]
        # the tool servers come in the stack's order too
        assert [type(h).__name__ for h in agent.hooks.hooks][:2] == ["TracingHook", "SubagentsHook"]
    finally:
        await agent.aclose()


async def add_turn(agent: Agent, llm: ScriptedLLM, workspace: Path, answer: str) -> Session:
    """One turn in which the model calls a programmatic `add` tool, then answers."""

    @agent.tool
    async def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    llm.push(Reply(tool_calls=[ToolCallSpec("add", {"a": 1, "b": 2})]), Reply(text=answer))
    session = agent.create_session(str(workspace))

    async def ignore(event: Any) -> None:
        return None

    await agent.run_turn(session, human("add"), ignore)
    return session


async def test_without_builtins_the_users_hooks_all_still_run(
    tmp_path: Path, workspace: Path, plugin: str, llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    order_file = tmp_path / "order.txt"
    monkeypatch.setenv("CROW_TEST_ORDER_FILE", str(order_file))
    monkeypatch.setenv("OPENAI_BASE_URL", llm.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    config = Config(
        model="openai:scripted",
        home=tmp_path / "home",
        hooks=HooksConfig(
            extra=["tests.support.e2e_plugins:Outer"],
            commands=[CommandHookEntry(command=f"echo command >> {order_file}", phases=["after_agent"])],
        ),
    )
    agent = Agent(config, builtin_hooks=False)
    log: list[str] = []
    agent.hooks.register("wrap_tool_call", recorder("programmatic", log), name="programmatic")

    try:
        await add_turn(agent, llm, workspace, "3")
    finally:
        await agent.aclose()
    assert "permissions" not in agent.hooks and "filesystem" not in agent.hooks
    assert log == ["programmatic"]
    ran = order_file.read_text().split()
    assert ran == [
        "outer:model:before",
        "outer:model:after",
        "outer:tool:add:before",
        "plugged",
        "outer:tool:add:after",
        "outer:model:before",
        "outer:model:after",
        "plugin-function",
        "command",
    ]


async def test_disable_names_builtins_and_plugins_and_nothing_else(
    tmp_path: Path, plugin: str
) -> None:
    agent = Agent(Config(home=tmp_path / "a", hooks=HooksConfig(disable=["memory", "plugged"])))
    try:
        await agent.ready()
        assert "memory" not in agent.hooks and "plugged" not in agent.hooks
        assert "skills" in agent.hooks and "stopper" in agent.hooks
    finally:
        await agent.aclose()
    agent = Agent(Config(home=tmp_path / "b", hooks=HooksConfig(disable=["permisions"])))
    try:
        with pytest.raises(ConfigError, match=r"unknown hook\(s\) 'permisions'; the hooks are .*permissions"):
            await agent.ready()
        assert agent.hooks.names() == [], "nothing half-registered"
    finally:
        await agent.aclose()


async def test_a_broken_plugin_fails_the_warm_up_by_name_and_distribution(
    tmp_path: Path, site: Path, plugin: str
) -> None:
    source = "def make(agent):\n    return 42\n"
    install_dist(site, "crow-test-broken", "crow_test_broken", source, f"[{GROUP}]\nbroken = crow_test_broken:make\n")
    agent = Agent(Config(home=tmp_path / "home"), builtin_hooks=False)
    try:
        with pytest.raises(HookError) as err:
            await agent.ready()
        assert str(err.value) == (
            f"entry point {GROUP}:broken = crow_test_broken:make from crow-test-broken 0.1: "
            "failed to load: factory returned 42, not a crow.Hook"
        )
        assert agent.hooks.names() == [], "nothing half-registered (plugged loaded fine)"
    finally:
        await agent.aclose()


def test_the_builtins_are_crows_own_entry_points() -> None:
    """crow's builtins are declared like a plugin's, by the distribution discovery trusts."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == CROW_DISTRIBUTION
    declared = project["entry-points"][GROUP]
    assert set(declared) == {
        "tracing", "permissions", "plan", "checkpoints", "filesystem", "todolist", "skills", "memory",
        "summarization", "ask", "subagents",
    }  # fmt: skip
    assert all(value.startswith("builtin_hooks.") for value in declared.values())
    from importlib.metadata import entry_points

    installed = {ep.name for ep in entry_points(group=GROUP) if ep.dist and ep.dist.name == CROW_DISTRIBUTION}
    assert installed == set(declared), "reinstall crow (pip install -e .): its entry points changed"


# ------------------------------------------------------------------ public extension points
def _imports(path: Path) -> list[tuple[str, list[str]]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
    return found


def test_builtins_import_only_crows_public_names_and_never_each_other() -> None:
    wrong = []
    for path in sorted((ROOT / "builtin_hooks").glob("*.py")):
        for module, names in _imports(path):
            where = f"{path.name}: from {module} import {', '.join(names) or '*'}"
            if module == "builtin_hooks" or module.startswith("builtin_hooks."):
                wrong.append(where)  # a builtin never imports another
            elif module == "crow":
                wrong += [f"{where} ({n} is not in crow.__all__)" for n in names if n not in crow.__all__]
            elif module.startswith("crow."):
                wrong.append(where)
    assert wrong == []


def test_every_public_name_resolves() -> None:
    for name in crow.__all__:
        assert getattr(crow, name) is not None, name


def test_the_acp_client_offers_the_editor_client_protocol() -> None:
    from crow.acp.client import AcpSessionClient

    members = [n for n in vars(EditorClient) if not n.startswith("_")]
    assert {"ask_permission", "ask", "ask_choice", "read_text", "write_text", "run_in_terminal"} <= set(members)
    for name in members:
        ours, theirs = getattr(EditorClient, name), getattr(AcpSessionClient, name)
        assert list(inspect.signature(ours).parameters) == list(inspect.signature(theirs).parameters), name
    client = AcpSessionClient(None, "s", None, Path("/"))
    assert isinstance(client, EditorClient)
    assert {"can_read", "can_write", "can_terminal"} <= set(EditorClient.__annotations__)


def test_tool_servers_is_declared_on_hook() -> None:
    class Quiet(Hook):
        async def before_agent(self, ctx: HookContext) -> None: ...

    assert "tool_servers" in vars(Hook)
    assert list(Quiet().tool_servers(None)) == []  # type: ignore[arg-type]


async def test_turn_state_lives_for_one_prompt(tmp_path: Path, workspace: Path, llm: ScriptedLLM,
                                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("OPENAI_BASE_URL", llm.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    agent = Agent(Config(model="openai:scripted", home=tmp_path / "home"), builtin_hooks=False)
    seen: list[int] = []

    async def count(ctx: HookContext) -> None:
        ctx.turn_state["calls"] = ctx.turn_state.get("calls", 0) + 1
        seen.append(ctx.turn_state["calls"])

    agent.hooks.register("modify_request", count)
    llm.push(Reply(tool_calls=[ToolCallSpec("nope", {})]), Reply(text="a"), Reply(text="b"))

    async def ignore(event: Any) -> None:
        return None

    try:
        session = agent.create_session(str(workspace))
        await agent.run_turn(session, human("one"), ignore)  # two model calls
        await agent.run_turn(session, human("two"), ignore)  # one, with a fresh turn_state
    finally:
        await agent.aclose()
    assert seen == [1, 2, 1]


async def test_a_plugin_taking_a_builtins_name_is_named_with_its_distribution(
    tmp_path: Path, site: Path
) -> None:
    """A clash used to fail as "a hook named 'permissions' is already registered", whose only
    remedy, hooks.disable, switches off crow's permissions along with the plugin."""
    source = (
        "from crow import Hook\nclass P(Hook):\n    async def agent_stop(self, ctx):\n        return None\n"
    )
    install_dist(
        site, "crow-test-plugin", "crow_test_plugin", source, f"[{GROUP}]\npermissions = crow_test_plugin:P\n"
    )
    agent = Agent(Config(home=tmp_path / "home"))
    try:
        with pytest.raises(HookError) as err:
            await agent.ready()
        assert str(err.value) == (
            f"entry point {GROUP}:permissions = crow_test_plugin:P from crow-test-plugin 0.1: "
            f"the name 'permissions' is taken by entry point {GROUP}:permissions = "
            f"builtin_hooks.permissions:factory from {CROW_DISTRIBUTION} 0.1.0; "
            "hook names are unique: uninstall crow-test-plugin (hooks.disable would switch off both)"
        )
        assert agent.hooks.names() == [], "nothing half-registered"
    finally:
        await agent.aclose()
    agent = Agent(Config(home=tmp_path / "home2"), builtin_hooks=False)  # no clash without builtins
    try:
        await agent.ready()
        assert agent.hooks.names("agent_stop") == ["permissions", "project_commands"]
    finally:
        await agent.aclose()


async def test_a_plugin_that_exits_when_imported_fails_the_warm_up_by_name(
    tmp_path: Path, site: Path
) -> None:
    """SystemExit at import used to escape the warm-up into the agent's task group: every
    waiter got CancelledError and a server would exit, the plugin unnamed."""
    source = "raise SystemExit('crow_test_broken needs numpy')\n"
    install_dist(
        site, "crow-test-broken", "crow_test_broken", source, f"[{GROUP}]\nbroken = crow_test_broken:P\n"
    )
    agent = Agent(Config(home=tmp_path / "home"), builtin_hooks=False)
    try:
        with pytest.raises(HookError) as err:
            await agent.ready()
        assert str(err.value) == (
            f"entry point {GROUP}:broken = crow_test_broken:P from crow-test-broken 0.1: "
            "failed to load: it called sys.exit('crow_test_broken needs numpy')"
        )
    finally:
        await agent.aclose()
    (site / "crow_test_broken.py").write_text("raise RuntimeError('no config file')\n")
    agent = Agent(
        Config(home=tmp_path / "home", hooks=HooksConfig(extra=["crow_test_broken:P"], entry_points=False))
    )
    try:
        with pytest.raises(HookError, match=r"^hook 'crow_test_broken:P': importing crow_test_broken raised RuntimeError: no config file$"):
            await agent.ready()
    finally:
        await agent.aclose()


async def test_a_plugin_with_the_lowest_order_still_runs_inside_permissions(
    tmp_path: Path, workspace: Path, site: Path, llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/hooks.md: permissions wraps every hook that runs tools, whatever `order` says.
    In ask mode with no editor to ask, the call is refused before the plugin sees it."""
    seen = tmp_path / "seen.txt"
    source = (
        "import os\nfrom crow import Hook\n"
        "class First(Hook):\n    order = -1000\n"
        "    async def wrap_tool_call(self, ctx, call, call_next):\n"
        "        open(os.environ['CROW_TEST_ORDER_FILE'], 'a').write(call.name + '\\n')\n"
        "        return await call_next(call)\n"
    )
    install_dist(
        site, "crow-test-plugin", "crow_test_plugin", source, f"[{GROUP}]\nfirst = crow_test_plugin:First\n"
    )
    monkeypatch.setenv("CROW_TEST_ORDER_FILE", str(seen))
    monkeypatch.setenv("OPENAI_BASE_URL", llm.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    agent = Agent(Config(model="openai:scripted", home=tmp_path / "home", mode="ask"))

    try:
        session = await add_turn(agent, llm, workspace, "refused")
        assert agent.hooks.names("wrap_tool_call").index("permissions") < agent.hooks.names(
            "wrap_tool_call"
        ).index("first")
    finally:
        await agent.aclose()
    [result] = [m for m in session.messages if m.role == "tool"]
    assert result.is_error and result.content.startswith("Error: add needs the user's permission")
    assert not seen.exists(), "the plugin saw a call permissions refused"
