"""crow/llm/body.py: a request body is what httpx's `json=` would send, its tools encoded once
per tool; through the providers against the scripted model server (real HTTP)."""

from __future__ import annotations

import dataclasses
import json
import math
from types import MappingProxyType
from typing import Any

import pytest

from crow.llm import ModelRequest, ToolSpec
from crow.llm.anthropic import AnthropicProvider
from crow.llm.body import RawJSON, ToolTexts, encode_body
from crow.llm.openai import OpenAIProvider
from crow.messages import Message
from tests.llm_server import Reply, ScriptedLLM

pytestmark = pytest.mark.anyio

READ = ToolSpec("read_file", "Read a file — ünïcode", {"type": "object", "properties": {"path": {"type": "string"}}})
WRITE = ToolSpec("write_file", "Write a file", MappingProxyType({"type": "object", "properties": {}}))


def test_a_body_is_encoded_as_httpx_encodes_json() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "héllo \u2028 \"q\" \\ 😀"}], "n": 1.5}
    httpx_way = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    assert encode_body(body) == httpx_way
    spliced = encode_body({**body, "tools": RawJSON('[{"a":1}]')})
    assert json.loads(spliced) == {**body, "tools": [{"a": 1}]}
    odd_keys = {"model": "m", 1: "x", None: "y", "tools": RawJSON("[]")}
    assert json.loads(encode_body(odd_keys)) == {"model": "m", "1": "x", "null": "y", "tools": []}
    with pytest.raises(ValueError):  # as httpx: NaN is not JSON
        encode_body({"temperature": math.nan})


def test_each_tool_is_converted_once_and_a_changed_one_again() -> None:
    converted: list[str] = []

    def convert(tool: ToolSpec) -> dict[str, Any]:
        converted.append(tool.name)
        return {"name": tool.name, "description": tool.description, "schema": dict(tool.parameters)}

    texts = ToolTexts(convert)
    first = texts([READ, WRITE])
    assert [json.loads(t) for t in first] == [convert(READ), convert(WRITE)]
    converted.clear()
    assert texts([READ, WRITE]) == first and texts([dataclasses.replace(READ, kind="read")]) == first[:1]
    assert converted == []  # the same tools (or a copy with only crow's own fields changed)
    described = dataclasses.replace(READ, description="Read a file, or two")
    assert json.loads(texts([described])[0])["description"] == "Read a file, or two"
    new_schema = dataclasses.replace(READ, parameters={"type": "object", "properties": {}})
    assert json.loads(texts([new_schema])[0])["schema"] == {"type": "object", "properties": {}}
    assert converted == ["read_file", "read_file"]


def test_the_kept_texts_are_bounded() -> None:
    texts = ToolTexts(lambda tool: {"name": tool.name})
    for i in range(ToolTexts.LIMIT + 10):
        texts([ToolSpec(f"t{i}", "", {})])
    assert len(texts._texts) <= ToolTexts.LIMIT


async def call_twice(llm: ScriptedLLM, provider: OpenAIProvider | AnthropicProvider) -> None:
    """Two model calls, the tools (READ, WRITE) then (WRITE, READ); the provider closed."""
    llm.push(Reply(text="one"), Reply(text="two"))
    try:
        for tools in ((READ, WRITE), (WRITE, READ)):
            async for _ in provider.stream(ModelRequest([Message("user", "hi")], tools)):
                pass
    finally:
        await provider.aclose()


async def test_openai_sends_the_tools_as_before_call_after_call(llm: ScriptedLLM) -> None:
    await call_twice(llm, OpenAIProvider("m", base_url=llm.base_url, api_key="k", max_retries=1))
    expected = [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": dict(t.parameters)}}
        for t in (READ, WRITE)
    ]
    assert [r.body["tools"] for r in llm.requests] == [expected, expected[::-1]]
    assert all(r.headers["content-type"] == "application/json" for r in llm.requests)


async def test_anthropic_marks_only_the_last_tool_of_each_call(llm: ScriptedLLM) -> None:
    """The last tool carries the cache breakpoint; the text kept for it does not, so when it
    is not last in a later call it goes without one."""
    await call_twice(llm, AnthropicProvider("claude-test", base_url=llm.root_url, api_key="k", max_retries=1))
    marked = {"type": "ephemeral"}
    sent = [[(t["name"], t.get("cache_control")) for t in r.body["tools"]] for r in llm.requests]
    assert sent == [[("read_file", None), ("write_file", marked)], [("write_file", None), ("read_file", marked)]]
    assert llm.requests[0].body["tools"][0]["input_schema"] == dict(READ.parameters)
