"""`crow sessions ...` opens the store alone; `crow compact` waits its turn like a prompt."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import acp
import anyio
import pytest

from tests.conftest import crow_env, spawn_crow
from tests.llm_server import Reply, ScriptedLLM

pytestmark = pytest.mark.anyio

_PROBE = """
import sys
from crow.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
loaded = {*sys.modules, *(m.split('.')[0] for m in sys.modules)}
print(code, sorted(loaded & set(sys.argv[0].split(','))), file=sys.stderr)
"""


def test_sessions_list_opens_the_store_alone(home: Path) -> None:
    # Listing an empty store took 1.4 s and 72 MB: it started an Agent (ACP, MCP, httpx,
    # pydantic). It needs the store and nothing else, not even an event loop; and none of
    # the standard modules `crow --help` does without (dataclasses pulls in inspect and ast),
    # so that it costs at most 1.3x `crow --help` (bench/store.py).
    heavy = "acp,mcp,httpx,pydantic,yaml,anyio,asyncio,crow.agent,dataclasses,inspect,pathlib,json,base64,crow.store.base"
    for argv in (["sessions", "list"], ["sessions", "show", "nope"]):
        done = subprocess.run(
            [sys.executable, "-c", _PROBE.replace("sys.argv[0]", repr(heavy)), *argv],
            env=crow_env(None, home),
            capture_output=True,
            text=True,
            timeout=60,
        )
        last = done.stderr.strip().splitlines()[-1]
        expected = "0 []" if argv[1] == "list" else "2 []"
        assert last == expected, done.stderr
    assert (home / "crow.db").exists()


async def test_cli_compact_is_refused_while_a_crow_server_runs_a_turn(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    env = crow_env(llm, home)
    async with spawn_crow(env) as (conn, proc, _client):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        for i in range(4):
            llm.push(Reply(text=f"answer {i} " + "detail " * 40))
            await conn.prompt(session_id=sid, prompt=[acp.text_block(f"question {i}")])
        # A turn that streams for up to 30 s (cancelled below): it holds the session.
        llm.push(Reply(text="slow " * 300, chunk_delay=0.1), Reply(text="a summary"))
        turn = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("talk")]))
        for _ in range(1000):
            if len(llm.requests) == 5:
                break
            await asyncio.sleep(0.01)
        compact = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "crow", "compact", sid, env=env, cwd=workspace,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(compact.communicate(), 60)
        assert not turn.done(), "the turn ended before crow compact ran: nothing was tested"
        assert compact.returncode == 2, err.decode()
        assert (
            f"busy: session {sid} is running a turn in another crow process (pid {proc.pid})" in err.decode()
        )
        assert out == b""
        await conn.cancel(session_id=sid)
        assert (await turn).stop_reason == "cancelled"
        assert len(llm.requests) == 5, "crow compact asked the model for a summary"
    export = await anyio.run_process([sys.executable, "-m", "crow", "sessions", "export", sid], env=env)
    context = json.loads(export.stdout)["context"]
    assert [m["content"] for m in context if m["role"] == "user"][-1] == "talk"
    assert len(context) == 10, "the context was rewritten under the running turn"
