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


# ------------------------------------------------------------ short ids, times, pipes (issue 15)


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crow", *args], env=env, capture_output=True, text=True, timeout=60
    )


def _stored(home: Path, cwd: Path, sessions: dict[str, dict[str, object]]) -> None:
    """Sessions with chosen ids and fields (title, updated_at) in the store crow reads."""
    from crow.store import SQLiteStore

    async def go() -> None:
        async with SQLiteStore(home / "crow.db", home=home) as store:
            for sid, fields in sessions.items():
                await store.create_session(id=sid, cwd=str(cwd), **fields)

    anyio.run(go)


def _ago(seconds: float) -> str:
    import time

    from crow.store._codec import iso

    return iso(time.time() - seconds)


def test_relative_times() -> None:
    from datetime import datetime

    from crow.session_list import ago

    now = datetime(2026, 3, 18, 15, 0).timestamp()
    assert ago(now - 5, now) == "just now"
    assert ago(now + 30, now) == "just now", "a clock a little ahead"
    assert ago(now - 3 * 60 - 59, now) == "3 min ago"
    assert ago(now - 2 * 3600 - 1, now) == "2 h ago"
    assert ago(datetime(2026, 3, 17, 23, 59).timestamp(), now) == "yesterday"
    assert ago(datetime(2026, 3, 14, 9, 0).timestamp(), now) == "4 days ago"
    assert ago(datetime(2026, 2, 1, 9, 0).timestamp(), now) == "2026-02-01"


def test_sessions_list_piped_is_tab_separated_and_whole(home: Path, workspace: Path) -> None:
    sid = "c0ffee" + "0" * 26
    _stored(home, workspace, {sid: {"title": "a\ttitle\nwith \x1b[8mtricks"}})
    done = _cli(crow_env(None, home), "sessions", "list")
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    fields = line.split("\t")
    assert fields[0] == sid and fields[2] == "0" and fields[3] == str(workspace)
    assert fields[4] == "a\\ttitle\\nwith \\x1b[8mtricks"
    from crow.store._codec import from_iso

    from_iso(fields[1])  # an ISO 8601 time


def test_sessions_list_on_a_terminal_shows_short_ids_and_relative_times(home: Path, workspace: Path) -> None:
    from tests.support.on_pty import stdout_on_pty

    _stored(
        home,
        workspace,
        {
            "0123456789aa" + "0" * 20: {"title": "fix the login bug", "updated_at": _ago(3 * 60 + 5)},
            "0123456789bb" + "0" * 20: {"title": "", "updated_at": _ago(26 * 3600)},
            "fedcba98" + "0" * 24: {"title": "old work", "updated_at": _ago(40 * 86400)},
        },
    )
    status, out = stdout_on_pty([sys.executable, "-m", "crow", "sessions", "list"], env=crow_env(None, home))
    assert status == 0
    lines = out.decode().replace("\r\n", "\n").splitlines()
    assert [line.split("  ")[0] for line in lines] == ["0123456789a", "0123456789b", "fedcba98"]
    assert "3 min ago" in lines[0] and "fix the login bug" in lines[0]
    assert "(untitled)" in lines[1]
    assert "yesterday" in lines[1] or "2 days ago" in lines[1]  # 26 h back is one or two dates back
    old = _ago(40 * 86400)[:10]  # UTC date; local may differ by one day
    assert any(day in lines[2] for day in (old, _ago(39 * 86400)[:10], _ago(41 * 86400)[:10]))
    starts = {line.index("msgs") for line in lines}
    assert len(starts) == 1, f"columns aligned:\n{out.decode()}"


def test_sessions_list_into_a_pipe_closed_early_ends_quietly(home: Path, workspace: Path) -> None:
    """`crow sessions list | head -1` ended in a BrokenPipeError traceback."""
    _stored(home, workspace, {f"{n:032x}": {"title": "long " * 2000} for n in range(40)})  # 400 KB
    done = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m crow sessions list | head -c 100; echo " status ${{PIPESTATUS[0]}}" >&2'],
        env=crow_env(None, home),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert len(done.stdout) == 100
    assert done.stderr == " status 141\n"


def test_every_session_command_takes_a_unique_prefix(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    env = crow_env(None, home)
    sid, other = "abc12345" + "0" * 24, "abd12345" + "0" * 24
    _stored(home, workspace, {sid: {"title": "mine"}, other: {"title": "other"}})
    show = _cli(env, "sessions", "show", "abc")
    assert show.returncode == 0 and show.stdout.startswith(f"# mine\n{sid} · "), show.stderr
    export = _cli(env, "sessions", "export", "abc1")
    assert json.loads(export.stdout)["session"]["id"] == sid
    ambiguous = _cli(env, "sessions", "show", "ab")
    assert ambiguous.returncode == 2 and "ambiguous" in ambiguous.stderr and sid in ambiguous.stderr
    rewind = _cli(env, "sessions", "rewind", "abc")
    assert rewind.stderr == "crow: Nothing to undo: this session has no turn to take back.\n", "found it"
    compact = _cli(crow_env(llm, home), "compact", "abc")
    assert compact.stderr == "Nothing compacted: nothing to compact: 0 messages, all in the kept recent part.\n"
    assert json.loads(compact.stdout)["compacted"] is False and llm.requests == []
    deleted = _cli(env, "sessions", "delete", "abc")
    assert deleted.returncode == 0 and deleted.stderr == f"deleted {sid}\n"
    assert _cli(env, "sessions", "show", "abc").stderr == "crow: unknown session 'abc'\n"
    assert _cli(env, "sessions", "list").stdout.split("\t")[0] == other


def test_prefix_lookups_in_the_store(home: Path, workspace: Path) -> None:
    """Both stores run the same SQL (crow/store/_queries.py): here through DirectStore."""
    from crow.store.direct import DirectStore

    _stored(home, workspace, {sid: {"title": sid} for sid in ("abc", "abcd", "abce", "b" * 32, "zz\U0010ffff")})
    with DirectStore(home / "crow.db", home=home) as store:
        assert store.match_ids("abc") == [("abc", "abc")], "an exact id wins over the ids it starts"
        assert store.match_ids("ab") == [("abc", "abc"), ("abcd", "abcd"), ("abce", "abce")]
        assert store.match_ids("ab", 2) == [("abc", "abc"), ("abcd", "abcd")]
        assert store.match_ids("") == [] and store.match_ids("c") == [] and store.match_ids("%") == []
        assert store.match_ids("zz") == [("zz\U0010ffff", "zz\U0010ffff")]
        short = store.short_ids(["abcd", "b" * 32, "abc"], minimum=2)
        assert short == {"abcd": "abcd", "b" * 32: "bb", "abc": "abc"}
        assert store.short_ids(["b" * 32]) == {"b" * 32: "b" * 8}


def test_sessions_list_cwd_may_be_relative(home: Path, workspace: Path, tmp_path: Path) -> None:
    """`--cwd .` listed nothing: the stored folders are absolute paths."""
    other = tmp_path / "other"
    other.mkdir()
    _stored(home, workspace, {"aaaa1111": {"title": "here"}})
    _stored(home, other, {"bbbb2222": {"title": "there"}})
    env = crow_env(None, home)
    for given in (".", "./", f"../{workspace.name}", str(workspace) + "/"):
        done = subprocess.run(
            [sys.executable, "-m", "crow", "sessions", "list", "--cwd", given],
            env=env, cwd=workspace, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0 and [line.split("\t")[0] for line in done.stdout.splitlines()] == [
            "aaaa1111"
        ], (given, done.stdout, done.stderr)
