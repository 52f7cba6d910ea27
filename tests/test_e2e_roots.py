"""End to end, multi-root workspaces (ACP `additionalDirectories`): crow spawned and driven
by the Python SDK client and by the official TypeScript SDK 2.4.0 client. The model reads,
writes, greps and runs commands in a second root by absolute path; the sandbox lets it write
there and nowhere else; `session/list` shows the roots; `session/load`, `resume` and `fork`
take the list the client sends; bad input is refused with -32602 and stores nothing; a
symlink out of a root is refused, through the editor's fs methods too."""

from __future__ import annotations

import shutil
import sqlite3
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import acp
import pytest
from acp.schema import ClientCapabilities, FileSystemCapabilities

from crow.private import DB_FILE
from crow.store import SCHEMA_VERSION
from tests.conftest import RecordingClient, crow_env, initialize_125, spawn_crow
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec
from tests.support.ts_client import run_script
from tests.test_startup import run_python

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(sys.platform != "linux", reason="the sandbox (bubblewrap) is Linux-only"),
]


@pytest.fixture
def dirs() -> Iterator[dict[str, Path]]:
    """The main root, two more roots, and a folder outside them all, off /tmp (which the
    sandbox replaces with its own): each with a file saying where it is. `second/escape` is a
    symlink to the outside folder, `third.txt` a file (not a folder)."""
    base = Path(tempfile.mkdtemp(prefix="crow-e2e-roots-", dir="/var/tmp"))
    made = {name: base / name for name in ("main", "second", "third", "outside")}
    for name, folder in made.items():
        folder.mkdir()
        (folder / "where.txt").write_text(f"{name.upper()} needle\n")
    (made["second"] / "escape").symlink_to(made["outside"])
    made["file"] = base / "third.txt"
    made["file"].write_text("not a folder\n")
    yield made
    shutil.rmtree(base, ignore_errors=True)


def tool(name: str, call_id: str, **args: Any) -> ToolCallSpec:
    return ToolCallSpec(name=name, arguments=args, id=call_id)


def results(llm: ScriptedLLM, request: int) -> dict[str, str]:
    """Tool results the model got in request `request`, by tool call id."""
    return {m["tool_call_id"]: m["content"] for m in llm.requests[request].messages if m["role"] == "tool"}


def listed_roots(sessions: list[Any]) -> dict[str, list[str] | None]:
    return {s.session_id: s.additional_directories for s in sessions}


async def test_a_session_with_two_roots_reads_writes_greps_and_runs_in_the_second(
    llm: ScriptedLLM, home: Path, dirs: dict[str, Path]
) -> None:
    main, second, outside = dirs["main"], dirs["second"], dirs["outside"]
    llm.push(
        Reply(
            tool_calls=[
                tool("read_file", "read2", path=f"{second}/where.txt"),
                tool("read_file", "read1", path="where.txt"),  # relative: the main root
                tool("grep", "grep2", pattern="needle", path=str(second)),
                tool("glob", "glob2", pattern="*.txt", path=str(second)),
                tool("ls", "ls2", path=str(second)),
                tool("write_file", "write2", path=f"{second}/new/made.txt", content="alpha\n"),
                tool("read_file", "escape", path=f"{second}/escape/where.txt"),
                tool("read_file", "out", path=f"{outside}/where.txt"),
                tool("write_file", "out_write", path=f"{outside}/pwned.txt", content="x"),
            ]
        ),
        Reply(
            tool_calls=[
                tool("edit_file", "edit2", path=f"{second}/new/made.txt", old_text="alpha", new_text="beta"),
                tool("execute", "run", command=f"echo in > {second}/ran.txt; echo out > {outside}/ran.txt"),
            ]
        ),
        Reply(text="done"),
    )
    async with spawn_crow(crow_env(llm, home, CROW_MODE="yolo")) as (conn, _proc, client):
        init = await initialize_125(conn)
        assert init["agentCapabilities"]["sessionCapabilities"]["additionalDirectories"] == {}
        new = await conn.new_session(
            cwd=str(main), mcp_servers=[], additional_directories=[str(second), str(main), f"{second}/"]
        )
        await conn.prompt(session_id=new.session_id, prompt=[acp.text_block("work in both roots")])
        listed = await conn.list_sessions()
        starts = {u.tool_call_id: u for u in client.of_type("ToolCallStart")}

    # the roots collapse (the cwd and a second spelling of a root), are listed and told
    assert listed_roots(listed.sessions) == {new.session_id: [str(second)]}
    assert f"more roots, reached by absolute path: {second}" in llm.requests[0].system
    first, second_batch = results(llm, 1), results(llm, 2)
    assert "SECOND needle" in first["read2"] and "MAIN needle" in first["read1"]
    assert f"{second}/where.txt:1:SECOND needle" in first["grep2"]
    assert "OUTSIDE" not in first["grep2"]  # the symlink out is not followed
    assert first["glob2"] == f"{second}/where.txt"
    assert "where.txt" in first["ls2"] and "escape@" in first["ls2"]
    assert "Wrote 6 bytes" in first["write2"]
    for call_id in ("escape", "out", "out_write"):
        assert "outside the workspace" in first[call_id], first[call_id]
    assert "1 replacement" in second_batch["edit2"]
    assert (second / "new/made.txt").read_text() == "beta\n"
    # execute, sandboxed: the second root is writable, the outside folder is not
    assert (second / "ran.txt").read_text() == "in\n"
    assert not (outside / "ran.txt").exists() and not (outside / "pwned.txt").exists()
    assert "Read-only file system" in second_batch["run"]
    # the editor is shown where each call looks: absolute, in the second root
    assert [loc.path for loc in starts["read2"].locations] == [f"{second}/where.txt"]


async def test_bad_additional_directories_are_refused_and_nothing_is_stored(
    llm: ScriptedLLM, home: Path, dirs: dict[str, Path]
) -> None:
    main, second = dirs["main"], dirs["second"]
    bad = {
        "relative/path": "must be an absolute path",
        str(dirs["outside"] / "missing"): "does not exist",
        str(dirs["file"]): "is not a directory",
        f"{second}\x00x": "must be valid Unicode without NUL",
    }
    llm.default = lambda req: Reply(text="fine")
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        await conn.initialize(protocol_version=1)
        for entry, why in bad.items():
            with pytest.raises(acp.RequestError) as err:
                await conn.new_session(
                    cwd=str(main), mcp_servers=[], additional_directories=[str(second), entry]
                )
            assert err.value.code == -32602
            assert f"additionalDirectories[1] {why}" in str(err.value), str(err.value)
            assert err.value.data == {
                "additionalDirectories": str(err.value).removeprefix("Invalid params: ")
            }
        assert (await conn.list_sessions()).sessions == []
        sid = (
            await conn.new_session(cwd=str(main), mcp_servers=[], additional_directories=[str(second)])
        ).session_id
        await conn.prompt(session_id=sid, prompt=[acp.text_block("hello")])

    # a fresh crow: load, resume and fork with a bad list change nothing
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        await conn.initialize(protocol_version=1)
        for entry, why in bad.items():
            for method in (conn.load_session, conn.resume_session, conn.fork_session):
                with pytest.raises(acp.RequestError) as err:
                    await method(
                        session_id=sid, cwd=str(main), mcp_servers=[], additional_directories=[entry]
                    )
                assert err.value.code == -32602 and f"additionalDirectories[0] {why}" in str(err.value)
        assert listed_roots((await conn.list_sessions()).sessions) == {sid: [str(second)]}
        with pytest.raises(acp.RequestError) as err:
            await conn.prompt(session_id=sid, prompt=[acp.text_block("not loaded")])
        assert err.value.code == -32002  # a refused load left nothing in memory either
        await conn.load_session(
            session_id=sid, cwd=str(main), mcp_servers=[], additional_directories=[str(second)]
        )
        result = await conn.prompt(session_id=sid, prompt=[acp.text_block("still usable")])
        assert result.stop_reason == "end_turn"


async def test_load_resume_and_fork_take_the_roots_the_client_sends(
    llm: ScriptedLLM, home: Path, dirs: dict[str, Path]
) -> None:
    main, second, third = dirs["main"], dirs["second"], dirs["third"]

    def reads(turn: str, *paths: Path) -> Reply:  # ids unique in the history: a reused one is renamed
        calls = [tool("read_file", f"{turn}{i}", path=f"{p}/where.txt") for i, p in enumerate(paths)]
        return Reply(tool_calls=calls)

    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        await conn.initialize(protocol_version=1)
        sid = (
            await conn.new_session(cwd=str(main), mcp_servers=[], additional_directories=[str(second)])
        ).session_id
        llm.push(Reply(text="first"))
        await conn.prompt(session_id=sid, prompt=[acp.text_block("first")])

    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        await conn.initialize(protocol_version=1)
        # load: the list sent is the session's roots now (third replaces second)
        await conn.load_session(
            session_id=sid, cwd=str(main), mcp_servers=[], additional_directories=[str(third)]
        )
        llm.push(reads("load", second, third), Reply(text="ok"))
        await conn.prompt(session_id=sid, prompt=[acp.text_block("after load")])
        got = results(llm, -1)
        assert "outside the workspace" in got["load0"] and "THIRD needle" in got["load1"]
        assert f"more roots, reached by absolute path: {third}" in llm.requests[-1].system
        assert listed_roots((await conn.list_sessions()).sessions) == {sid: [str(third)]}

        # resume of the live session with no list: no other root (its tools are rebuilt)
        await conn.resume_session(session_id=sid, cwd=str(main), mcp_servers=[])
        llm.push(reads("resume", third), Reply(text="ok"))
        await conn.prompt(session_id=sid, prompt=[acp.text_block("after resume")])
        assert "outside the workspace" in results(llm, -1)["resume0"]
        assert "more roots" not in llm.requests[-1].system

        # fork with a list: the copy has those roots, the source keeps its own
        fork = await conn.fork_session(
            session_id=sid, cwd=str(main), mcp_servers=[], additional_directories=[str(second), str(third)]
        )
        llm.push(reads("fork", second, third), Reply(text="ok"))
        await conn.prompt(session_id=fork.session_id, prompt=[acp.text_block("in the fork")])
        got = results(llm, -1)
        assert "SECOND needle" in got["fork0"] and "THIRD needle" in got["fork1"]
        assert listed_roots((await conn.list_sessions()).sessions) == {
            sid: None,
            fork.session_id: [str(second), str(third)],
        }


class FsRecordingClient(RecordingClient):
    """The editor's fs methods, recording each path crow asks for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[str, str]] = []

    async def read_text_file(self, path: str, session_id: str, **kwargs: Any) -> Any:
        self.asked.append(("read", path))
        return await super().read_text_file(path, session_id, **kwargs)

    async def write_text_file(self, content: str, path: str, session_id: str, **kwargs: Any) -> Any:
        self.asked.append(("write", path))
        return await super().write_text_file(content, path, session_id, **kwargs)


async def test_the_editors_fs_methods_get_the_same_confinement(
    llm: ScriptedLLM, home: Path, dirs: dict[str, Path]
) -> None:
    main, second, outside = dirs["main"], dirs["second"], dirs["outside"]
    llm.push(
        Reply(
            tool_calls=[
                tool("read_file", "read2", path=f"{second}/where.txt"),
                tool("write_file", "write2", path=f"{second}/by-editor.txt", content="hi\n"),
                tool("read_file", "escape", path=f"{second}/escape/where.txt"),
                tool("write_file", "out", path=f"{outside}/by-editor.txt", content="x"),
            ]
        ),
        Reply(text="done"),
    )
    client = FsRecordingClient()
    caps = ClientCapabilities(fs=FileSystemCapabilities(read_text_file=True, write_text_file=True))
    async with spawn_crow(crow_env(llm, home, CROW_MODE="yolo"), client=client) as (conn, _proc, _):
        await conn.initialize(protocol_version=1, client_capabilities=caps)
        sid = (
            await conn.new_session(cwd=str(main), mcp_servers=[], additional_directories=[str(second)])
        ).session_id
        await conn.prompt(session_id=sid, prompt=[acp.text_block("through the editor")])
    got = results(llm, 1)
    assert "SECOND needle" in got["read2"] and "Wrote 3 bytes" in got["write2"]
    assert "outside the workspace" in got["escape"] and "outside the workspace" in got["out"]
    assert client.files == {f"{second}/by-editor.txt": "hi\n"}
    assert sorted(set(client.asked)) == [
        ("read", f"{second}/by-editor.txt"),  # write_file reads the old text first
        ("read", f"{second}/where.txt"),
        ("write", f"{second}/by-editor.txt"),
    ], "the refused paths never reached the editor"


async def test_sessions_of_a_store_from_before_roots_stay_loadable(
    llm: ScriptedLLM, home: Path, dirs: dict[str, Path]
) -> None:
    main, second = dirs["main"], dirs["second"]
    llm.default = lambda req: Reply(text=f"re: {req.last_user_text}")
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(main), mcp_servers=[])).session_id
        await conn.prompt(session_id=sid, prompt=[acp.text_block("from the old days")])
    # Make the store what crow wrote before this column existed (schema version 1).
    db = sqlite3.connect(home / DB_FILE)
    db.execute("DROP INDEX sessions_by_parent")  # version 5
    for later in ("additional_directories", "cost", "thought_level", "parent_id"):  # versions 2, 3, 5
        db.execute(f"ALTER TABLE sessions DROP COLUMN {later}")
    db.execute("DROP TABLE context_history")  # version 4
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()

    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        assert listed_roots((await conn.list_sessions()).sessions) == {sid: None}
        await conn.load_session(
            session_id=sid, cwd=str(main), mcp_servers=[], additional_directories=[str(second)]
        )
        assert "from the old days" in "".join(u.content.text for u in client.of_type("UserMessageChunk"))
        fork = await conn.fork_session(session_id=sid, cwd=str(main), mcp_servers=[])
        await conn.prompt(session_id=fork.session_id, prompt=[acp.text_block("in the fork")])
        assert listed_roots((await conn.list_sessions()).sessions) == {
            sid: [str(second)],
            fork.session_id: None,
        }
    db = sqlite3.connect(home / DB_FILE)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()


def test_a_new_session_with_roots_creates_no_anyio_object(dirs: dict[str, Path], tmp_path: Path) -> None:
    """Checking the roots is a few stats: `session/new` still starts no anyio backend."""
    roots = [str(dirs["second"]), str(dirs["third"])]
    run_python(
        f"""
        import asyncio, sys
        from crow.agent import Agent
        from crow.config import Config

        async def main():
            agent = Agent(Config(home={str(tmp_path / "home")!r}), builtin_hooks=False)
            agent.warm_up()
            session = agent.create_session({str(dirs["main"])!r}, additional_directories={roots!r})
            assert session.additional_directories == {roots!r}
            assert "anyio._backends._asyncio" not in sys.modules
            await agent.aclose()

        asyncio.run(main())
        """
    )


async def test_crows_own_restore_keeps_the_stored_roots_and_survives_one_gone(
    llm: ScriptedLLM, home: Path, dirs: dict[str, Path]
) -> None:
    """`crow.compact` of a stored session brings it back with its stored roots (it is no ACP
    activation); a root deleted since is left out, and the session's tools still start."""
    main, second, third = dirs["main"], dirs["second"], dirs["third"]
    llm.default = lambda req: Reply(text="SUMMARY")
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        await conn.initialize(protocol_version=1)
        roots = [str(second), str(third)]
        sid = (await conn.new_session(cwd=str(main), mcp_servers=[], additional_directories=roots)).session_id
        for i in range(3):
            await conn.prompt(session_id=sid, prompt=[acp.text_block(f"question {i}")])
    shutil.rmtree(third)
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        await conn.initialize(protocol_version=1)
        result = await conn.ext_method("crow.compact", {"sessionId": sid})
        assert "compacted" in result
        assert listed_roots((await conn.list_sessions()).sessions) == {sid: [str(second), str(third)]}
        llm.push(Reply(tool_calls=[tool("read_file", "after", path=f"{second}/where.txt")]), Reply(text="ok"))
        await conn.prompt(session_id=sid, prompt=[acp.text_block("still there?")])
    assert "SECOND needle" in results(llm, -1)["after"]


# ------------------------------------------------------------------ the TypeScript SDK client


def test_the_typescript_client_works_in_two_roots(
    llm: ScriptedLLM, home: Path, dirs: dict[str, Path]
) -> None:
    main, second, third, outside = dirs["main"], dirs["second"], dirs["third"], dirs["outside"]
    llm.push(
        Reply(
            tool_calls=[
                tool("read_file", "read2", path=f"{second}/where.txt"),
                tool("grep", "grep2", pattern="needle", path=str(second)),
                tool("write_file", "write2", path=f"{second}/ts.txt", content="from ts\n"),
                tool("read_file", "escape", path=f"{second}/escape/where.txt"),
                tool("execute", "run", command=f"echo in > {second}/ran.txt; echo out > {outside}/ran.txt"),
            ]
        ),
        Reply(text="done"),
    )

    def new(name: str, *roots: str) -> dict[str, Any]:
        params = {"cwd": str(main), "mcpServers": [], "additionalDirectories": list(roots)}
        return {"request": "session/new", "params": params, "as": name}

    out = run_script(
        {
            "steps": [
                new("relative", "rel/path"),
                new("missing", str(outside / "missing")),
                new("file", str(second), str(dirs["file"])),
                {"request": "session/list", "params": {}, "as": "empty"},
                new("s", str(second), str(main)),
                {
                    "request": "session/prompt",
                    "params": {"sessionId": "${s.sessionId}", "prompt": [{"type": "text", "text": "go"}]},
                    "as": "p",
                },
                {"request": "session/list", "params": {}, "as": "list"},
            ]
        },
        crow_env(llm, home, CROW_MODE="yolo"),
        main,
    )
    res = out["results"]
    assert (
        res["initialize"]["result"]["agentCapabilities"]["sessionCapabilities"]["additionalDirectories"] == {}
    )
    for name, why in (
        ("relative", "[0] must be an absolute path"),
        ("missing", "[0] does not exist"),
        ("file", "[1] is not a directory"),
    ):
        error = res[name]["error"]
        assert (
            error["code"] == -32602
            and f"additionalDirectories{why}" in error["data"]["additionalDirectories"]
        )
    assert res["empty"]["result"]["sessions"] == []
    assert res["p"]["result"]["stopReason"] == "end_turn"
    [listed] = res["list"]["result"]["sessions"]
    assert listed["additionalDirectories"] == [str(second)]
    got = results(llm, 1)
    assert "SECOND needle" in got["read2"] and f"{second}/where.txt:1:SECOND needle" in got["grep2"]
    assert (second / "ts.txt").read_text() == "from ts\n"
    assert "outside the workspace" in got["escape"]
    assert (second / "ran.txt").read_text() == "in\n" and not (outside / "ran.txt").exists()
    assert third.exists()


def test_the_typescript_client_loads_resumes_and_forks_with_roots(
    llm: ScriptedLLM, home: Path, dirs: dict[str, Path]
) -> None:
    main, second, third = dirs["main"], dirs["second"], dirs["third"]
    llm.push(Reply(text="made"))
    made = run_script(
        {
            "steps": [
                {
                    "request": "session/new",
                    "params": {"cwd": str(main), "mcpServers": [], "additionalDirectories": [str(second)]},
                    "as": "s",
                },
                {
                    "request": "session/prompt",
                    "params": {"sessionId": "${s.sessionId}", "prompt": [{"type": "text", "text": "hi"}]},
                },
            ]
        },
        crow_env(llm, home),
        main,
    )
    sid = made["results"]["s"]["result"]["sessionId"]
    llm.push(
        Reply(
            tool_calls=[
                tool("read_file", "r2", path=f"{second}/where.txt"),
                tool("read_file", "r3", path=f"{third}/where.txt"),
            ]
        ),
        Reply(text="ok"),
    )

    def request(method: str, name: str, **params: Any) -> dict[str, Any]:
        return {"request": method, "params": {"cwd": str(main), "mcpServers": [], **params}, "as": name}

    out = run_script(
        {
            "steps": [
                request("session/load", "bad_load", sessionId=sid, additionalDirectories=["rel"]),
                request("session/fork", "bad_fork", sessionId=sid, additionalDirectories=[str(dirs["file"])]),
                {"request": "session/list", "params": {}, "as": "unchanged"},
                request("session/load", "load", sessionId=sid, additionalDirectories=[str(third)]),
                {
                    "request": "session/prompt",
                    "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "read both"}]},
                },
                {"request": "session/list", "params": {}, "as": "loaded"},
                request("session/resume", "resume", sessionId=sid),
                request("session/fork", "fork", sessionId=sid, additionalDirectories=[str(second)]),
                {"request": "session/list", "params": {}, "as": "forked"},
            ]
        },
        crow_env(llm, home),
        main,
    )
    res = out["results"]
    assert res["bad_load"]["error"]["code"] == -32602 and res["bad_fork"]["error"]["code"] == -32602
    assert [s.get("additionalDirectories") for s in res["unchanged"]["result"]["sessions"]] == [[str(second)]]
    assert "load" in res and "result" in res["load"], res["load"]
    got = results(llm, -1)
    assert "outside the workspace" in got["r2"] and "THIRD needle" in got["r3"]
    assert [s.get("additionalDirectories") for s in res["loaded"]["result"]["sessions"]] == [[str(third)]]
    fork_id = res["fork"]["result"]["sessionId"]
    roots = {s["sessionId"]: s.get("additionalDirectories") for s in res["forked"]["result"]["sessions"]}
    assert roots == {sid: None, fork_id: [str(second)]}
