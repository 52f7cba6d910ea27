# ruff: noqa: F811 (the fixtures of tests/test_checkpoints.py, imported, are parameters here)
"""Checkpoints on a PostgreSQL store (the real server: the `postgres`/`pg_url` fixtures):
each turn's record is a row of the database, saved before the tool changes the file, while
the copies of the files (blobs) stay in CROW_HOME; a record the database refuses is no
change; pruning, forking and deleting act on the rows. Real crow turns (every builtin
hook, the in-process filesystem server) driven by the scripted model server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from crow.agent import Agent
from crow.checkpoints import Restored, restore_turns, session_dir, sha256
from crow.config import Config
from tests.llm_server import Reply, ScriptedLLM
from tests.test_checkpoints import Turn, results, session_of, tool, turn, writes, ws  # noqa: F401 (fixtures)

pytestmark = pytest.mark.anyio


@pytest.fixture
async def agent(
    tmp_path: Path, llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch, pg_url: str
) -> AsyncIterator[Agent]:
    monkeypatch.setenv("OPENAI_BASE_URL", llm.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.delenv("CROW_TRACE", raising=False)
    home = tmp_path / "home"
    config = Config(model="openai:scripted", home=home, mode="yolo", sandbox="off", store=pg_url)
    async with Agent(config) as a:
        yield a


def database(url: str) -> str:
    return url.split("?")[0].rsplit("/", 1)[1]


def turns_in_db(postgres: Any, url: str, session_id: str) -> list[str]:
    """The turns the database holds a checkpoint of, in the order saved (psql: not crow's code)."""
    out = postgres.psql(
        f"SELECT turn_id FROM checkpoints WHERE session_id = '{session_id}' ORDER BY n", database(url)
    )
    return out.split()


def files_in(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


async def test_the_record_is_a_row_saved_before_the_tool_runs_and_the_blobs_stay_in_crow_home(
    agent: Agent, ws: Path, turn: Turn, postgres: Any, pg_url: str
) -> None:
    (ws / "f.txt").write_text("before\n")
    seen: list[dict[str, Any]] = []

    async def inside(ctx: Any, call: Any, call_next: Any) -> Any:  # runs where the tool does
        text = await ctx.session.store.load_checkpoint(ctx.session.id, ctx.prompt_id)
        seen.append(json.loads(text)["files"])
        return await call_next(call)

    await agent.ready()
    agent.hooks.register("wrap_tool_call", inside, name="inside")
    pid, _ = await turn(writes(("f.txt", "after\n"), ("new.txt", "made\n")))
    # The two writes run at once: the record each call saw holds at least its own file.
    entry = next(files[str(ws / "f.txt")] for files in seen if str(ws / "f.txt") in files)
    assert entry["after"] == "sha256:" + sha256(b"after\n")
    sid = session_of(turn).id
    folder = session_dir(agent.config.home, sid)
    assert folder is not None
    assert files_in(folder) == [f"blobs/{entry['before']['sha256']}"], "no record in CROW_HOME"
    assert turns_in_db(postgres, pg_url, sid) == [pid]

    done = await restore_turns(session_of(turn), [pid], agent.config.home)
    assert done == Restored(restored=("f.txt",), removed=("new.txt",))
    assert (ws / "f.txt").read_text() == "before\n" and not (ws / "new.txt").exists()
    assert turns_in_db(postgres, pg_url, sid) == []
    assert files_in(folder) == [], "the blob went with its turn"


REFUSE = (
    "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS"
    " $$BEGIN RAISE EXCEPTION 'checkpoints refused'; END$$;"
    " CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON checkpoints FOR EACH ROW EXECUTE FUNCTION refuse()"
)
REFUSED = (
    "f.txt was not changed: crow could not save its checkpoint: save_checkpoint failed: checkpoints refused"
)


async def test_a_record_the_database_refuses_leaves_the_file_unchanged(
    agent: Agent, ws: Path, turn: Turn, llm: ScriptedLLM, postgres: Any, pg_url: str
) -> None:
    await agent.ready()  # the tables exist
    postgres.psql(REFUSE, database(pg_url))
    (ws / "f.txt").write_text("before\n")
    await turn(writes(("f.txt", "after\n")))
    assert REFUSED in results(llm, 1)["w0"]
    assert (ws / "f.txt").read_text() == "before\n"

    postgres.psql("DROP TRIGGER refuse ON checkpoints", database(pg_url))
    pid, _ = await turn(writes(("f.txt", "after\n")))
    assert (ws / "f.txt").read_text() == "after\n"
    assert (await restore_turns(session_of(turn), [pid], agent.config.home)).restored == ("f.txt",)
    assert (ws / "f.txt").read_text() == "before\n"


async def test_a_refused_record_is_saved_by_the_next_call_on_the_file_in_the_turn(
    agent: Agent, ws: Path, turn: Turn, llm: ScriptedLLM, postgres: Any, pg_url: str
) -> None:
    """The write refused records nothing: the model's next write of the file, once the
    database takes records again, is checkpointed before it runs, as a first one (it was
    not: the refused entry stayed in the turn's record in memory, so the retry ran with no
    record saved; only the end of the turn saved it, too late for a crash meanwhile)."""
    await agent.ready()
    postgres.psql(REFUSE, database(pg_url))
    (ws / "f.txt").write_text("before\n")
    stored: list[list[str] | None] = []  # what the database holds as each write runs

    async def inside(ctx: Any, call: Any, call_next: Any) -> Any:
        text = await ctx.session.store.load_checkpoint(ctx.session.id, ctx.prompt_id)
        stored.append(None if text is None else list(json.loads(text)["files"]))
        return await call_next(call)

    agent.hooks.register("wrap_tool_call", inside, name="inside")

    def again(_req: Any) -> Reply:
        postgres.psql("DROP TRIGGER refuse ON checkpoints", database(pg_url))
        return writes(("f.txt", "after\n"))

    llm.rule(lambda req: REFUSED in str(req.messages[-1].get("content")), again, times=1)
    pid, _ = await turn(writes(("f.txt", "after\n")))
    assert REFUSED in results(llm, 1)["w0"]
    assert llm.requests[2].messages[-1]["content"].startswith("Wrote"), "the retry ran"
    assert stored == [[str(ws / "f.txt")]], "saved before the retry ran (the refused call never ran)"
    assert (ws / "f.txt").read_text() == "after\n"
    done = await restore_turns(session_of(turn), [pid], agent.config.home)
    assert done == Restored(restored=("f.txt",))
    assert (ws / "f.txt").read_text() == "before\n"


async def test_only_the_last_turns_are_kept_in_the_database(
    agent: Agent, ws: Path, turn: Turn, postgres: Any, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (ws / "f.txt").write_text("v0\n")
    await agent.ready()
    hook = next(h for h in agent.hooks.hooks if getattr(h, "name", "") == "checkpoints")
    monkeypatch.setattr(hook, "keep_turns", 2)
    ids = [(await turn(writes((f"f{i}.txt", f"v{i}\n"), ("f.txt", f"v{i + 1}\n"))))[0] for i in range(4)]
    sid = session_of(turn).id
    assert turns_in_db(postgres, pg_url, sid) == ids[2:]
    folder = session_dir(agent.config.home, sid)
    assert folder is not None
    kept = {sha256(b"v2\n"), sha256(b"v3\n")}  # f.txt before each kept turn
    assert files_in(folder) == sorted(f"blobs/{b}" for b in kept), "the pruned turns' blobs are gone"


async def test_a_fork_carries_the_records_and_a_delete_forgets_them(
    agent: Agent, ws: Path, turn: Turn, postgres: Any, pg_url: str
) -> None:
    (ws / "f.txt").write_text("v0\n")
    pid, _ = await turn(
        Reply(
            tool_calls=[
                tool("write_file", "w1", path="f.txt", content="v1\n"),
                tool("execute", "x1", command="echo ran > cmd.txt"),
            ]
        )
    )
    source = session_of(turn).id
    home = agent.config.home
    fork = await agent.fork_session(source)
    assert turns_in_db(postgres, pg_url, fork) == [pid]
    await agent.delete_session(source)
    assert turns_in_db(postgres, pg_url, source) == []
    assert not (home / "checkpoints" / source).exists()

    forked = await agent.resume_session(fork, cwd=str(ws))
    done = await restore_turns(forked, [pid], home)  # the fork's blobs and snapshot refs
    assert done == Restored(restored=("f.txt",), removed=("cmd.txt",))
    assert (ws / "f.txt").read_text() == "v0\n" and not (ws / "cmd.txt").exists()

    pid2, _ = await turn(writes(("g.txt", "g\n")), session=forked)
    assert turns_in_db(postgres, pg_url, fork) == [pid2]
    await agent.delete_session(fork)
    assert turns_in_db(postgres, pg_url, fork) == []
    assert postgres.psql("SELECT count(*) FROM checkpoints", database(pg_url)).strip() == "0"
    assert [p.name for p in (home / "checkpoints").iterdir() if p.name != "git"] == []
    assert [p for p in (home / "checkpoints" / "git").iterdir() if p.is_dir()] == [], "no snapshot ref left"


async def test_crow_sessions_migrate_brings_the_checkpoints_and_project_rules_along(
    tmp_path: Path, ws: Path, llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch, postgres: Any, pg_url: str
) -> None:
    """A turn checkpointed on the SQLite store, and a project rule in rules.json, hold once
    `crow sessions migrate` copied the store into PostgreSQL: the records go to the database
    (the blobs stay in CROW_HOME, where they were), the rules too."""
    import sys

    import anyio

    from crow import ProjectRules
    from crow.messages import human
    from tests.conftest import crow_env

    async def ignore(event: Any) -> None:
        pass

    monkeypatch.setenv("OPENAI_BASE_URL", llm.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    home = tmp_path / "home"
    config = Config(model="openai:scripted", home=home, mode="yolo", sandbox="off")
    (ws / "f.txt").write_text("v0\n")
    async with Agent(config) as on_sqlite:
        session = on_sqlite.create_session(str(ws))
        llm.push(writes(("f.txt", "v1\n")), Reply(text="done"))
        await on_sqlite.run_turn(session, human("go"), ignore)
        pid = [m for m in session.messages if m.role == "user"][-1].id
    assert await ProjectRules(home).add(ws, ["execute(echo *)"])

    migrate = [sys.executable, "-m", "crow", "sessions", "migrate", "--to", pg_url]
    done = await anyio.run_process(migrate, env=crow_env(None, home), check=False)
    assert done.returncode == 0, done.stderr
    assert turns_in_db(postgres, pg_url, session.id) == [pid]
    assert postgres.psql("SELECT rule FROM project_rules", database(pg_url)).strip() == "execute(echo *)"

    async with Agent(config.model_copy(update={"store": pg_url})) as on_postgres:
        moved = await on_postgres.resume_session(session.id, cwd=str(ws))
        assert await ProjectRules(home, on_postgres.store).allowed(ws) == ["execute(echo *)"]
        assert await restore_turns(moved, [pid], home) == Restored(restored=("f.txt",))
    assert (ws / "f.txt").read_text() == "v0\n"
