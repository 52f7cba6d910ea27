"""End to end (crow spawned, driven over ACP): no secret reaches a process started for the
model, the sandbox is on by default, and without bubblewrap the user is told once."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import acp
import pytest
from acp.schema import ClientCapabilities, EnvVariable, McpServerStdio

from tests.conftest import crow_env, spawn_crow
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(sys.platform != "linux", reason="bubblewrap is Linux-only"),
]
SUPPORT = Path(__file__).parent / "support"
SECRETS = {
    "OPENAI_API_KEY": "sk-openai-SECRET-1",
    "ANTHROPIC_API_KEY": "sk-ant-SECRET-2",
    "MYLLM": "custom-SECRET-3",  # no secret-looking name: a secret because a provider reads it
    "GITHUB_TOKEN": "ghp-SECRET-4",
}


def run(command: str) -> ToolCallSpec:
    return ToolCallSpec(name="execute", arguments={"command": command})


def tool_results(llm: ScriptedLLM, request: int = 1) -> list[str]:
    return [m["content"] for m in llm.requests[request].messages if m["role"] == "tool"]


def results_by_tool(llm: ScriptedLLM, request: int = 1) -> dict[str, str]:
    messages = llm.requests[request].messages
    names = {c["id"]: c["name"] for m in messages for c in m.get("tool_calls") or []}
    return {names[m["tool_call_id"]]: m["content"] for m in messages if m["role"] == "tool"}


async def start(conn, workspace: Path, caps=None, servers=None) -> str:  # type: ignore[no-untyped-def]
    await conn.initialize(protocol_version=1, client_capabilities=caps)
    return (await conn.new_session(cwd=str(workspace), mcp_servers=servers or [])).session_id


def assert_clean(text: str, shows: str = "PATH=") -> None:
    """`text` is an environment (`env` output, or JSON with `shows='"PATH"'`) without secrets."""
    assert shows in text, text[:500]
    for name, value in SECRETS.items():
        assert value not in text, f"{name} leaked: {text[:2000]}"


async def test_no_secret_reaches_execute_a_command_hook_or_a_stdio_mcp_server(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (home / "config.yaml").write_text(
        "providers:\n  mine: {kind: openai, api_key_env: MYLLM, base_url: http://127.0.0.1:9}\n"
        "hooks:\n  commands:\n    - {command: 'env > hook-env.txt', phases: [before_agent]}\n"
    )
    servers = [
        McpServerStdio(
            name="envdump",
            command=sys.executable,
            args=[str(SUPPORT / "env_mcp.py")],
            env=[EnvVariable(name="FROM_THE_ENTRY", value="entry-value")],
        )
    ]
    llm.push(Reply(tool_calls=[run("env"), ToolCallSpec(name="environ", arguments={})]), Reply(text="ok"))
    env = crow_env(llm, home, CROW_MODE="yolo", **SECRETS)
    async with spawn_crow(env) as (conn, _proc, _client):
        sid = await start(conn, workspace, servers=servers)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("show me the environment")])
    # crow itself still has the key: the model server received it
    assert llm.requests[0].headers["authorization"] == f"Bearer {SECRETS['OPENAI_API_KEY']}"
    results = results_by_tool(llm)
    assert_clean(results["execute"])
    server_env = results["environ"]
    assert_clean(server_env, shows='"PATH"')
    assert json.loads(server_env)["FROM_THE_ENTRY"] == "entry-value"
    assert_clean((workspace / "hook-env.txt").read_text())


async def test_the_editor_terminal_gets_no_secret_either(
    llm: ScriptedLLM, home: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The test client plays the editor: its terminals start from its environment, which
    # here holds the keys too (as an editor launched from the user's shell would).
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    (home / "config.yaml").write_text("providers:\n  mine: {kind: openai, api_key_env: MYLLM}\n")
    llm.push(Reply(tool_calls=[run("env")]), Reply(text="ok"))
    # sandbox off: with a sandbox the command would not run in the editor terminal at all
    env = crow_env(llm, home, CROW_MODE="yolo", CROW_SANDBOX="off", **SECRETS)
    async with spawn_crow(env) as (conn, _proc, client):
        sid = await start(conn, workspace, ClientCapabilities(terminal=True))
        await conn.prompt(session_id=sid, prompt=[acp.text_block("env")])
    assert len(client.terminals) == 1  # it did run in the editor's terminal
    assert_clean(tool_results(llm)[0])


@pytest.fixture
def outside() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="crow-e2e-sandbox-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_the_sandbox_is_on_by_default_and_the_editor_terminal_does_not_bypass_it(
    llm: ScriptedLLM, home: Path, workspace: Path, outside: Path
) -> None:
    assert shutil.which("bwrap"), "this test needs bubblewrap installed"
    trace = outside / "trace.jsonl"
    llm.push(
        Reply(
            tool_calls=[run(f"echo in > inside.txt; echo out > {outside}/escaped; ls {home}; cat {trace}")]
        ),
        Reply(text="ok"),
    )
    (home / "crow-home-marker").write_text("x")
    env = crow_env(llm, home, CROW_MODE="yolo", CROW_TRACE=str(trace))
    async with spawn_crow(env) as (conn, _proc, client):
        sid = await start(conn, workspace, ClientCapabilities(terminal=True))
        await conn.prompt(session_id=sid, prompt=[acp.text_block("try")])
    result = tool_results(llm)[0]
    assert "llm.call" in trace.read_text() and "llm.call" not in result  # the trace is hidden
    assert (workspace / "inside.txt").read_text() == "in\n"
    assert not (outside / "escaped").exists() and "Read-only file system" in result
    assert "crow-home-marker" not in result and "crow.db" not in result  # CROW_HOME hidden
    assert client.terminals == {}  # ran locally under bubblewrap, not in the editor's terminal
    assert "without a sandbox" not in client.text()


async def test_without_bubblewrap_the_user_is_told_once_and_commands_still_run(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(
        Reply(tool_calls=[run("echo first-ran")]),
        Reply(text="ok"),
        Reply(tool_calls=[run("echo second-ran")]),
        Reply(text="ok"),
    )
    env = crow_env(llm, home, CROW_MODE="yolo", PATH="/nonexistent")  # no bwrap to be found
    async with spawn_crow(env) as (conn, _proc, client):
        sid = await start(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("one")])
        await conn.prompt(session_id=sid, prompt=[acp.text_block("two")])
    assert "first-ran" in tool_results(llm, 1)[0] and "second-ran" in tool_results(llm, 3)[-1]
    told = client.text().count("Commands run without a sandbox")
    assert told == 1, client.text()
    assert "bubblewrap (bwrap) is not installed" in client.text()
    log = (home / "stderr.log").read_text()
    assert log.count("commands run unsandboxed") == 1, log


async def test_sandbox_off_runs_unsandboxed_without_a_notice(
    llm: ScriptedLLM, home: Path, workspace: Path, outside: Path
) -> None:
    llm.push(Reply(tool_calls=[run(f"echo out > {outside}/written")]), Reply(text="ok"))
    env = crow_env(llm, home, CROW_MODE="yolo", CROW_SANDBOX="off")
    async with spawn_crow(env) as (conn, _proc, client):
        sid = await start(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
    assert (outside / "written").read_text() == "out\n"
    assert "sandbox" not in client.text()


async def test_the_file_tools_do_not_touch_crow_home_inside_the_workspace(
    llm: ScriptedLLM, tmp_path: Path
) -> None:
    # crow started in $HOME (CROW_HOME is ~/.crow): as execute's sandbox hides it, so must the
    # file tools; else an auto-approved edit rewrites the user's config or trust and owns the
    # next start, and a read shows every stored conversation.
    user = tmp_path / "user"
    home = user / ".crow"
    home.mkdir(parents=True)
    (home / "config.yaml").write_text("mode: accept_edits\n")
    (user / "notes.txt").write_text("mine\n")
    calls = [
        ToolCallSpec("write_file", {"path": ".crow/config.yaml", "content": "mode: yolo\n"}),
        ToolCallSpec(
            "edit_file", {"path": f"{home}/config.yaml", "old_text": "accept_edits", "new_text": "yolo"}
        ),
        ToolCallSpec("write_file", {"path": ".crow/trust.json", "content": "{}"}),
        ToolCallSpec("read_file", {"path": ".crow/config.yaml"}),
        ToolCallSpec("ls", {"path": ".crow"}),
        # the rest of the workspace is as usual
        ToolCallSpec("write_file", {"path": "notes.txt", "content": "changed\n"}),
        ToolCallSpec("glob", {"pattern": "**/*"}),
        ToolCallSpec("grep", {"pattern": "accept_edits", "output_mode": "files_with_matches"}),
        ToolCallSpec("grep", {"pattern": "accept_edits", "path": "."}),
    ]
    llm.push(Reply(tool_calls=calls), Reply(text="done"))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        sid = await start(conn, user)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("take over")])
    results = tool_results(llm)
    assert sum("the file tools do not reach it" in r for r in results) == 5, results
    assert "Wrote 8 bytes to notes.txt (overwrote)." in results
    listed = [r for r in results if "the file tools do not reach it" not in r]
    assert len(listed) == 4 and sum("notes.txt" in r for r in listed) == 2, listed  # glob, write_file
    assert not any("config.yaml" in r or "mode: accept_edits" in r for r in listed), listed
    assert (home / "config.yaml").read_text() == "mode: accept_edits\n"
    assert not (home / "trust.json").exists()
    assert (user / "notes.txt").read_text() == "changed\n"
