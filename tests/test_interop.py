"""Interop: clients nobody here wrote, driving crow and its MCP servers.

- the official TypeScript ACP SDK (@agentclientprotocol/sdk), through tests/interop/acp_client.mjs
- acpx, a headless ACP command-line client
- the MCP Inspector CLI (@modelcontextprotocol/inspector --cli) against crow's MCP servers

The npm packages (exact versions in tests/interop/package.json and package-lock.json) are
installed once into ~/.cache/crow-interop/<hash> (CROW_INTEROP_CACHE overrides the folder).
Without node/npm, or when the install fails (no registry), every test here is skipped.
Cached, the fast tests take ~15 s; the Inspector tool-call sweep (~20 s) is marked slow.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import crow_env
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec
from tests.support import npm

INTEROP = Path(__file__).parent / "interop"
LOCK_FILES = ("package.json", "package-lock.json")
CROW_CMD = [sys.executable, "-m", "crow"]
FS_TOOLS = {"ls", "read_file", "write_file", "edit_file", "glob", "grep", "execute"}

# the first run installs ~165 npm packages inside the first test's time budget
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="session")
def node_modules() -> Path:
    """The installed interop packages (`tests.support.npm`); skips without node or npm."""
    found = npm.node_modules()
    if isinstance(found, str):
        pytest.skip(found)
    return found


def _bin(node_modules: Path, package: str, name: str) -> Path:
    pkg_dir = node_modules / package
    bins = json.loads((pkg_dir / "package.json").read_text())["bin"]
    return pkg_dir / (bins if isinstance(bins, str) else bins[name])


def _node(
    args: list[str | Path], env: dict[str, str], cwd: Path, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["node", *map(str, args)], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def _client_env(llm: ScriptedLLM | None, home: Path, tmp_path: Path, **extra: str) -> dict[str, str]:
    """crow's environment, plus a throwaway HOME so npm tools keep their state out of ours."""
    user_home = tmp_path / "user-home"
    user_home.mkdir(exist_ok=True)
    return crow_env(llm, home, HOME=str(user_home), **extra)


# ------------------------------------------------------------------ TypeScript ACP SDK
def test_typescript_sdk_client(
    node_modules: Path, llm: ScriptedLLM, home: Path, workspace: Path, tmp_path: Path
) -> None:
    (workspace / "notes.txt").write_text("the secret is 42\n")
    llm.push(
        Reply(tool_calls=[ToolCallSpec("read_file", {"path": "notes.txt"})]),
        Reply(text="The file says the secret is 42."),
        Reply(tool_calls=[ToolCallSpec("write_file", {"path": "answer.txt", "content": "42\n"})]),
        Reply(text="Wrote answer.txt."),
        Reply(text="SUMMARY: read notes.txt, wrote answer.txt."),  # for _crow.compact
    )
    wire = tmp_path / "wire.ndjson"
    env = _client_env(llm, home, tmp_path, ACP_SDK_NODE_MODULES=str(node_modules))
    proc = _node(
        [
            INTEROP / "acp_client.mjs",
            "--cwd",
            workspace,
            "--wire",
            wire,
            "--prompt",
            "what is in notes.txt?",
            "--prompt",
            "write the answer to answer.txt",
            "--",
            *CROW_CMD,
        ],
        env,
        cwd=workspace,
    )
    evidence = f"stderr:\n{proc.stderr[-3000:]}\nwire:\n{wire.read_text()[-6000:] if wire.exists() else ''}"
    assert proc.returncode == 0, evidence
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["handlerErrors"] == [], evidence
    assert summary["sdkVersion"] == "2.4.0"
    assert summary["protocolVersion"] == 1 and summary["agentName"] == "crow"
    assert summary["extensions"] == ["crow.compact", "crow.rewind", "session/steering"]
    assert summary["stopReasons"] == ["end_turn", "end_turn"], evidence

    # the SDK validated every session/update against its schema and routed it to the handler
    kinds = summary["updateKinds"]
    for kind in (
        "available_commands_update",
        "tool_call",
        "tool_call_update",
        "agent_message_chunk",
        "usage_update",
    ):
        assert kind in kinds, (kind, kinds)
    calls = list(summary["toolCalls"].values())
    assert [c["statuses"] for c in calls] == [["pending", "in_progress", "completed"]] * 2, evidence
    read, write = calls
    assert read["kind"] == "read" and read["rawInput"] == {"path": "notes.txt"}
    assert any("the secret is 42" in text for text in read["content"])
    assert write["kind"] == "edit"
    assert summary["text"] == "The file says the secret is 42.Wrote answer.txt."

    # mode "ask": the write waited for the TypeScript client's permission answer
    assert len(summary["permissionRequests"]) == 1, evidence
    assert "allow_once" in summary["permissionRequests"][0]["options"]
    assert (workspace / "answer.txt").read_text() == "42\n"
    tool_results = [m for m in llm.requests[1].messages if m["role"] == "tool"]
    assert "the secret is 42" in tool_results[0]["content"]

    # extension methods: `_crow.compact` on the wire, a real compaction, -32601 for unknown ones
    compact = summary["compact"]
    assert summary["compactError"] is None, evidence
    assert compact["compacted"] is True, compact
    assert "wrote answer.txt" in compact["summary"]
    assert compact["messagesAfter"] < compact["messagesBefore"] == 8
    assert summary["unknownMethodError"]["code"] == -32601
    sent = [json.loads(line)["msg"] for line in wire.read_text().splitlines()]
    assert any(m.get("method") == "_crow.compact" for m in sent)
    assert summary["agentExit"] == {"code": 0, "signal": None}, "crow should exit when stdin closes"


# ------------------------------------------------------------------ acpx
def _acpx(node_modules: Path, workspace: Path, *args: str) -> list[str]:
    return [
        str(_bin(node_modules, "acpx", "acpx")),
        "--agent",
        shlex.join(CROW_CMD),
        "--cwd",
        str(workspace),
        "--timeout",
        "60",
        *args,
    ]


def test_acpx_exec_answers(
    node_modules: Path, llm: ScriptedLLM, home: Path, workspace: Path, tmp_path: Path
) -> None:
    (workspace / "notes.txt").write_text("the secret is 42\n")
    llm.push(
        Reply(tool_calls=[ToolCallSpec("read_file", {"path": "notes.txt"})]),
        Reply(text="The file says the secret is 42."),
    )
    env = _client_env(llm, home, tmp_path)
    proc = _node(
        _acpx(node_modules, workspace, "--approve-reads", "--format", "quiet", "exec", "read notes.txt"),
        env,
        cwd=workspace,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "The file says the secret is 42.", proc.stdout
    # acpx advertises fs: crow read the file through the client, and the model saw it
    tool_results = [m for m in llm.requests[1].messages if m["role"] == "tool"]
    assert "the secret is 42" in tool_results[0]["content"]


def _acpx_json(proc: subprocess.CompletedProcess[str]) -> tuple[list[dict[str, Any]], dict[str, list[Any]]]:
    """acpx --format json prints the ACP wire as NDJSON: the messages, and requests by method."""
    messages = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    by_method: dict[str, list[dict[str, Any]]] = {}
    for m in messages:
        if "method" in m:
            by_method.setdefault(m["method"], []).append(m)
    return messages, by_method


def _write_through_acpx(
    node_modules: Path, llm: ScriptedLLM, home: Path, workspace: Path, tmp_path: Path
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]], dict[str, list[Any]]]:
    llm.push(
        Reply(tool_calls=[ToolCallSpec("write_file", {"path": "out/answer.txt", "content": "42\n"})]),
        Reply(text="Saved the answer."),
    )
    env = _client_env(llm, home, tmp_path)
    proc = _node(
        _acpx(node_modules, workspace, "--approve-all", "--format", "json", "exec", "save 42"),
        env,
        cwd=workspace,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, *_acpx_json(proc)


def test_acpx_permission_and_client_fs_overwrite(
    node_modules: Path, llm: ScriptedLLM, home: Path, workspace: Path, tmp_path: Path
) -> None:
    (workspace / "out").mkdir()
    (workspace / "out" / "answer.txt").write_text("old\n")
    proc, messages, by_method = _write_through_acpx(node_modules, llm, home, workspace, tmp_path)
    # crow asked (mode "ask"), acpx approved, and crow wrote through acpx's fs/write_text_file
    requests = by_method.get("session/request_permission", [])
    assert len(requests) == 1, proc.stdout[-4000:]
    assert requests[0]["params"]["toolCall"]["content"][0]["type"] == "diff"
    writes = by_method.get("fs/write_text_file", [])
    assert [w["params"]["path"] for w in writes] == [str(workspace / "out" / "answer.txt")], proc.stdout[
        -4000:
    ]
    assert (workspace / "out" / "answer.txt").read_text() == "42\n"
    updates = [m["params"]["update"] for m in by_method["session/update"]]
    done = [u for u in updates if u["sessionUpdate"] == "tool_call_update" and u.get("status") == "completed"]
    assert done and done[0]["content"][0] == {
        "type": "diff",
        "path": str(workspace / "out" / "answer.txt"),
        "oldText": "old\n",
        "newText": "42\n",
    }, updates
    text = "".join(u["content"]["text"] for u in updates if u["sessionUpdate"] == "agent_message_chunk")
    assert text == "Saved the answer."
    results = [
        m["result"] for m in messages if isinstance(m.get("result"), dict) and "stopReason" in m["result"]
    ]
    assert results == [{"stopReason": "end_turn"}]


def test_acpx_creates_a_new_file_through_client_fs(
    node_modules: Path, llm: ScriptedLLM, home: Path, workspace: Path, tmp_path: Path
) -> None:
    """Before writing, crow reads the old content through fs/read_text_file (for the diff).
    For a file that does not exist yet, acpx answers with the ACP error -32002 "Resource not
    found"; write_file must treat that as "new file", not fail."""
    proc, _messages, by_method = _write_through_acpx(node_modules, llm, home, workspace, tmp_path)
    wire = "\n".join(
        line
        for line in proc.stdout.splitlines()
        if '"fs/' in line or '"status":"failed"' in line or '"error"' in line
    )
    updates = [m["params"]["update"] for m in by_method["session/update"]]
    statuses = [u.get("status") for u in updates if u["sessionUpdate"] == "tool_call_update"]
    assert statuses[-1] == "completed", f"write_file of a new file failed under acpx; wire:\n{wire}"
    assert [w["params"]["path"] for w in by_method.get("fs/write_text_file", [])] == [
        str(workspace / "out" / "answer.txt")
    ]
    assert (workspace / "out" / "answer.txt").read_text() == "42\n"


# ------------------------------------------------------------------ MCP Inspector CLI
def _inspect(
    node_modules: Path, env: dict[str, str], cwd: Path, server: list[str], *args: str
) -> tuple[int, Any, str]:
    inspector = _bin(node_modules, "@modelcontextprotocol/inspector", "mcp-inspector")
    proc = _node([inspector, "--cli", *server, *args, "--format", "json"], env, cwd=cwd, timeout=60)
    try:
        payload = json.loads(proc.stdout)
    except ValueError:
        payload = None
    return proc.returncode, payload, proc.stderr


def _call(
    node_modules: Path, env: dict[str, str], cwd: Path, server: list[str], tool: str, args: dict[str, Any]
) -> tuple[int, Any, str]:
    return _inspect(
        node_modules,
        env,
        cwd,
        server,
        "--method",
        "tools/call",
        "--tool-name",
        tool,
        "--tool-args-json",
        json.dumps(args),
    )


def _text(result: dict[str, Any]) -> str:
    return "".join(c.get("text", "") for c in result["content"])


@pytest.fixture
def fs_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("def main():\n    return 'hello'\n")
    (root / "README.md").write_text("# demo\nTODO: write the docs\n")
    return root


def test_inspector_lists_tools(node_modules: Path, tmp_path: Path, fs_root: Path) -> None:
    env = _client_env(None, tmp_path / "crow-home", tmp_path)
    fs = [sys.executable, "-m", "mcp_servers.filesystem", "--root", str(fs_root)]
    todos = [sys.executable, "-m", "mcp_servers.todos"]
    with ThreadPoolExecutor(2) as pool:  # --strict: exit 6 on error-severity schema problems
        fs_list, todo_list = pool.map(
            lambda server: _inspect(
                node_modules, env, tmp_path, server, "--method", "tools/list", "--strict"
            ),
            [fs, todos],
        )
    for rc, payload, stderr in (fs_list, todo_list):
        assert rc == 0 and payload is not None, stderr[-3000:]
    fs_tools = {t["name"]: t for t in fs_list[1]["result"]["tools"]}
    assert set(fs_tools) == FS_TOOLS
    assert fs_tools["read_file"]["annotations"]["readOnlyHint"] is True
    assert fs_tools["write_file"]["inputSchema"]["required"] == ["path", "content"]
    assert [t["name"] for t in todo_list[1]["result"]["tools"]] == ["write_todos"]


@pytest.mark.slow  # ten Inspector runs, each spawning node and a Python MCP server: ~20 s
def test_inspector_calls_every_tool(node_modules: Path, tmp_path: Path, fs_root: Path) -> None:
    env = _client_env(None, tmp_path / "crow-home", tmp_path)
    fs = [sys.executable, "-m", "mcp_servers.filesystem", "--root", str(fs_root)]
    todos = [sys.executable, "-m", "mcp_servers.todos"]
    todo_items = [
        {"id": "1", "title": "list files", "status": "done"},
        {"id": "2", "title": "write docs", "status": "in_progress"},
    ]
    independent = {
        "ls": (fs, "ls", {"path": "."}),
        "read_file": (fs, "read_file", {"path": "src/app.py"}),
        "glob": (fs, "glob", {"pattern": "**/*.py"}),
        "grep": (fs, "grep", {"pattern": "TODO"}),
        "execute": (fs, "execute", {"command": "echo interop-$((6 * 7)); exit 3"}),
        "missing": (fs, "read_file", {"path": "nope.txt"}),
        "escape": (fs, "read_file", {"path": "../outside.txt"}),
        "write_todos": (todos, "write_todos", {"todos": todo_items}),
    }

    def write_then_edit() -> list[tuple[int, Any, str]]:
        wrote = _call(
            node_modules, env, tmp_path, fs, "write_file", {"path": "out/new.txt", "content": "alpha\nbeta\n"}
        )
        edited = _call(
            node_modules,
            env,
            tmp_path,
            fs,
            "edit_file",
            {"path": "out/new.txt", "old_text": "beta", "new_text": "gamma"},
        )
        return [wrote, edited]

    with ThreadPoolExecutor(4) as pool:
        chain = pool.submit(write_then_edit)
        futures = {k: pool.submit(_call, node_modules, env, tmp_path, *v) for k, v in independent.items()}
        got = {k: f.result() for k, f in futures.items()}
        wrote, edited = chain.result()

    def ok(name: str, outcome: tuple[int, Any, str]) -> dict[str, Any]:
        rc, payload, stderr = outcome
        assert rc == 0 and payload is not None, (name, rc, stderr[-2000:])
        assert payload["result"].get("isError") is False, (name, payload)
        return payload["result"]

    ls = ok("ls", got["ls"])
    entries = {e["name"]: e["type"] for e in ls["structuredContent"]["entries"]}
    assert entries.items() >= {"README.md": "file", "src": "dir"}.items()  # "out/" may be there too
    assert "README.md" in _text(ls)
    assert "1\tdef main():" in _text(ok("read_file", got["read_file"]))
    assert "src/app.py" in _text(ok("glob", got["glob"]))
    assert "README.md" in _text(ok("grep", got["grep"]))
    execute = ok("execute", got["execute"])
    assert "interop-42" in _text(execute) and execute["structuredContent"]["exit_code"] == 3
    todos_result = ok("write_todos", got["write_todos"])
    assert todos_result["structuredContent"] == {"todos": todo_items}
    assert "1 in progress" in _text(todos_result)

    # tool errors reach the client as isError results with a readable message (exit 5)
    for name, needle in (("missing", "nope.txt"), ("escape", "outside")):
        rc, payload, stderr = got[name]
        assert rc != 0 and payload is not None, (name, stderr[-2000:])
        assert payload["result"]["isError"] is True and needle in _text(payload["result"]), payload

    assert "created" in _text(ok("write_file", wrote))
    assert "out/new.txt" in _text(ok("edit_file", edited))
    assert (fs_root / "out" / "new.txt").read_text() == "alpha\ngamma\n"


def test_the_scripted_typescript_client_drives_a_session(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """tests/support/ts_client.py, the driver the schema-1.25 tests use, works end to end."""
    from tests.support.ts_client import kinds, run_script

    llm.push(Reply(text="hello from crow"))
    out = run_script(
        {
            "steps": [
                {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "s"},
                {
                    "request": "session/prompt",
                    "params": {"sessionId": "${s.sessionId}", "prompt": [{"type": "text", "text": "hi"}]},
                    "as": "p",
                },
                {"request": "session/list", "params": {}, "as": "list"},
            ]
        },
        crow_env(llm, home),
        workspace,
    )
    assert out["sdkVersion"] == "2.4.0"
    assert out["results"]["p"]["result"]["stopReason"] == "end_turn"
    assert "agent_message_chunk" in kinds(out)
    assert [s["sessionId"] for s in out["results"]["list"]["result"]["sessions"]] == [
        out["results"]["s"]["result"]["sessionId"]
    ]
