"""End to end: the tool calls of one reply take effect in the order the model gave them —
five edits of one file all land (on disk and through the editor's fs methods), and a
write, a command, an edit and a read of one file happen in that order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import acp
import anyio
import pytest
from acp.schema import ClientCapabilities, FileSystemCapabilities

from tests.conftest import RecordingClient, crow_env, spawn_crow
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec

pytestmark = pytest.mark.anyio
FIVE = "".join(f"v{i} = 0\n" for i in range(1, 6))
EDITED = "".join(f"v{i} = {i}\n" for i in range(1, 6))


def five_edits(path: str) -> Reply:
    return Reply(
        tool_calls=[
            ToolCallSpec(
                name="edit_file", arguments={"path": path, "old_text": f"v{i} = 0", "new_text": f"v{i} = {i}"}
            )
            for i in range(1, 6)
        ]
    )


def tool_results(llm: ScriptedLLM, request: int = 1) -> list[str]:
    return [m["content"] for m in llm.requests[request].messages if m["role"] == "tool"]


class DiskEditor(RecordingClient):
    """An editor whose fs methods serve the files on disk, each after a short delay (as a
    real editor answers over its pipe), and that records how many writes overlap."""

    delay = 0.05

    def __init__(self) -> None:
        super().__init__()
        self.writing = 0
        self.most_writing = 0
        self.fs_calls: list[str] = []

    async def read_text_file(self, path: str, session_id: str, **kwargs: Any) -> Any:
        from acp import RequestError
        from acp.schema import ReadTextFileResponse

        self.fs_calls.append(f"read {Path(path).name}")
        await anyio.sleep(self.delay)
        if not Path(path).is_file():
            raise RequestError.resource_not_found(Path(path).as_uri())
        return ReadTextFileResponse(content=Path(path).read_text())

    async def write_text_file(self, content: str, path: str, session_id: str, **kwargs: Any) -> Any:
        self.fs_calls.append(f"write {Path(path).name}")
        self.writing += 1
        self.most_writing = max(self.most_writing, self.writing)
        try:
            await anyio.sleep(self.delay)
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(content)
        finally:
            self.writing -= 1
        return None


async def start(conn: Any, workspace: Path, caps: ClientCapabilities | None = None) -> str:
    await conn.initialize(protocol_version=1, client_capabilities=caps)
    return (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id


async def test_five_edits_of_one_file_in_one_reply_all_land(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (workspace / "app.py").write_text(FIVE)
    llm.push(five_edits("app.py"), Reply(text="done"))
    async with spawn_crow(crow_env(llm, home, CROW_MODE="yolo")) as (conn, _proc, client):
        sid = await start(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("bump all five")])
    assert (workspace / "app.py").read_text() == EDITED
    results = tool_results(llm)
    assert len(results) == 5 and all(r.startswith("Edited app.py: 1 replacement") for r in results), results
    # every call was reported running, then completed, once each
    statuses = [u.status for u in client.of_type("ToolCallProgress") if u.status]
    assert statuses.count("completed") == 5 and statuses.count("in_progress") == 5


async def test_five_edits_through_the_editor_fs_methods_all_land(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (workspace / "app.py").write_text(FIVE)
    llm.push(five_edits("app.py"), Reply(text="done"))
    caps = ClientCapabilities(fs=FileSystemCapabilities(read_text_file=True, write_text_file=True))
    editor = DiskEditor()
    async with spawn_crow(crow_env(llm, home, CROW_MODE="yolo"), client=editor) as (conn, _proc, _c):
        sid = await start(conn, workspace, caps)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("bump all five")])
    assert (workspace / "app.py").read_text() == EDITED
    assert editor.fs_calls == ["read app.py", "write app.py"] * 5, "each edit re-reads after the last write"
    assert all(r.startswith("Edited app.py: 1 replacement") for r in tool_results(llm))


async def test_writes_to_different_files_still_run_side_by_side(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(
        Reply(
            tool_calls=[
                ToolCallSpec(name="write_file", arguments={"path": f"f{i}.txt", "content": str(i)})
                for i in range(4)
            ]
        ),
        Reply(text="done"),
    )
    caps = ClientCapabilities(fs=FileSystemCapabilities(read_text_file=True, write_text_file=True))
    editor = DiskEditor()
    editor.delay = 0.2
    async with spawn_crow(crow_env(llm, home, CROW_MODE="yolo"), client=editor) as (conn, _proc, _c):
        sid = await start(conn, workspace, caps)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("write four")])
    assert [(workspace / f"f{i}.txt").read_text() for i in range(4)] == ["0", "1", "2", "3"]
    assert editor.most_writing >= 2, "writes of different files were serialized"


async def test_write_execute_edit_read_of_one_file_run_in_the_order_given(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(
        Reply(
            tool_calls=[
                ToolCallSpec(name="write_file", arguments={"path": "log.txt", "content": "one\n"}),
                ToolCallSpec(name="execute", arguments={"command": "sleep 0.2; echo two >> log.txt"}),
                ToolCallSpec(
                    name="edit_file", arguments={"path": "log.txt", "old_text": "two", "new_text": "TWO"}
                ),
                ToolCallSpec(name="read_file", arguments={"path": "log.txt"}),
            ]
        ),
        Reply(text="done"),
    )
    async with spawn_crow(crow_env(llm, home, CROW_MODE="yolo")) as (conn, _proc, client):
        sid = await start(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
    assert (workspace / "log.txt").read_text() == "one\nTWO\n"
    wrote, ran, edited, read = tool_results(llm)
    assert "(created)" in wrote and "[exit code 0]" in ran, (wrote, ran)
    assert edited.startswith("Edited log.txt: 1 replacement"), edited
    assert "one" in read and "TWO" in read, read
    # each call was reported running only when its turn came: the events are in order
    running = [u.tool_call_id for u in client.of_type("ToolCallProgress") if u.status == "in_progress"]
    done = [u.tool_call_id for u in client.of_type("ToolCallProgress") if u.status == "completed"]
    assert running == done and len(done) == 4


def last(request: Any) -> dict[str, Any]:
    return request.messages[-1]


def script_bumps(llm: ScriptedLLM) -> None:
    """Prompt "bump vN" gets one edit of line N, whichever session or process sends it."""
    for i in (1, 2):
        llm.rule(
            lambda r, i=i: last(r)["role"] == "user" and f"bump v{i}" in str(last(r)["content"]),
            Reply(
                tool_calls=[
                    ToolCallSpec(
                        name="edit_file",
                        arguments={"path": "app.py", "old_text": f"v{i} = 0", "new_text": f"v{i} = {i}"},
                    )
                ]
            ),
            times=1,
        )
    llm.rule(lambda r: last(r)["role"] == "tool", Reply(text="done"))


async def test_two_sessions_editing_one_file_through_the_editor_lose_nothing(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (workspace / "app.py").write_text(FIVE)
    script_bumps(llm)
    caps = ClientCapabilities(fs=FileSystemCapabilities(read_text_file=True, write_text_file=True))
    editor = DiskEditor()
    editor.delay = 0.25  # both sessions' edits are in flight at once
    async with spawn_crow(crow_env(llm, home, CROW_MODE="yolo"), client=editor) as (conn, _proc, _c):
        await conn.initialize(protocol_version=1, client_capabilities=caps)
        sids = [(await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id for _ in range(2)]
        async with anyio.create_task_group() as tg:
            for i, sid in enumerate(sids, 1):
                tg.start_soon(
                    lambda sid=sid, i=i: conn.prompt(session_id=sid, prompt=[acp.text_block(f"bump v{i}")])
                )
    assert (workspace / "app.py").read_text() == FIVE.replace("v1 = 0", "v1 = 1").replace("v2 = 0", "v2 = 2")
    assert editor.fs_calls == ["read app.py", "write app.py"] * 2, editor.fs_calls


async def test_two_crow_processes_editing_one_file_lose_nothing(
    llm: ScriptedLLM, tmp_path: Path, workspace: Path
) -> None:
    """Two editors (or an editor and `crow run`) on one project: each crow process has its
    own in-process locks; the advisory lock on the file makes them take turns."""
    (workspace / "app.py").write_text(FIVE)
    script_bumps(llm)
    caps = ClientCapabilities(fs=FileSystemCapabilities(read_text_file=True, write_text_file=True))
    editors = [DiskEditor(), DiskEditor()]

    async def bump(i: int) -> None:
        editors[i - 1].delay = 0.25  # both edits are in flight at once
        env = crow_env(llm, tmp_path / f"home{i}", CROW_MODE="yolo")
        async with spawn_crow(env, client=editors[i - 1]) as (conn, _proc, _c):
            sid = await start(conn, workspace, caps)
            await conn.prompt(session_id=sid, prompt=[acp.text_block(f"bump v{i}")])

    async with anyio.create_task_group() as tg:
        tg.start_soon(bump, 1)
        tg.start_soon(bump, 2)
    assert (workspace / "app.py").read_text() == FIVE.replace("v1 = 0", "v1 = 1").replace("v2 = 0", "v2 = 2")


async def test_cancel_while_a_call_waits_for_its_turn_runs_nothing_more(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(
        Reply(
            tool_calls=[
                ToolCallSpec(name="execute", arguments={"command": "sleep 30"}),
                ToolCallSpec(name="write_file", arguments={"path": "after.txt", "content": "too late"}),
            ]
        ),
        Reply(text="after cancel"),
    )
    async with spawn_crow(crow_env(llm, home, CROW_MODE="yolo")) as (conn, _proc, client):
        sid = await start(conn, workspace)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                answers: list[Any] = []

                async def prompt() -> None:
                    answers.append(await conn.prompt(session_id=sid, prompt=[acp.text_block("go")]))

                tg.start_soon(prompt)
                for _ in range(500):
                    if [u for u in client.of_type("ToolCallProgress") if u.status == "in_progress"]:
                        break
                    await anyio.sleep(0.01)
                await anyio.sleep(0.2)
                running = [u for u in client.of_type("ToolCallProgress") if u.status == "in_progress"]
                assert len(running) == 1, "the write waits for the command: it is not running yet"
                await conn.cancel(session_id=sid)
        assert answers[0].stop_reason == "cancelled"
        again = await conn.prompt(session_id=sid, prompt=[acp.text_block("and now?")])
    assert again.stop_reason == "end_turn"
    assert not (workspace / "after.txt").exists(), "a call cancelled while waiting never runs"
    tool = [m["content"] for m in llm.requests[-1].messages if m["role"] == "tool"]
    assert len(tool) == 2 and all("Cancelled" in t for t in tool), tool
