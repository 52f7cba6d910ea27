"""End to end: crow spawned, driven over ACP. A full disk during an edit, and a SIGKILL of
crow while it writes a large file, leave the old content (or, after a kill, the new),
never a torn or empty file; after a full disk the model is told, and the session goes on."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import acp
import anyio
import pytest

from tests.conftest import crow_env, spawn_crow
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec

pytestmark = pytest.mark.anyio
END = ("completed", "failed")
EDIT = {"path": "big.txt", "old_text": "MARK", "new_text": "DONE"}


async def test_a_full_disk_during_an_edit_leaves_the_file_and_the_session_usable(
    llm: ScriptedLLM, home: Path, small_disk: Path
) -> None:
    original = "".join(f"line {i:06d} of the original file\n" for i in range(9000))  # ~280 KB
    (small_disk / "app.py").write_text(original)
    edit = {"path": "app.py", "old_text": "line 000001 ", "new_text": "x" * 300_000}
    llm.push(
        Reply(tool_calls=[ToolCallSpec(name="edit_file", arguments=edit)]),
        Reply(text="the disk is full"),
        Reply(text="still here"),
    )
    async with spawn_crow(crow_env(llm, home, CROW_MODE="yolo")) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(small_disk), mcp_servers=[])).session_id
        first = await conn.prompt(session_id=sid, prompt=[acp.text_block("make it big")])
        second = await conn.prompt(session_id=sid, prompt=[acp.text_block("and now?")])
    assert (small_disk / "app.py").read_text() == original, "the original is byte-identical"
    assert sorted(p.name for p in small_disk.iterdir()) == ["app.py"], "no temp file left behind"
    result = next(m["content"] for m in llm.requests[1].messages if m["role"] == "tool")
    assert "disk full" in result and "app.py was left unchanged" in result, result
    assert first.stop_reason == second.stop_reason == "end_turn"
    assert "still here" in client.text(sid)


@pytest.mark.slow
async def test_sigkill_while_crow_writes_a_large_file_leaves_old_or_new(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    line = "a" * (4 * 1024 * 1024) + "\n"
    old = "MARK" + line * 4  # 16 MB (under read_file's 20 MB) in a few long lines: a cheap diff
    new = old.replace("MARK", "DONE", 1)
    target = workspace / "big.txt"
    outcomes = []
    took = await _edit_time(llm, home, workspace, old)
    # Kill moments from the start of the call to past the rename, finest where the write is.
    for delay in (0.0, 0.03, *(0.05 + i * 0.01 for i in range(12)), 0.2, 0.3):
        target.write_text(old)
        llm.push(Reply(tool_calls=[ToolCallSpec(name="edit_file", arguments=EDIT)]), Reply(text="done"))
        async with spawn_crow(crow_env(llm, home, CROW_MODE="yolo")) as (conn, proc, client):
            await conn.initialize(protocol_version=1)
            sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            async with anyio.create_task_group() as tg:
                tg.start_soon(conn.prompt, sid, [acp.text_block("rewrite it")])
                await _running(client)
                await anyio.sleep(delay)
                proc.kill()
                tg.cancel_scope.cancel()
        text = target.read_text()
        assert text in (old, new), f"torn file: {len(text)} characters"
        outcomes.append(f"{delay:.2f}: {'new' if text == new else 'old'}")
        assert [p.name for p in workspace.iterdir()] == ["big.txt"], "no temp file left behind"
        llm.reset()  # the reply after the killed call was never asked for
    print(f"edit took {took:.2f} s; outcomes: {outcomes}")


async def _running(client: Any) -> None:
    with anyio.fail_after(60):
        while not any(u.status == "in_progress" for u in client.of_type("ToolCallProgress")):  # noqa: ASYNC110
            await anyio.sleep(0.005)


async def _edit_time(llm: ScriptedLLM, home: Path, workspace: Path, old: str) -> float:
    """How long the edit takes when nothing kills it (from running to completed)."""
    (workspace / "big.txt").write_text(old)
    llm.push(Reply(tool_calls=[ToolCallSpec(name="edit_file", arguments=EDIT)]), Reply(text="done"))
    async with spawn_crow(crow_env(llm, home, CROW_MODE="yolo")) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        async with anyio.create_task_group() as tg:
            tg.start_soon(conn.prompt, sid, [acp.text_block("rewrite it")])
            await _running(client)
            start = time.monotonic()
            with anyio.fail_after(120):
                while not (done := [u for u in client.of_type("ToolCallProgress") if u.status in END]):  # noqa: ASYNC110
                    await anyio.sleep(0.005)
            took = time.monotonic() - start
            assert done[0].status == "completed", done[0]
    llm.reset()
    return took
