"""Text that is not valid Unicode (lone UTF-16 surrogates) is repaired where it enters:
provider streams, and every message a session stores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crow.llm.base import TextDelta, ThoughtDelta
from crow.messages import Image, Message, ToolCall, valid_text, valid_value
from crow.session import Session
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec
from tests.test_providers import anthropic_provider, ask, collect, final, openai_provider

pytestmark = pytest.mark.anyio


def test_valid_text() -> None:
    assert valid_text("a\ud83db") == "a\ufffdb"
    assert valid_text("\ud83d\ude00") == "\U0001f600", "a pair that arrived as two code points is joined"
    assert valid_text("name\udcff.txt") == "name\ufffd.txt"  # surrogateescape
    text = "fine é 😀"
    assert valid_text(text) is text
    value = {"k": ["ok", {"n": 1}]}
    assert valid_value(value) is value
    assert valid_value({"k\ud800": ("x", "\udfff")}) == {"k\ufffd": ("x", "\ufffd")}


def test_message_valid_repairs_every_field_and_keeps_valid_ones() -> None:
    bad = Message(
        "assistant",
        "c\ud800",
        (ToolCall.from_raw("id", "write_file", json.dumps({"content": "x\ud800"})),),
        thinking="t\udfff",
        meta={"diff": {"new": "n\ud800"}},
        images=(Image("image/png", "QUJD"),),
    )
    good = bad.valid()
    assert (good.content, good.thinking, good.meta) == ("c\ufffd", "t\ufffd", {"diff": {"new": "n\ufffd"}})
    assert good.tool_calls[0].args == {"content": "x\ufffd"}
    assert json.loads(good.tool_calls[0].arguments_json) == {"content": "x\ufffd"}
    assert good.images == bad.images
    json.dumps(good.to_dict(), ensure_ascii=False).encode()  # encodes: no surrogate left
    assert good.valid() is good


async def test_session_add_stores_valid_text(tmp_path: Path) -> None:
    from crow.store import SQLiteStore

    async with SQLiteStore(tmp_path / "crow.db") as store:
        await store.create_session(id="s", cwd="/w")
        session = Session(id="s", cwd=Path("/w"), store=store)
        await session.add(Message("user", "hi \ud800"))
        await session.set_messages([Message("user", "ctx \udfff")])
        await session.save(title="t\ud800", todos=[{"id": "1", "title": "\udc80", "status": "pending"}])
        assert [m.content for m in session.messages] == ["ctx \ufffd"]
        assert [m.content for m in await store.load_transcript("s")] == ["hi \ufffd"]
        record = await store.get_session("s")
        assert record is not None and record.title == "t\ufffd" and record.todos[0]["title"] == "\ufffd"


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_provider_streams_yield_valid_text(llm: ScriptedLLM, api: str) -> None:
    llm.push(
        Reply(
            text="half \ud83d emoji",
            reasoning="think \udfff",
            tool_calls=[ToolCallSpec("f\ud800", {"a": "b"}, id="id\ud800")],
            chunk_size=4,
        )
    )
    provider = openai_provider(llm) if api == "openai" else anthropic_provider(llm)
    events = await collect(provider, ask())
    texts = [e.text for e in events if isinstance(e, TextDelta | ThoughtDelta)]
    for text in texts:
        text.encode()  # every delta hooks, traces and `crow run` see is valid
    message = final(events).message
    assert message.content == "half \ufffd emoji" and message.thinking == "think \ufffd"
    assert (message.tool_calls[0].id, message.tool_calls[0].name) == ("id\ufffd", "f\ufffd")
