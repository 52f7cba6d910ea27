"""Per-turn file checkpoints and putting them back (crow.checkpoints, the checkpoints hook):
real crow turns (every builtin hook, the in-process filesystem server) driven by the
scripted model server write, edit and run commands; `restore_turns` with the turn's prompt
id puts the files back."""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from crow.agent import Agent
from crow.checkpoints import MAX_FILE_BYTES, Restored, forget_session, restore_turns, session_dir, sha256
from crow.config import Config
from crow.events import Notice
from crow.messages import human
from crow.restore import CHANGED_SINCE
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec

pytestmark = pytest.mark.anyio


def tool(name: str, call_id: str, **args: Any) -> ToolCallSpec:
    return ToolCallSpec(name=name, arguments=args, id=call_id)


def writes(*files: tuple[str, str]) -> Reply:
    """A reply that writes each (path, content), in one batch."""
    return Reply(
        tool_calls=[tool("write_file", f"w{i}", path=p, content=c) for i, (p, c) in enumerate(files)]
    )


def results(llm: ScriptedLLM, request: int) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in llm.requests[request].messages if m["role"] == "tool"}


@pytest.fixture
def ws(workspace: Path) -> Path:
    return workspace


@pytest.fixture
async def agent(tmp_path: Path, llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Agent]:
    monkeypatch.setenv("OPENAI_BASE_URL", llm.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.delenv("CROW_TRACE", raising=False)
    config = Config(model="openai:scripted", home=tmp_path / "home", mode="yolo", sandbox="off")
    async with Agent(config) as a:
        yield a


Turn = Callable[..., Any]


@pytest.fixture
def turn(agent: Agent, ws: Path, llm: ScriptedLLM) -> Turn:
    """Run one turn of `replies` in the session (made on first use); returns the turn's
    prompt id and the notices it emitted."""
    state: dict[str, Any] = {}

    async def run(*replies: Reply, session: Any = None) -> tuple[str, list[Notice]]:
        if session is None:
            session = state.get("session") or agent.create_session(str(ws))
        state["session"] = session
        notices: list[Notice] = []

        async def emit(event: Any) -> None:
            if isinstance(event, Notice):
                notices.append(event)

        llm.push(*replies, Reply(text="done"))
        await agent.run_turn(session, human("go"), emit)
        prompt = [m for m in session.messages if m.role == "user"][-1]
        assert prompt.id
        return prompt.id, notices

    run.state = state  # type: ignore[attr-defined]
    return run


def session_of(turn: Turn) -> Any:
    return turn.state["session"]  # type: ignore[attr-defined]


async def test_write_and_edit_are_put_back_created_file_removed_mode_restored(
    agent: Agent, ws: Path, turn: Turn, llm: ScriptedLLM
) -> None:
    (ws / "keep.py").write_text("one\ntwo\n")
    (ws / "keep.py").chmod(0o751)
    (ws / "over.txt").write_text("old text\n")
    pid, _ = await turn(
        Reply(
            tool_calls=[
                tool("edit_file", "e1", path="keep.py", old_text="two", new_text="TWO"),
                tool("write_file", "w1", path="over.txt", content="new text\n"),
                tool("write_file", "w2", path="sub/new.txt", content="created\n"),
            ]
        ),
        Reply(tool_calls=[tool("edit_file", "e2", path="keep.py", old_text="one", new_text="ONE")]),
    )
    assert "error" not in " ".join(results(llm, 1).values()).lower()
    assert (ws / "keep.py").read_text() == "ONE\nTWO\n"
    (ws / "keep.py").chmod(0o600)  # the mode changed since: still what the turn left in content
    done = await restore_turns(session_of(turn), [pid], agent.config.home)
    assert sorted(done.restored) == ["keep.py", "over.txt"]
    assert done.removed == ("sub/new.txt",)
    assert done.skipped == ()
    assert (ws / "keep.py").read_text() == "one\ntwo\n"
    assert stat.S_IMODE((ws / "keep.py").stat().st_mode) == 0o751
    assert (ws / "over.txt").read_text() == "old text\n"
    assert not (ws / "sub" / "new.txt").exists()
    # the checkpoints are forgotten: a second restore has nothing to do
    assert await restore_turns(session_of(turn), [pid], agent.config.home) == Restored()
    folder = session_dir(agent.config.home, session_of(turn).id)
    assert folder is not None and not list(folder.glob("*.json")) and not list((folder / "blobs").iterdir())


async def test_a_file_changed_since_is_left_alone_and_named(agent: Agent, ws: Path, turn: Turn) -> None:
    (ws / "a.txt").write_text("a0\n")
    (ws / "b.txt").write_text("b0\n")
    pid, _ = await turn(writes(("a.txt", "a1\n"), ("b.txt", "b1\n")))
    (ws / "b.txt").write_text("the user's own\n")
    done = await restore_turns(session_of(turn), [pid], agent.config.home)
    assert done.restored == ("a.txt",)
    assert done.skipped == (("b.txt", CHANGED_SINCE),)
    assert (ws / "b.txt").read_text() == "the user's own\n"
    assert (ws / "a.txt").read_text() == "a0\n"


async def test_two_turns_go_back_to_before_the_oldest(agent: Agent, ws: Path, turn: Turn) -> None:
    (ws / "f.txt").write_text("v0\n")
    first, _ = await turn(Reply(tool_calls=[tool("write_file", "w1", path="f.txt", content="v1\n")]))
    second, _ = await turn(writes(("f.txt", "v2\n"), ("g.txt", "g\n")))
    done = await restore_turns(session_of(turn), [second, first], agent.config.home)
    assert done == Restored(restored=("f.txt",), removed=("g.txt",))
    assert (ws / "f.txt").read_text() == "v0\n"


async def test_execute_changes_come_back_from_the_shadow_snapshot_and_the_users_git_is_untouched(
    agent: Agent, ws: Path, turn: Turn
) -> None:
    import anyio

    from crow import snapshots

    await anyio.run_process(["git", "init", "-q", str(ws)])
    (ws / ".gitignore").write_text("ignored.log\n")
    # a hostile or merely converting .gitattributes: neither runs nor changes a byte
    (ws / ".gitattributes").write_text("* text eol=crlf filter=pwn\n")
    await anyio.run_process(["git", "-C", str(ws), "config", "filter.pwn.clean", "touch PWNED; cat"])
    (ws / "tracked.txt").write_text("t0\n")
    (ws / "gone.txt").write_bytes(b"g0\r\n")
    (ws / "tool.sh").write_text("#!/bin/sh\n")
    (ws / "tool.sh").chmod(0o755)
    (ws / "ignored.log").write_text("i0\n")
    user_git = sorted(str(p.relative_to(ws)) for p in (ws / ".git").rglob("*"))
    pid, _ = await turn(
        Reply(
            tool_calls=[
                tool(
                    "execute",
                    "x1",
                    command="echo t1 > tracked.txt; rm gone.txt; echo new > made.txt; "
                    "chmod -x tool.sh; echo i1 > ignored.log",
                )
            ]
        ),
        Reply(tool_calls=[tool("write_file", "w1", path="tracked.txt", content="t2\n")]),
    )
    assert (ws / "tracked.txt").read_text() == "t2\n"
    done = await restore_turns(session_of(turn), [pid], agent.config.home)
    assert sorted(done.restored) == ["gone.txt", "tool.sh", "tracked.txt"]
    assert done.removed == ("made.txt",)
    assert (ws / "tracked.txt").read_bytes() == b"t0\n"
    assert not (ws / "PWNED").exists()
    assert (ws / "gone.txt").read_bytes() == b"g0\r\n"
    assert not (ws / "made.txt").exists()
    assert os.access(ws / "tool.sh", os.X_OK)
    assert (ws / "ignored.log").read_text() == "i1\n"  # .gitignore honoured: not snapshotted
    assert sorted(str(p.relative_to(ws)) for p in (ws / ".git").rglob("*")) == user_git
    assert "GIT_DIR" not in os.environ and "GIT_WORK_TREE" not in os.environ
    # every ref of the turn is gone, and with it the shadow git dir (its lock file stays)
    assert [p.name for p in (agent.config.home / "checkpoints" / "git").iterdir()] == [
        f".{snapshots.git_dir_for(agent.config.home, ws).name}.lock"
    ]


async def test_no_git_means_one_notice_and_file_tools_still_checkpointed(
    agent: Agent, ws: Path, turn: Turn, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crow import snapshots

    monkeypatch.setattr(snapshots.shutil, "which", lambda name: None)
    run = tool("execute", "x1", command="echo hi > cmd.txt")
    write = tool("write_file", "w1", path="tool.txt", content="x\n")
    pid, notices = await turn(Reply(tool_calls=[run, write]))
    _, again = await turn(Reply(tool_calls=[tool("execute", "x2", command="true")]))
    assert [n.title for n in notices] == ["Commands' changes not checkpointed"]
    assert "git is not installed" in notices[0].text
    assert again == []  # said once per session
    done = await restore_turns(session_of(turn), [pid], agent.config.home)
    assert done.removed == ("tool.txt",)
    assert (ws / "cmd.txt").exists()


async def test_a_workspace_over_the_size_limit_is_not_snapshotted(
    agent: Agent, ws: Path, turn: Turn, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crow import snapshots

    monkeypatch.setattr(snapshots, "MAX_FILES", 3)
    for i in range(5):
        (ws / f"f{i}.txt").write_text("x")
    _, notices = await turn(Reply(tool_calls=[tool("execute", "x1", command="true")]))
    assert len(notices) == 1 and "more than 3 files" in notices[0].text


async def test_symlink_attacks_are_refused(agent: Agent, ws: Path, tmp_path: Path, turn: Turn) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    (ws / "f.txt").write_text("f0\n")
    pid, _ = await turn(writes(("f.txt", "f1\n"), ("d/new.txt", "n\n")))
    # Someone swaps the file and the folder for symlinks out of the workspace since.
    (ws / "f.txt").unlink()
    (ws / "f.txt").symlink_to(outside / "secret.txt")
    shutil.rmtree(ws / "d")
    (ws / "d").symlink_to(outside)
    (outside / "new.txt").write_text("n\n")  # what the turn left, but outside
    done = await restore_turns(session_of(turn), [pid], agent.config.home)
    assert done.restored == done.removed == ()
    assert dict(done.skipped) == {
        "f.txt": "not restored: it is now a symlink",
        "d/new.txt": "not restored: it is now a symlink",
    }
    assert (outside / "secret.txt").read_text() == "secret\n"
    assert (outside / "new.txt").exists()
    # a symlink the model writes through is not copied out of the workspace into CROW_HOME
    (ws / "link.txt").symlink_to(outside / "secret.txt")
    await turn(Reply(tool_calls=[tool("write_file", "w3", path="link.txt", content="x")]))
    blobs = list((agent.config.home / "checkpoints").rglob("blobs/*"))
    assert all(b.read_bytes() != b"secret\n" for b in blobs)


async def test_big_binary_and_folder_paths(agent: Agent, ws: Path, turn: Turn, llm: ScriptedLLM) -> None:
    big, huge = ws / "big.txt", ws / "huge.bin"
    with big.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk used
    with huge.open("wb") as f:
        f.truncate(1 << 30)  # 1 GB, sparse
    (ws / "bin.dat").write_bytes(b"\x00\x01\xff" * 100)
    (ws / "folder").mkdir()
    (ws / "same.txt").write_text("same\n")
    pid, _ = await turn(
        Reply(
            tool_calls=[
                tool("write_file", "w1", path="big.txt", content="small now\n"),
                tool("write_file", "w2", path="bin.dat", content="text now\n"),
                tool("write_file", "w3", path="folder", content="x"),
                tool("write_file", "w4", path="huge.bin", content="y"),
                tool("edit_file", "w5", path="same.txt", old_text="absent", new_text="x"),  # fails
            ]
        )
    )
    assert "is a directory" in results(llm, 1)["w3"]
    folder = session_dir(agent.config.home, session_of(turn).id)
    assert folder is not None
    record = json.loads(next(folder.glob("*.json")).read_text())
    assert sorted(Path(p).name for p in record["files"]) == ["big.txt", "bin.dat", "huge.bin"]
    assert all(b.stat().st_size < 1024 for b in (folder / "blobs").iterdir())  # no big copy
    done = await restore_turns(session_of(turn), [pid], agent.config.home)
    assert done.restored == ("bin.dat",)
    assert (ws / "bin.dat").read_bytes() == b"\x00\x01\xff" * 100
    too_big = "was larger than 10 MB before the turn: no copy was kept"
    assert done.skipped == (("big.txt", too_big), ("huge.bin", too_big))
    assert big.read_text() == "small now\n"


async def test_a_full_disk_refuses_the_write_and_changes_nothing(
    agent: Agent, ws: Path, turn: Turn, llm: ScriptedLLM, small_disk: Path
) -> None:
    home = agent.config.home
    (home / "checkpoints").mkdir(parents=True, exist_ok=True)
    (home / "checkpoints").rmdir()
    (home / "checkpoints").symlink_to(small_disk)
    filler = small_disk / "filler"
    with filler.open("wb") as f:
        try:
            f.write(b"x" * (1024 * 1024))
        except OSError:
            pass
    (ws / "f.txt").write_text("before\n" * 1000)
    await turn(Reply(tool_calls=[tool("write_file", "w1", path="f.txt", content="after\n")]))
    assert "f.txt was not changed: crow could not save its checkpoint" in results(llm, 1)["w1"]
    assert (ws / "f.txt").read_text() == "before\n" * 1000
    filler.unlink()
    pid, _ = await turn(Reply(tool_calls=[tool("write_file", "w2", path="f.txt", content="after\n")]))
    assert (ws / "f.txt").read_text() == "after\n"
    assert (await restore_turns(session_of(turn), [pid], home)).restored == ("f.txt",)


async def test_a_damaged_checkpoint_restores_nothing(
    agent: Agent, ws: Path, turn: Turn
) -> None:
    (ws / "f.txt").write_text("f0\n")
    (ws / "g.txt").write_text("g0\n")
    pid, _ = await turn(writes(("f.txt", "f1\n"), ("g.txt", "g1\n")))
    folder = session_dir(agent.config.home, session_of(turn).id)
    assert folder is not None
    for blob in (folder / "blobs").iterdir():  # a torn copy (power cut before it reached disk)
        blob.write_bytes(b"")
    done = await restore_turns(session_of(turn), [pid], agent.config.home)
    assert dict(done.skipped) == {
        "f.txt": "its checkpoint copy is damaged",
        "g.txt": "its checkpoint copy is damaged",
    }
    assert (ws / "f.txt").read_text() == "f1\n"
    pid2, _ = await turn(Reply(tool_calls=[tool("write_file", "w3", path="f.txt", content="f2\n")]))
    manifest = folder / f"{pid2}.json"
    manifest.write_text("{not json")
    done = await restore_turns(session_of(turn), [pid2], agent.config.home)
    assert done.skipped == ((f"(turn {pid2})", "its checkpoint is damaged: nothing of it restored"),)
    assert (ws / "f.txt").read_text() == "f2\n"


async def test_unknown_and_hostile_ids_restore_nothing(agent: Agent, ws: Path, turn: Turn) -> None:
    await turn(Reply(tool_calls=[tool("write_file", "w1", path="f.txt", content="x")]))
    session = session_of(turn)
    for ids in (["no-such-turn"], ["../../etc/passwd"], [""], []):
        assert await restore_turns(session, ids, agent.config.home) == Restored()
    assert (ws / "f.txt").exists()


async def test_deleting_the_session_forgets_its_checkpoints(agent: Agent, ws: Path, turn: Turn) -> None:
    await turn(Reply(tool_calls=[tool("write_file", "w1", path="f.txt", content="x")]))
    session = session_of(turn)
    folder = session_dir(agent.config.home, session.id)
    assert folder is not None and list(folder.glob("*.json"))
    await agent.delete_session(session.id)
    assert not folder.exists()
    await forget_session("../escape", agent.config.home)  # not a folder name: nothing happens


async def test_only_the_last_turns_are_kept(
    agent: Agent, ws: Path, turn: Turn, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [(await turn(Reply(tool_calls=[tool("write_file", "w", path="f.txt", content="x")])))[0]]
    hook = next(h for h in agent.hooks.hooks if getattr(h, "name", "") == "checkpoints")
    monkeypatch.setattr(hook, "keep_turns", 2)
    for i in range(3):
        pid, _ = await turn(Reply(tool_calls=[tool("write_file", f"w{i}", path=f"f{i}.txt", content="x")]))
        ids.append(pid)
    folder = session_dir(agent.config.home, session_of(turn).id)
    assert folder is not None
    assert sorted(p.stem for p in folder.glob("*.json")) == sorted(ids[2:])


async def test_two_calls_on_one_path_in_one_batch_go_back_to_before_the_first(
    agent: Agent, ws: Path, turn: Turn, llm: ScriptedLLM
) -> None:
    (ws / "f.txt").write_text("zero\n")
    pid, _ = await turn(
        Reply(
            tool_calls=[
                tool("write_file", "w1", path="f.txt", content="one\n"),
                tool("edit_file", "e1", path="./f.txt", old_text="one", new_text="two"),
                tool("edit_file", "e2", path=str(ws / "f.txt"), old_text="nope", new_text="x"),  # fails
            ]
        )
    )
    assert (ws / "f.txt").read_text() == "two\n"
    done = await restore_turns(session_of(turn), [pid], agent.config.home)
    assert done == Restored(restored=("f.txt",))
    assert (ws / "f.txt").read_text() == "zero\n"


def test_a_crash_between_the_checkpoint_and_the_write(tmp_path: Path, ws: Path) -> None:
    """The checkpoint is saved before the write; crow killed before it records what the
    write left: a file the write never reached is left as it is, one it did is named."""
    import anyio

    from crow.checkpoints import TurnRecord
    from crow.session import Session

    home = tmp_path / "home"
    (ws / "untouched.txt").write_text("u0\n")
    (ws / "written.txt").write_text("w0\n")
    folder = session_dir(home, "s1")
    assert folder is not None
    record = TurnRecord(folder, "t1")

    async def before_each() -> None:
        for name in ("untouched.txt", "written.txt", "never.txt"):
            assert await record.before(ws, ws / name)

    anyio.run(before_each)
    (ws / "written.txt").write_text("w1\n")  # the write landed; crow was killed before after()
    done = anyio.run(restore_turns, Session("s1", ws), ["t1"], home)
    assert done.restored == done.removed == ()
    assert done.skipped == (
        ("written.txt", "crow stopped before it recorded what the turn left in it; left as it is"),
    )
    assert (ws / "written.txt").read_text() == "w1\n"
    assert not (ws / "never.txt").exists()


async def test_the_checkpoint_is_on_disk_before_the_tool_runs(agent: Agent, ws: Path, turn: Turn) -> None:
    """A hook inside the checkpoints hook (as the tool itself is) finds the file's copy saved
    already: a crash at that moment loses nothing."""
    (ws / "f.txt").write_text("before\n")
    seen: list[dict[str, Any]] = []

    async def inside(ctx: Any, call: Any, call_next: Any) -> Any:
        folder = session_dir(agent.config.home, ctx.session.id)
        assert folder is not None
        seen.append(json.loads((folder / f"{ctx.prompt_id}.json").read_text())["files"])
        return await call_next(call)

    await agent.ready()
    agent.hooks.register("wrap_tool_call", inside, name="inside")
    await turn(writes(("f.txt", "after\n")))
    entry = seen[0][str(ws / "f.txt")]
    assert entry["after"] == "sha256:" + sha256(b"after\n")  # a whole file: known beforehand
    blob = agent.config.home / "checkpoints" / session_of(turn).id / "blobs" / entry["before"]["sha256"]
    assert blob.read_text() == "before\n"
