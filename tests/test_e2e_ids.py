"""End to end: every message chunk carries a `messageId` (ACP schema 1.25), the id of the
stored message, so `session/load` shows the same ids as the live turn, load after load.
Messages stored before ids existed get one from their place in the transcript."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import acp
import anyio
import pytest
import yaml

from tests.conftest import RecordingClient, crow_env, spawn_crow
from tests.llm_server import Cut, Reply, ScriptedLLM, ToolCallSpec
from tests.support.ts_client import run_script

pytestmark = pytest.mark.anyio
SUPPORT = Path(__file__).parent / "support"
KINDS = {
    "UserMessageChunk": "user",
    "AgentMessageChunk": "agent",
    "AgentThoughtChunk": "thought",
    "user_message_chunk": "user",
    "agent_message_chunk": "agent",
    "agent_thought_chunk": "thought",
}
Chunk = tuple[str, str | None, str]  # (user | agent | thought, messageId, text)


def chunks(updates: list[tuple[str, Any]]) -> list[Chunk]:
    """The message chunks among a Python client's updates, in order."""
    return [
        (KINDS[type(u).__name__], u.message_id, u.content.text)
        for _, u in updates
        if type(u).__name__ in KINDS
    ]


def ts_chunks(updates: list[dict[str, Any]]) -> list[Chunk]:
    """The message chunks among the TypeScript client's updates, in order."""
    return [
        (KINDS[u["update"]["sessionUpdate"]], u["update"].get("messageId"), u["update"]["content"]["text"])
        for u in updates
        if u["update"]["sessionUpdate"] in KINDS
    ]


def by_id(seen: list[Chunk]) -> dict[str, dict[str, str]]:
    """The messages the chunks make up: id -> {kind: text}, in the order they started.
    Every chunk has an id, and one id's chunks are contiguous (a new id is a new message)."""
    messages: dict[str, dict[str, str]] = {}
    last = None
    for kind, mid, text in seen:
        assert isinstance(mid, str) and mid, f"a {kind} chunk without a messageId: {text!r}"
        assert mid == last or mid not in messages, f"message {mid} resumed after another began"
        parts = messages.setdefault(mid, {})
        parts[kind] = parts.get(kind, "") + text
        last = mid
    return messages


async def start(conn: Any, workspace: Path) -> str:
    await conn.initialize(protocol_version=1)
    return (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id


async def load_twice(env: dict[str, str], workspace: Path, sid: str) -> list[dict[str, dict[str, str]]]:
    """What two `session/load`s of `sid` in a fresh crow show, message by message."""
    loads = []
    async with spawn_crow(env) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        for _ in range(2):
            before = len(client.updates)
            await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
            loads.append(by_id(chunks(client.updates[before:])))
    return loads


async def test_live_chunks_carry_the_ids_every_load_shows_again(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (workspace / "a.txt").write_text("alpha\n")
    llm.push(
        Reply(text="The first answer, in chunks", reasoning="thinking it over", chunk_size=4),
        Reply(tool_calls=[ToolCallSpec("read_file", {"path": "a.txt"})]),
        Reply(text="The second answer", chunk_size=3),
    )
    env = crow_env(llm, home)
    async with spawn_crow(env) as (conn, _proc, client):
        sid = await start(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("one")])
        await conn.prompt(session_id=sid, prompt=[acp.text_block("two")])
    live = by_id(chunks(client.updates))
    # thought and text of one reply are one message; the next reply is another
    assert list(live.values()) == [
        {"thought": "thinking it over", "agent": "The first answer, in chunks"},
        {"agent": "The second answer"},
    ]
    first, second = live
    loads = await load_twice(env, workspace, sid)
    assert list(loads[0].items()) == list(loads[1].items()), "two loads show the same ids"
    shown = list(loads[0].items())
    assert [parts for _, parts in shown] == [
        {"user": "one"},
        {"thought": "thinking it over", "agent": "The first answer, in chunks"},
        {"user": "two"},
        {"agent": "The second answer"},
    ]
    assert (shown[1][0], shown[3][0]) == (first, second), "the replayed answers keep their live ids"
    assert len({mid for mid, _ in shown}) == 4, "every message has an id of its own"


async def test_messages_stored_without_ids_get_the_same_ids_at_every_load(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    from crow.messages import Message, ToolCall
    from crow.store import SQLiteStore

    sid = "stored-before-ids"
    old = [
        Message("user", "old question"),
        Message("assistant", "old answer", thinking="old thought"),
        Message("system", "old notice", meta={"notice": True}),
        Message("assistant", "", (ToolCall("c1", "read_file", {"path": "a.txt"}),)),
        Message("tool", "alpha", tool_call_id="c1", name="read_file"),
        Message("assistant", "old done"),
    ]
    async with SQLiteStore(home / "crow.db") as store:
        await store.create_session(id=sid, cwd=str(workspace), title="old")
        await store.append(sid, old)
        assert not any(m.id for m in await store.load_transcript(sid)), "stored the old way"
    llm.push(Reply(text="a new answer"))
    env = crow_env(llm, home)
    async with spawn_crow(env) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        replayed = by_id(chunks(client.updates))
        before = len(client.updates)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("new question")])
        (new_answer,) = by_id(chunks(client.updates[before:]))
    assert list(replayed.values()) == [
        {"user": "old question"},
        {"thought": "old thought", "agent": "old answer"},
        {"agent": "old notice\n"},
        {"agent": "old done"},
    ]
    loads = await load_twice(env, workspace, sid)
    assert list(loads[0].items()) == list(loads[1].items())
    assert list(loads[0].items())[:4] == list(replayed.items()), "the old messages keep their ids"
    assert list(loads[0].items())[4:] == [
        (list(loads[0])[4], {"user": "new question"}),
        (new_answer, {"agent": "a new answer"}),
    ]
    assert len(loads[0]) == 6


async def test_a_cut_answer_is_stored_under_the_id_its_chunks_carried(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """The stream breaks after part of the answer was shown: what was shown is kept (marked)
    under the id it was shown with; the notice saying so is a message of its own."""
    llm.push(Cut(text="a partial answer that never finishes", after_chunks=3))
    env = crow_env(llm, home)
    async with spawn_crow(env) as (conn, _proc, client):
        sid = await start(conn, workspace)
        with pytest.raises(acp.RequestError) as failed:  # a failed turn answers an error
            await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
    assert failed.value.data["cause"] == "stream_cut"
    (partial, partial_parts), (notice, notice_parts) = by_id(chunks(client.updates)).items()
    assert partial_parts == {"agent": "a partial answer "}
    assert notice_parts["agent"].startswith("Model call failed")
    loads = await load_twice(env, workspace, sid)
    assert list(loads[0].items()) == list(loads[1].items())
    shown = loads[0]
    assert list(shown)[1:] == [partial, notice]
    assert shown[partial]["agent"].startswith("a partial answer") and "cut off" in shown[partial]["agent"]


class ChunkWatch(RecordingClient):
    """Sets `streaming` once `n` answer chunks have arrived."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.streaming = anyio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        await super().session_update(session_id, update, **kwargs)
        if len(self.of_type("AgentMessageChunk")) >= self.n:
            self.streaming.set()


async def test_an_answer_cancelled_mid_stream_is_stored_under_the_id_it_was_shown_with(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(
        Reply(text="one two three four five six seven eight nine ten", chunk_delay=0.2), Reply(text="next")
    )
    env = crow_env(llm, home)
    client = ChunkWatch(2)
    async with spawn_crow(env, client=client) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        async with anyio.create_task_group() as tg:
            tg.start_soon(conn.prompt, sid, [acp.text_block("count")])
            with anyio.fail_after(20):
                await client.streaming.wait()
            await conn.cancel(session_id=sid)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("again")])
    (cut, cut_parts), (_, next_parts) = by_id(chunks(client.updates)).items()
    assert cut_parts["agent"].startswith("one two ") and "ten" not in cut_parts["agent"]
    assert next_parts == {"agent": "next"}
    loads = await load_twice(env, workspace, sid)
    assert list(loads[0].items()) == list(loads[1].items())
    shown = list(loads[0].items())
    assert [parts for _, parts in shown][::2] == [{"user": "count"}, {"user": "again"}]
    assert shown[1][0] == cut and shown[1][1]["agent"].startswith(cut_parts["agent"])
    assert "interrupted by the user" in shown[1][1]["agent"]


async def test_a_retried_model_call_is_a_new_message(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    """A hook calls the model again after a cut: the discarded partial answer and the retry
    are two messages (a new id), and the stored answer keeps the retry's id."""
    config = home / "test-config.yaml"
    config.write_text(yaml.safe_dump({"hooks": {"extra": ["detail_plugins:RetryCut"]}}))
    llm.push(Cut(text="first try that breaks off", after_chunks=2), Reply(text="second try complete"))
    env = crow_env(llm, home, PYTHONPATH=str(SUPPORT))
    async with spawn_crow(env, "--config", str(config)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
    assert response.stop_reason == "end_turn"
    live = list(by_id(chunks(client.updates)).items())
    assert [parts for _, parts in live] == [
        {"agent": "first try "},
        {"agent": "\n[retrying the model call; the partial answer above is discarded]\n"},
        {"agent": "second try complete"},
    ]
    loads = await load_twice(env, workspace, sid)
    shown = list(loads[0].items())
    assert shown == list(loads[1].items())
    assert [parts for _, parts in shown] == [{"user": "go"}, live[1][1], live[2][1]]
    assert [mid for mid, _ in shown[1:]] == [live[1][0], live[2][0]], "the discarded try is never replayed"


async def test_a_message_added_again_gets_an_id_of_its_own(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """A hook sends the session's first message again, the same `Message` (its id too): the
    copy is stored under a new id, so no two messages of the session share one."""
    config = home / "test-config.yaml"
    config.write_text(yaml.safe_dump({"hooks": {"extra": ["detail_plugins:RepeatPrompt"]}}))
    llm.push(Reply(text="first"), Reply(text="second"))
    env = crow_env(llm, home, PYTHONPATH=str(SUPPORT))
    async with spawn_crow(env, "--config", str(config)) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("say it twice")])
    assert llm.requests[1].last_user_text == "say it twice", "the hook sent the prompt again"
    loads = await load_twice(env, workspace, sid)  # by_id refuses an id used twice
    assert list(loads[0].items()) == list(loads[1].items())
    assert list(loads[0].values()) == [
        {"user": "say it twice"},
        {"agent": "first"},
        {"user": "say it twice"},
        {"agent": "second"},
    ]


def test_the_typescript_client_sees_the_same_ids_live_and_replayed(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Reply(text="An answer with ids", reasoning="a thought first", chunk_size=5))
    new = {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "s"}
    prompt = {"sessionId": "${s.sessionId}", "prompt": [{"type": "text", "text": "hello"}]}
    env = crow_env(llm, home)
    first = run_script(
        {"steps": [new, {"request": "session/prompt", "params": prompt, "as": "p"}]}, env, workspace
    )
    sid = first["results"]["s"]["result"]["sessionId"]
    live = by_id(ts_chunks(first["updates"]))
    assert list(live.values()) == [{"thought": "a thought first", "agent": "An answer with ids"}]
    load = {"request": "session/load", "params": {"sessionId": sid, "cwd": str(workspace), "mcpServers": []}}
    second = run_script(
        {"steps": [{**load, "as": "load1"}, {**load, "as": "load2"}]},
        env,
        workspace,
    )
    assert "error" not in second["results"]["load1"] and "error" not in second["results"]["load2"]
    # the two loads replay the same chunks, one after the other
    replayed = ts_chunks(second["updates"])
    half = len(replayed) // 2
    assert replayed[:half] == replayed[half:]
    loads = [by_id(replayed[:half]), by_id(replayed[half:])]
    assert list(loads[0].items()) == list(loads[1].items())
    (user, user_parts), (answer, answer_parts) = loads[0].items()
    assert user_parts == {"user": "hello"} and answer_parts == live[answer] and user != answer
