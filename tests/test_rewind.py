"""Taking back turns (crow.rewind), in process on the real store: which turns there are, the
context before one (across a compaction, a hook's Replace, an earlier rewind), one atomic
write, what a replay leaves out, and the store's context history (fork, delete, migration).
The ACP and CLI entry points are proved end to end in test_e2e_rewind.py."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from crow import rewind as rw
from crow.actions import Continue, Replace
from crow.agent import Agent
from crow.checkpoints import Restored
from crow.config import Config
from crow.errors import CannotRewind, StoreError
from crow.events import Event, Notice
from crow.llm.base import ModelRequest, ModelResponse, ScriptedProvider
from crow.messages import Message, ToolCall, ai, human, validate
from crow.session import Session
from crow.store import SCHEMA_VERSION, SQLiteStore
from tests.support.store_backends import is_postgres, new_store

__all__ = ["new_store"]

pytestmark = pytest.mark.anyio

SUMMARY_MARK = "the conversation is about to be compacted"


def answer(request: ModelRequest) -> ModelResponse:
    """`a:<prompt>` for a prompt, a summary for a compaction; `tool <x>` calls echo(x) first."""
    last = request.messages[-1]
    if SUMMARY_MARK in last.content:
        return ModelResponse(ai("SUMMARY"))
    if last.role == "tool":
        return ModelResponse(ai(f"done: {last.content}"))
    if last.content.startswith("tool "):
        return ModelResponse(ai("", ToolCall("c", "echo", {"text": last.content[5:]})))
    return ModelResponse(ai(f"a:{last.content}"))


def echo(text: str) -> str:
    """Echo the text."""
    return f"echo {text}"


class Told:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def __call__(self, event: Event) -> None:
        self.events.append(event)

    @property
    def notices(self) -> list[Notice]:
        return [e for e in self.events if isinstance(e, Notice)]


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[Agent]:
    provider = ScriptedProvider(answer)
    agent = Agent(Config(home=tmp_path / "home"), provider=provider, builtin_hooks=False)
    agent.tool(echo)
    async with agent:
        yield agent


async def new(agent: Agent, tmp_path: Path, *prompts: str) -> tuple[Session, Told]:
    told = Told()
    session = agent.create_session(tmp_path)
    for text in prompts:
        await agent.prompt(session, human(text), told)
    return session, told


def said(messages: list[Message]) -> list[str]:
    return [m.content for m in messages if m.role != "system"]


def requested(agent: Agent) -> list[str]:
    provider: Any = agent.provider_for(None)
    return said(provider.requests[-1].messages)


# ------------------------------------------------------------------ the context comes back


async def test_undo_takes_back_the_last_turn_and_the_model_never_sees_it_again(
    agent: Agent, tmp_path: Path
) -> None:
    session, told = await new(agent, tmp_path, "q0", "q1")
    result = await agent.prompt(session, human("/undo"), told)
    assert result.stop_reason == "end_turn" and result.error is None
    assert said(session.messages) == ["q0", "a:q0"]
    assert said(await agent.store.load_context(session.id)) == ["q0", "a:q0"]
    notice = told.notices[-1]
    assert notice.title == "Undid the last turn" and "(“q1”)" in notice.text and notice.stored
    assert "No file changes were recorded to put back." in notice.text
    await agent.prompt(session, human("q2"), told)
    assert requested(agent) == ["q0", "a:q0", "q2"]
    # the transcript keeps everything, and the report once (stored with the context)
    transcript = await agent.store.load_transcript(session.id)
    assert said(transcript) == ["q0", "a:q0", "q1", "a:q1", "/undo", "q2", "a:q2"]
    assert [m.id for m in transcript if rw.is_marker(m)] == [notice.message_id]
    # a replay: the turn taken back is not shown; the command and its report are
    assert said(list(rw.shown(transcript))) == ["q0", "a:q0", "/undo", "q2", "a:q2"]
    assert [m.content for m in rw.shown(transcript) if m.role == "system"] == [notice.full_text]


async def test_rewind_goes_back_across_a_compaction_and_a_hooks_replace(agent: Agent, tmp_path: Path) -> None:
    async def replace(ctx: Any) -> Replace | None:
        return Replace([human("replaced by a hook")]) if ctx.prompt == "q3" else None

    agent.hooks.register("agent_stop", replace)
    session, told = await new(agent, tmp_path, "q0", "q1", "q2")
    compacted = await agent.compact(session)
    assert compacted.compacted and any("SUMMARY" in text for text in said(session.messages))
    await agent.prompt(session, human("q3"), told)
    assert said(session.messages) == ["replaced by a hook"]
    rewound = await rw.rewind(session, 3, agent.config.home)
    assert [m.content for m in rewound.prompts] == ["q1", "q2", "q3"]
    assert said(session.messages) == ["q0", "a:q0"] == said(await agent.store.load_context(session.id))
    await agent.prompt(session, human("next"), told)
    assert requested(agent) == ["q0", "a:q0", "next"]


async def test_a_rewind_after_a_rewind_counts_only_the_turns_still_there(
    agent: Agent, tmp_path: Path
) -> None:
    session, told = await new(agent, tmp_path, "q0", "q1")
    await agent.prompt(session, human("/undo"), told)  # q1 gone
    await agent.prompt(session, human("q2"), told)
    transcript = await agent.store.load_transcript(session.id)
    assert [m.content for _, m in rw.live_turns(transcript)] == ["q0", "q2"]
    rewound = await rw.rewind(session, 1, agent.config.home)
    assert [m.content for m in rewound.prompts] == ["q2"] and said(session.messages) == ["q0", "a:q0"]
    await agent.prompt(session, human("q3"), told)
    rewound = await rw.rewind(session, 2, agent.config.home)  # q3 and q0: back to the start
    assert [m.content for m in rewound.prompts] == ["q0", "q3"] and said(session.messages) == []
    shown = list(rw.shown(await agent.store.load_transcript(session.id)))
    assert said(shown) == [], "every turn and the earlier undo's report are taken back"
    assert [m.content.splitlines()[0] for m in shown if m.role == "system"] == [
        "Undid the last 2 turns (“q0”, “q3”): the conversation is back to before them."
    ]


async def test_steering_continue_and_command_lines_are_not_turns(agent: Agent, tmp_path: Path) -> None:
    once: list[bool] = []

    async def keep_going(ctx: Any) -> Continue | None:
        if once:
            return None
        once.append(True)
        return Continue(["and one more thing"])

    agent.hooks.register("agent_stop", keep_going)
    session, told = await new(agent, tmp_path, "q0", "q1")  # q0's turn has a Continue in it
    await agent.prompt(session, human("/compact"), told)
    transcript = await agent.store.load_transcript(session.id)
    assert [m.content for _, m in rw.live_turns(transcript)] == ["q0", "q1"]
    await rw.rewind(session, 1, agent.config.home)  # q1's turn, and the compaction after it
    assert said(session.messages) == ["q0", "a:q0", "and one more thing", "a:and one more thing"]


async def test_a_turn_with_tool_calls_leaves_no_orphan_results(agent: Agent, tmp_path: Path) -> None:
    session, _ = await new(agent, tmp_path, "tool x", "tool y")
    assert [m.role for m in session.messages].count("tool") == 2
    await rw.rewind(session, 1, agent.config.home)
    assert said(session.messages) == ["tool x", "", "echo x", "done: echo x"]
    validate(session.messages)


# ------------------------------------------------------------------ refusals change nothing


async def test_nothing_to_undo_and_too_many_turns_change_nothing(agent: Agent, tmp_path: Path) -> None:
    session, told = await new(agent, tmp_path)
    await agent.prompt(session, human("/undo"), told)
    assert told.notices[-1].text == "Nothing to undo: this session has no turn to take back."
    await agent.prompt(session, human("q0"), told)
    await agent.prompt(session, human("/undo 2"), told)
    assert told.notices[-1].text == "Cannot take back 2 turns: this session has 1; nothing was undone."
    await agent.prompt(session, human("/undo two"), told)
    assert "/undo takes a number of turns (default 1), not 'two'" in told.notices[-1].text
    with pytest.raises(CannotRewind) as refused:
        await rw.rewind(session, 5, agent.config.home)
    assert (refused.value.asked, refused.value.available) == (5, 1)
    assert said(session.messages) == ["q0", "a:q0"] == said(await agent.store.load_context(session.id))
    assert not any(rw.is_marker(m) for m in await agent.store.load_transcript(session.id))


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "3", None])
def test_a_turn_count_is_a_whole_number_from_one(value: object) -> None:
    with pytest.raises(ValueError):
        rw.checked_turns(value)
    assert rw.checked_turns(3) == 3


@pytest.mark.parametrize("text", ["0", "-1", "x", "1e3", "²", "1.5", "2 3"])
def test_a_typed_turn_count_is_digits(text: str) -> None:
    with pytest.raises(ValueError):
        rw.turns_in(text)
    assert (rw.turns_in(" 3 "), rw.turns_in(""), rw.turns_in("007")) == (3, 1, 7)


async def test_a_refused_write_leaves_the_session_as_it_was_then_the_rewind_works(
    agent: Agent, tmp_path: Path
) -> None:
    """The marker and the context are one transaction: a failure between them (here the
    marker's insert, refused by a trigger) stores neither, in the store or in memory."""
    session, _ = await new(agent, tmp_path, "q0", "q1")
    with closing(sqlite3.connect(agent.config.home / "crow.db")) as raw:
        raw.execute(
            "CREATE TRIGGER no_markers BEFORE INSERT ON entries WHEN NEW.in_context = 0"
            " BEGIN SELECT RAISE(ABORT, 'disk trouble'); END"
        )
        raw.commit()
    before = await agent.store.load_transcript(session.id)
    with pytest.raises(StoreError, match="disk trouble"):
        await rw.rewind(session, 1, agent.config.home)
    assert said(session.messages) == ["q0", "a:q0", "q1", "a:q1"]
    assert said(await agent.store.load_context(session.id)) == said(session.messages)
    assert await agent.store.load_transcript(session.id) == before
    with closing(sqlite3.connect(agent.config.home / "crow.db")) as raw:
        raw.execute("DROP TRIGGER no_markers")
        raw.commit()
    await rw.rewind(session, 1, agent.config.home)
    assert said(await agent.store.load_context(session.id)) == ["q0", "a:q0"]


async def test_files_are_put_back_first_and_a_failure_there_leaves_the_conversation(
    agent: Agent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import crow.checkpoints

    asked: list[list[str]] = []

    async def broken(session: Session, prompt_ids: list[str], home: Path) -> Restored:
        asked.append(list(prompt_ids))
        raise OSError("checkpoint unreadable")

    session, _ = await new(agent, tmp_path, "q0", "q1", "q2")
    monkeypatch.setattr(crow.checkpoints, "restore_turns", broken)
    with pytest.raises(OSError):
        await rw.rewind(session, 2, agent.config.home)
    transcript = await agent.store.load_transcript(session.id)
    prompts = [m for m in transcript if rw.is_prompt(m)]
    assert asked == [[prompts[2].id, prompts[1].id]], "the turns' prompt ids, newest first"
    assert said(session.messages) == said(await agent.store.load_context(session.id))
    assert len(said(session.messages)) == 6 and not any(rw.is_marker(m) for m in transcript)


def test_the_report_names_every_file_outcome() -> None:
    files = Restored(("a.py", "b.py"), ("new.txt",), (("c.py", "changed since the turn"),))
    notice = rw.report([human("fix it"), human("x" * 100)], files)
    assert notice.severity == "warning" and notice.title == "Undid the last 2 turns"
    assert notice.text.splitlines() == [
        f"Undid the last 2 turns (“fix it”, “{'x' * 59}…”): the conversation is back to before them.",
        "Files restored: a.py, b.py.",
        "Files removed (created by them): new.txt.",
        "Not restored: c.py (changed since the turn).",
    ]
    rewound = rw.Rewound(
        (
            human(
                "fix it",
            ),
        ),
        files,
        notice,
    )
    assert rewound.to_dict()["skipped"] == [{"path": "c.py", "reason": "changed since the turn"}]
    assert rw.report([human("q")], Restored()).severity == "info"


# ------------------------------------------------------------------ what a replay leaves out


def test_a_damaged_marker_hides_nothing() -> None:
    q = rw.as_prompt(human("q")).replace(id="p1")
    marker = Message("system", "undid", meta={"notice": {}, rw.REWIND: {"to": "nowhere"}}, id="m")
    transcript = [q, ai("a"), marker]
    assert rw.shown(transcript) is transcript
    assert [m.content for _, m in rw.live_turns(transcript)] == ["q"]
    later = Message("system", "undid", meta={"notice": {}, rw.REWIND: {"to": "p1"}}, id="m2")
    assert said(list(rw.shown([marker, q, ai("a"), later]))) == []  # a marker names only earlier prompts
    assert said(list(rw.shown([later, q]))) == ["q"]


# ------------------------------------------------------------------ the store's context history


async def test_the_store_knows_the_context_before_any_entry(new_store) -> None:
    async with new_store() as store:
        await store.create_session(id="s", cwd="/w")
        await store.append("s", [human("q0"), ai("a0"), human("q1"), ai("a1")])  # seqs 0-3
        await store.set_context("s", [human("summary"), ai("a1")])  # keeps a1's entry
        await store.set_context("s", [human("summary 2")])  # twice at the same length
        await store.append("s", [human("q2")])  # seq 4
        assert [m.content for m in await store.context_at("s", 2)] == ["q0", "a0"]
        assert [m.content for m in await store.context_at("s", 0)] == []
        assert [m.content for m in await store.context_at("s", 4)] == ["summary 2"]
        for bad in (-1, 5):
            with pytest.raises(StoreError, match=f"has no entry {bad}"):
                await store.context_at("s", bad)
        await store.fork_session("s", "copy")
        assert [m.content for m in await store.context_at("copy", 2)] == ["q0", "a0"]
        await store.delete_session("s")
        with pytest.raises(StoreError, match="unknown session"):
            await store.context_at("s", 0)
        assert [m.content for m in await store.context_at("copy", 3)] == ["q0", "a0", "q1"]
    if is_postgres(store):
        import psycopg

        with psycopg.connect(store._url) as pg:
            owners = pg.execute("SELECT DISTINCT session_id FROM context_history").fetchall()
    else:
        with closing(sqlite3.connect(store._path)) as raw:
            owners = raw.execute("SELECT DISTINCT session_id FROM context_history").fetchall()
    assert owners == [("copy",)], "the deleted session's history went with it"


async def test_a_store_from_before_the_history_opens_and_refuses_only_what_it_cannot_know(
    tmp_path: Path,
) -> None:
    db = tmp_path / "crow.db"
    async with SQLiteStore(db) as store:
        await store.create_session(id="old", cwd="/w")
        await store.append("old", [human("q0"), ai("a0"), human("q1"), ai("a1")])
        await store.set_context("old", [human("old summary"), ai("a1")])
    with closing(sqlite3.connect(db)) as raw:  # as a schema-3 crow left it
        raw.execute("DROP TABLE context_history")
        raw.execute("DROP INDEX sessions_by_parent")
        raw.execute("ALTER TABLE sessions DROP COLUMN parent_id")
        raw.execute("PRAGMA user_version = 3")
        raw.commit()
    async with SQLiteStore(db) as store:
        assert [m.content for m in await store.load_context("old")] == ["old summary", "a1"]
        with pytest.raises(StoreError, match="the context before entry 1 of session 'old' is not known"):
            await store.context_at("old", 1)
        await store.append("old", [human("q2")])
        assert [m.content for m in await store.context_at("old", 4)] == ["old summary", "a1"]
        session = Session("old", tmp_path, store=store)
        with pytest.raises(CannotRewind, match="Nothing to undo"):  # its prompts were never marked
            await rw.rewind(session, 1, tmp_path)
    with closing(sqlite3.connect(db)) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
