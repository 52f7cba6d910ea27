"""Checkpoints under stress: two sessions sharing one workspace (and so one shadow git
dir), and a turn that never reached its closing snapshot. Real crow turns (every builtin
hook, the in-process filesystem server) driven by the scripted model server."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from crow.agent import Agent
from crow.checkpoints import restore_turns, session_dir
from crow.events import Notice
from crow.messages import human
from tests.llm_server import RecordedRequest, Reply, ScriptedLLM, ToolCallSpec
from tests.test_checkpoints import Turn, agent, session_of, tool, turn, ws  # noqa: F401 (fixtures)

pytestmark = pytest.mark.anyio


async def test_two_sessions_on_one_workspace_run_commands_at_once(
    agent: Agent,  # noqa: F811
    ws: Path,  # noqa: F811
    llm: ScriptedLLM,
) -> None:
    """Both sessions snapshot the workspace in the same git dir at the same moments: each
    snapshot lands (git refuses a second `git add` while the first holds the index lock),
    so neither session is told its commands are not checkpointed, and each undoes its own."""
    for i in range(300):
        (ws / f"f{i}.txt").write_text("x" * i)
    ids = itertools.count()

    def step(req: RecordedRequest) -> Reply:
        if req.messages[-1]["role"] == "tool":
            return Reply(text="done")
        who = req.last_user_text
        command = f"echo {who} >> {who}.txt"
        return Reply(
            tool_calls=[ToolCallSpec(name="execute", arguments={"command": command}, id=f"x{next(ids)}")]
        )

    llm.rule(lambda req: True, step)
    sessions = [agent.create_session(str(ws)) for _ in range(2)]
    notices: list[Notice] = []

    async def emit(event: Any) -> None:
        if isinstance(event, Notice):
            notices.append(event)

    async def turns(session: Any, who: str) -> None:
        for _ in range(4):
            await agent.run_turn(session, human(who), emit)

    async with anyio.create_task_group() as tg:
        tg.start_soon(turns, sessions[0], "a")
        tg.start_soon(turns, sessions[1], "b")
    assert [n.text for n in notices] == []
    for session in sessions:  # every turn has both its trees
        folder = session_dir(agent.config.home, session.id)
        assert folder is not None
        gits = [json.loads(p.read_text())["git"] for p in folder.glob("*.json")]
        assert len(gits) == 4 and all(g.get("before") and g.get("after") for g in gits)
    last = [m for m in sessions[0].messages if m.role == "user"][-1]
    done = await restore_turns(sessions[0], [last.id], agent.config.home)
    assert "a.txt" in done.restored
    assert (ws / "a.txt").read_text() == "a\n" * 3


async def test_a_turn_without_its_closing_snapshot_names_what_is_not_restored(
    agent: Agent,  # noqa: F811
    ws: Path,  # noqa: F811
    turn: Turn,  # noqa: F811
) -> None:
    """crow stopped after the snapshot before the turn's first command and before the one
    when the turn ended (killed, or that snapshot failed): what the commands changed cannot
    be told apart from later changes, so nothing of it is put back, and the answer says so
    rather than "no file changes were recorded"."""
    (ws / "a.txt").write_text("a0\n")
    pid, _ = await turn(Reply(tool_calls=[tool("execute", "x1", command="echo a1 > a.txt")]))
    manifest = session_dir(agent.config.home, session_of(turn).id) / f"{pid}.json"  # type: ignore[operator]
    body = json.loads(manifest.read_text())
    assert body["git"]["before"] and body["git"].pop("after")
    manifest.write_text(json.dumps(body))  # what the checkpoint holds when crow stopped mid-turn
    done = await restore_turns(session_of(turn), [pid], agent.config.home)
    assert done.restored == done.removed == ()
    assert [path for path, _ in done.skipped] == ["(commands' changes)"]
    assert "ended before" in done.skipped[0][1]
    assert (ws / "a.txt").read_text() == "a1\n"


async def test_a_fork_undoes_the_file_changes_of_the_turns_it_copied(
    agent: Agent,  # noqa: F811
    ws: Path,  # noqa: F811
    turn: Turn,  # noqa: F811
) -> None:
    """A fork holds the source's turns under the same prompt ids: undoing one of them in the
    fork puts its files back (from its own copy of the checkpoints, which outlive the
    source), rather than answering "No file changes were recorded"."""
    from crow.rewind import rewind

    (ws / "w.txt").write_text("w0\n")
    (ws / "c.txt").write_text("c0\n")
    await turn(
        Reply(tool_calls=[tool("write_file", "w1", path="w.txt", content="w1\n")]),
        Reply(tool_calls=[tool("execute", "x1", command="echo c1 > c.txt")]),
    )
    source = session_of(turn)
    home = agent.config.home
    copy = await agent.resume_session(await agent.fork_session(source.id))
    await agent.delete_session(source.id)  # the source's checkpoints go with it; the fork's stay
    done = await rewind(copy, 1, home)
    assert (done.files.restored, done.files.skipped) == (("c.txt", "w.txt"), ())
    assert (ws / "w.txt").read_text() == "w0\n"
    assert (ws / "c.txt").read_text() == "c0\n"
    # the fork's undo dropped its copy: nothing of either session is left
    assert not (home / "checkpoints" / source.id).exists()
    assert not [p for p in (home / "checkpoints" / copy.id).rglob("*") if p.is_file()]
    assert not [p for p in (home / "checkpoints" / "git").iterdir() if p.is_dir()]


async def test_a_disk_that_fills_during_the_edit_leaves_the_tools_own_answer(
    agent: Agent,  # noqa: F811
    ws: Path,  # noqa: F811
    turn: Turn,  # noqa: F811
    llm: ScriptedLLM,
    small_disk: Path,
) -> None:
    """The checkpoint was saved, the edit landed, then the disk filled before what the edit
    left could be recorded: the model is told what the tool did (the file IS changed), not
    that a hook failed; an undo then leaves the file alone and says why."""
    home = agent.config.home
    (home / "checkpoints").parent.mkdir(parents=True, exist_ok=True)
    (home / "checkpoints").symlink_to(small_disk)
    (ws / "f.txt").write_text("f0\n")

    async def inside(ctx: Any, call: Any, call_next: Any) -> Any:
        result = await call_next(call)
        with (small_disk / "filler").open("wb") as f:  # the disk fills meanwhile
            try:
                f.write(b"x" * (1024 * 1024))
            except OSError:
                pass
        return result

    await agent.ready()
    agent.hooks.register("wrap_tool_call", inside, name="inside")
    pid, _ = await turn(
        Reply(tool_calls=[tool("edit_file", "e1", path="f.txt", old_text="f0", new_text="f1")])
    )
    assert (ws / "f.txt").read_text() == "f1\n"
    answer = {m["tool_call_id"]: m["content"] for m in llm.requests[1].messages if m["role"] == "tool"}["e1"]
    assert "checkpoints" not in answer and "failed" not in answer
    (small_disk / "filler").unlink()
    done = await restore_turns(session_of(turn), [pid], home)
    assert done.skipped == (
        ("f.txt", "crow stopped before it recorded what the turn left in it; left as it is"),
    )


async def test_a_git_killed_mid_snapshot_does_not_end_snapshots_for_good(
    agent: Agent,  # noqa: F811
    ws: Path,  # noqa: F811
    turn: Turn,  # noqa: F811
) -> None:
    """crow (and its git) killed during `git add` leaves the shadow index locked: git would
    refuse every later snapshot of that workspace, in every session, until someone removed
    the lock by hand. Under crow's own lock no other git runs there, so a lock file found
    is a dead one's."""
    from crow.snapshots import git_dir_for

    (ws / "a.txt").write_text("a0\n")
    await turn(Reply(tool_calls=[tool("execute", "x1", command="true")]))
    (git_dir_for(agent.config.home, ws) / "index.lock").write_text("")  # what the kill left
    pid, notices = await turn(Reply(tool_calls=[tool("execute", "x2", command="echo a1 > a.txt")]))
    assert notices == []
    done = await restore_turns(session_of(turn), [pid], agent.config.home)
    assert done.restored == ("a.txt",)
    assert (ws / "a.txt").read_text() == "a0\n"


async def test_a_nested_repository_without_a_commit_does_not_stop_snapshots(
    agent: Agent,  # noqa: F811
    ws: Path,  # noqa: F811
    turn: Turn,  # noqa: F811
) -> None:
    """A command starts a project in a subfolder (`git init`, no commit yet): git refuses
    any `git add` over such a repository, which ended snapshots for the session (the turn's
    closing one failed, every later one too). It is left out instead: its files are the
    nested repository's, never the workspace snapshot's."""
    (ws / "a.txt").write_text("a0\n")
    first, notices = await turn(
        Reply(tool_calls=[tool("execute", "x1", command="git init -q 'new [app]' && echo a1 > a.txt")])
    )
    second, later = await turn(Reply(tool_calls=[tool("execute", "x2", command="echo a2 > a.txt")]))
    assert notices == later == []
    done = await restore_turns(session_of(turn), [second, first], agent.config.home)
    assert (done.restored, done.skipped) == (("a.txt",), ())
    assert (ws / "a.txt").read_text() == "a0\n"
    assert (ws / "new [app]" / ".git").is_dir()  # the nested repository is not the turn's to take


async def test_a_hostile_repository_runs_nothing_in_the_shadow_git(
    agent: Agent,  # noqa: F811
    ws: Path,  # noqa: F811
    turn: Turn,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The project's own config, hooks and filters, a nested repository's and a `.git` file's
    pointing elsewhere: none runs when crow snapshots and restores the workspace (held on
    the old code too: kept as a guard across git versions)."""
    pwned = tmp_path / "pwned"
    pwned.mkdir()

    async def git(*args: str, cwd: Path) -> None:
        await anyio.run_process(["git", *args], cwd=cwd)

    def trap(name: str) -> str:
        return f"touch {pwned / name}; echo"

    await git("init", "-q", ".", cwd=ws)
    for key, name in (("core.fsmonitor", "fsmonitor"), ("core.hooksPath", "hookspath")):
        await git("config", key, trap(name), cwd=ws)
    await git("config", "filter.x.clean", trap("filter"), cwd=ws)
    await git("config", "diff.x.textconv", trap("textconv"), cwd=ws)
    for hook in ("pre-commit", "post-index-change", "reference-transaction", "post-checkout"):
        (ws / ".git" / "hooks" / hook).write_text(f"#!/bin/sh\n{trap(hook)}\n")
        (ws / ".git" / "hooks" / hook).chmod(0o755)
    (ws / ".gitattributes").write_text("* filter=x diff=x\n")
    nested = ws / "vendor"
    nested.mkdir()
    await git("init", "-q", ".", cwd=nested)
    await git("config", "core.fsmonitor", trap("nested"), cwd=nested)
    (nested / "v.txt").write_text("v\n")
    elsewhere = tmp_path / "elsewhere"
    await git("init", "-q", str(elsewhere), cwd=tmp_path)
    await git("config", "core.fsmonitor", trap("gitfile"), cwd=elsewhere)
    (ws / "linked").mkdir()
    (ws / "linked" / ".git").write_text(f"gitdir: {elsewhere / '.git'}\n")
    (ws / "a.txt").write_text("a0\n")
    pid, notices = await turn(Reply(tool_calls=[tool("execute", "x1", command="echo a1 > a.txt")]))
    done = await restore_turns(session_of(turn), [pid], agent.config.home)
    assert notices == []
    assert "a.txt" in done.restored and (ws / "a.txt").read_text() == "a0\n"
    assert sorted(p.name for p in pwned.iterdir()) == []


async def test_a_symlink_a_command_removed_is_named_not_recreated(
    agent: Agent,  # noqa: F811
    ws: Path,  # noqa: F811
    turn: Turn,  # noqa: F811
    tmp_path: Path,
) -> None:
    """docs/undo.md: symlinks inside a snapshot are left alone and named (a restore never
    makes a link, which could point anywhere)."""
    (ws / "a.txt").write_text("a0\n")
    (ws / "link").symlink_to(tmp_path)
    pid, _ = await turn(Reply(tool_calls=[tool("execute", "x1", command="rm link && echo a1 > a.txt")]))
    done = await restore_turns(session_of(turn), [pid], agent.config.home)
    assert done.restored == ("a.txt",)
    assert done.skipped == (("link", "not a regular file in the snapshot (a symlink or nested repository)"),)
    assert not (ws / "link").exists() and not (ws / "link").is_symlink()


async def test_a_full_disk_during_an_undo_keeps_the_turn_and_its_copies_for_a_retry(
    agent: Agent,  # noqa: F811
    turn: Turn,  # noqa: F811
    small_disk: Path,
) -> None:
    """The workspace's disk is full when the undo writes a file back: that file's earlier
    content exists only in its checkpoint. The undo stops before the conversation (as any
    failure putting files back does) and keeps the checkpoints, so freeing space and undoing
    again puts it back, rather than dropping the only copy and naming the file as skipped."""
    from crow.errors import FilesNotPutBack
    from crow.rewind import rewind

    disk_ws = small_disk / "ws"
    disk_ws.mkdir()
    (disk_ws / "f.txt").write_bytes(b"a" * 100_000)
    session = agent.create_session(str(disk_ws))
    await turn(Reply(tool_calls=[tool("write_file", "w1", path="f.txt", content="small\n")]), session=session)
    with (small_disk / "filler").open("wb") as f:
        try:
            f.write(b"x" * (1024 * 1024))
        except OSError:
            pass
    context = list(session.messages)
    with pytest.raises(FilesNotPutBack, match="No space left on device"):
        await rewind(session, 1, agent.config.home)
    assert list(session.messages) == context  # the turn is still there
    (small_disk / "filler").unlink()
    done = await rewind(session, 1, agent.config.home)
    assert (done.files.restored, done.files.skipped) == (("f.txt",), ())
    assert (disk_ws / "f.txt").read_bytes() == b"a" * 100_000
