"""The scripted model server speaks both wire formats correctly and injects faults faithfully."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.llm_server import Cut, Fault, Reply, ScriptedLLM, Stall, ToolCallSpec

USER = [{"role": "user", "content": "hi there"}]


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as server:
        yield server


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=5) as c:
        yield c


def openai(llm: ScriptedLLM, client: httpx.Client, stream: bool = True, **body: Any) -> Any:
    payload = {"model": "m", "messages": USER, "stream": stream, **body}
    r = client.post(f"{llm.base_url}/chat/completions", json=payload)
    if not stream or r.status_code != 200:
        return r
    assert r.headers["content-type"] == "text/event-stream"
    return [ln[6:] for ln in r.text.split("\n") if ln.startswith("data: ")]


def anthropic(llm: ScriptedLLM, client: httpx.Client, stream: bool = True, **body: Any) -> Any:
    payload = {"model": "m", "max_tokens": 100, "messages": USER, "stream": stream, **body}
    r = client.post(f"{llm.root_url}/v1/messages", json=payload)
    if not stream or r.status_code != 200:
        return r
    events, lines = [], r.text.split("\n")
    for name, data in itertools.pairwise(lines):
        if name.startswith("event: "):
            payload = json.loads(data.removeprefix("data: "))
            assert payload["type"] == name[7:]
            events.append(payload)
    return events


def test_openai_stream_text_usage_and_done(llm: ScriptedLLM, client: httpx.Client) -> None:
    llm.push(Reply(text="Hello brave new world", usage=(12, 5)))
    data = openai(llm, client, stream_options={"include_usage": True})
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    deltas = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert "".join(d for d in deltas if d) == "Hello brave new world"
    assert len([d for d in deltas if d]) == 4  # word chunks
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["prompt_tokens"] == 12
    assert chunks[-1]["usage"]["total_tokens"] == 17


def test_openai_stream_without_include_usage_has_no_usage_chunk(
    llm: ScriptedLLM, client: httpx.Client
) -> None:
    data = openai(llm, client)
    assert all("usage" not in json.loads(d) for d in data[:-1])
    assert (
        "".join(json.loads(d)["choices"][0]["delta"].get("content", "") for d in data[:-1]) == "ok"
    )


def assemble_openai_tools(data: list[str]) -> tuple[dict[int, dict[str, str]], list[int], str]:
    calls: dict[int, dict[str, str]] = {}
    order, finish = [], ""
    for d in data[:-1]:
        choice = json.loads(d)["choices"][0]
        finish = choice["finish_reason"] or finish
        for tc in choice["delta"].get("tool_calls", []):
            order.append(tc["index"])
            slot = calls.setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
            slot["id"] += tc.get("id", "")
            slot["name"] += tc.get("function", {}).get("name", "")
            slot["arguments"] += tc["function"]["arguments"]
    return calls, order, finish


def test_tool_call_fragments_reassemble_exactly(llm: ScriptedLLM, client: httpx.Client) -> None:
    args0 = {"path": "src/a.txt", "offset": 10}
    args1 = {"command": "echo 'hi'", "timeout": 3}
    llm.push(Reply(tool_calls=[ToolCallSpec("read_file", args0), ToolCallSpec("bash", args1)]))
    calls, order, finish = assemble_openai_tools(openai(llm, client))
    assert finish == "tool_calls"
    assert calls[0] == {"id": "call_1", "name": "read_file", "arguments": json.dumps(args0)}
    assert calls[1] == {"id": "call_2", "name": "bash", "arguments": json.dumps(args1)}
    assert order != sorted(order)  # fragments interleave across indexes
    assert order.count(0) >= 3


def test_invalid_raw_arguments_pass_through_verbatim(
    llm: ScriptedLLM, client: httpx.Client
) -> None:
    raw = '{"path": "a.txt", "bad json'
    llm.push(Reply(tool_calls=[ToolCallSpec("x", raw_arguments=raw, id="my-id")]))
    llm.push(Reply(tool_calls=[ToolCallSpec("x", raw_arguments=raw)]))
    calls, _, _ = assemble_openai_tools(openai(llm, client))
    assert calls[0]["arguments"] == raw and calls[0]["id"] == "my-id"
    msg = openai(llm, client, stream=False).json()["choices"][0]["message"]
    assert msg["tool_calls"][0]["function"]["arguments"] == raw


def test_reasoning_content_streams_before_content(llm: ScriptedLLM, client: httpx.Client) -> None:
    llm.push(Reply(text="answer", reasoning="let me think", chunk_size=4))
    deltas = [json.loads(d)["choices"][0]["delta"] for d in openai(llm, client)[:-1]]
    kinds = [k for d in deltas for k in d if k in ("reasoning_content", "content") and d[k]]
    assert kinds == ["reasoning_content"] * 3 + ["content"] * 2
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "let me think"


def test_openai_non_streaming_shape(llm: ScriptedLLM, client: httpx.Client) -> None:
    llm.push(Reply(text="done", tool_calls=[ToolCallSpec("f", {"a": 1})], finish_reason="length"))
    body = openai(llm, client, stream=False).json()
    assert body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] == "done"
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert body["usage"]["completion_tokens"] == len('done{"a": 1}') // 4  # chars/4 estimate
    llm.push(Reply(empty=True, text="ignored"))
    msg = openai(llm, client, stream=False).json()["choices"][0]["message"]
    assert msg["content"] is None and "tool_calls" not in msg


def test_anthropic_stream_event_sequence(llm: ScriptedLLM, client: httpx.Client) -> None:
    args = {"path": "a.txt"}
    llm.push(
        Reply(
            text="Hi there",
            reasoning="hmm",
            tool_calls=[ToolCallSpec("read_file", args)],
            usage=(50, 7),
            cache=(40, 10),
        )
    )
    events = anthropic(llm, client)
    types = [e["type"] for e in events]
    assert types[:2] == ["message_start", "ping"]
    assert types[-2:] == ["message_delta", "message_stop"]
    usage = events[0]["message"]["usage"]
    assert (usage["input_tokens"], usage["cache_read_input_tokens"]) == (50, 40)
    assert usage["cache_creation_input_tokens"] == 10
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use"]
    by_index: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        if e["type"] == "content_block_delta":
            by_index.setdefault(e["index"], []).append(e["delta"])
    assert {d["type"] for d in by_index[0]} == {"thinking_delta", "signature_delta"}
    assert "".join(d["text"] for d in by_index[1]) == "Hi there"
    partial = "".join(d["partial_json"] for d in by_index[2])
    assert partial == json.dumps(args) and len(by_index[2]) > 2
    tool_start = next(e for e in events if e.get("content_block", {}).get("type") == "tool_use")
    assert tool_start["content_block"]["id"] == "call_1"
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    assert events[-2]["usage"]["output_tokens"] == 7


def test_anthropic_non_streaming_and_errors(llm: ScriptedLLM, client: httpx.Client) -> None:
    llm.push(Reply(text="yo", finish_reason="length"), Fault(status=529))
    body = anthropic(llm, client, stream=False).json()
    assert body["type"] == "message" and body["content"] == [{"type": "text", "text": "yo"}]
    assert body["stop_reason"] == "max_tokens"
    r = anthropic(llm, client)
    assert r.status_code == 529
    assert r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "overloaded_error"


def test_429_with_retry_after_then_success(llm: ScriptedLLM, client: httpx.Client) -> None:
    llm.push(Fault(status=429, retry_after=0.1, times=2), Reply(text="finally"))
    for _ in range(2):
        r = openai(llm, client)
        assert r.status_code == 429
        assert r.headers["retry-after"] == "0.1" and r.headers["retry-after-ms"] == "100"
        assert r.json()["error"]["type"] == "rate_limit_error"
    data = openai(llm, client)
    assert json.loads(data[1])["choices"][0]["delta"]["content"] == "finally"
    assert len(llm.requests) == 3 and isinstance(llm.requests[0].step, Fault)
    assert llm.pending == 0
    llm.push(Fault(status=400, message="bad request"))
    assert openai(llm, client).json()["error"]["message"] == "bad request"


def test_cut_produces_incomplete_stream(llm: ScriptedLLM, client: httpx.Client) -> None:
    llm.push(Cut(after_chunks=2, text="partial answer that never finishes"))
    got: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError):
        with client.stream("POST", f"{llm.base_url}/chat/completions", json={"stream": True}) as r:
            got.extend(r.iter_lines())
    content = [json.loads(ln[6:])["choices"][0]["delta"].get("content") for ln in got if ln]
    assert "".join(c for c in content if c) == "partial answer "
    assert "data: [DONE]" not in got
    assert openai(llm, client)[-1] == "[DONE]"  # the server keeps working


def test_rules_and_default(llm: ScriptedLLM, client: httpx.Client) -> None:
    def text(messages: list[dict[str, str]]) -> str:
        data = openai(llm, client, messages=messages)
        return "".join(json.loads(d)["choices"][0]["delta"].get("content", "") for d in data[:-1])

    llm.rule(lambda r: "weather" in r.last_user_text, Reply(text="sunny"))
    llm.rule(lambda r: "once" in r.last_user_text, Reply(text="first"), times=1)
    llm.push(Reply(text="queued"))
    assert text([{"role": "user", "content": "weather?"}]) == "sunny"
    assert text([{"role": "user", "content": "once"}]) == "first"
    assert text([{"role": "user", "content": "once"}]) == "queued"
    assert text([{"role": "user", "content": "once"}]) == "ok"
    assert text([{"role": "user", "content": "weather again"}]) == "sunny"
    llm.default = lambda r: Reply(text=f"echo: {r.last_user_text}")
    assert text([{"role": "user", "content": "ping"}]) == "echo: ping"


def test_request_log_normalizes_both_formats(llm: ScriptedLLM, client: httpx.Client) -> None:
    openai_msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "read a"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "rf", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "A"},
    ]
    tools = [{"type": "function", "function": {"name": "rf", "parameters": {}}}]
    openai(llm, client, messages=openai_msgs, tools=tools)
    anthropic_msgs = [
        {"role": "user", "content": "read a"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "rf", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "A"}],
        },
    ]
    anthropic(llm, client, stream=False, messages=anthropic_msgs, system="be brief")
    a, b = llm.wait_for_requests(2, timeout=1)
    assert (a.api, a.stream, b.api, b.stream) == ("openai", True, "anthropic", False)
    assert a.tool_names == ["rf"] and a.system == b.system == "be brief"
    assert a.last_user_text == b.last_user_text == "read a"
    assert a.messages[1:] == [
        {"role": "user", "content": "read a"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "name": "rf", "arguments": {}}],
        },
        {"role": "tool", "content": "A", "tool_call_id": "c1"},
    ]
    assert b.messages[1:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "t1", "name": "rf", "arguments": {}}],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "A", "is_error": False},
    ]
    assert a.headers["content-type"] == "application/json" and a.elapsed > 0
    assert a.peer == b.peer  # one keep-alive connection
    assert client.get(f"{llm.base_url}/models").json()["data"][0]["id"] == "scripted-model"


def test_client_disconnect_mid_stream_is_counted(llm: ScriptedLLM, client: httpx.Client) -> None:
    llm.push(Reply(text="word " * 200, chunk_delay=0.01))
    with client.stream("POST", f"{llm.base_url}/chat/completions", json={"stream": True}) as r:
        next(r.iter_lines())
    deadline = time.monotonic() + 2
    while llm.disconnects == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert llm.disconnects == 1 and llm.requests[0].disconnected
    openai(llm, client)  # a complete stream is not a disconnect
    assert llm.disconnects == 1


def test_stall_read_timeout_and_prompt_stop(client: httpx.Client) -> None:
    llm = ScriptedLLM().start()
    llm.push(Stall(seconds=0.05, then=Reply(text="late")), Stall(seconds=0.5), Stall(seconds=30))
    assert json.loads(openai(llm, client)[1])["choices"][0]["delta"]["content"] == "late"
    with pytest.raises(httpx.ReadTimeout):  # headers arrive, then nothing
        with client.stream(
            "POST", f"{llm.base_url}/chat/completions", json={"stream": True}, timeout=0.1
        ) as r:
            assert r.status_code == 200
            r.read()
    errors: list[Exception] = []

    def hang() -> None:
        try:
            httpx.post(f"{llm.base_url}/chat/completions", json={"stream": True}, timeout=10).read()
        except httpx.HTTPError as e:
            errors.append(e)

    t = threading.Thread(target=hang)
    t.start()
    llm.wait_for_requests(3, timeout=2)
    t0 = time.monotonic()
    llm.stop()
    assert time.monotonic() - t0 < 0.5
    t.join(2)
    assert not t.is_alive() and errors


def test_cli_serves_fixed_text() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.llm_server", "--port", "0", "--text", "hi"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert proc.stdout is not None
        base = proc.stdout.readline().strip()
        r = httpx.post(f"{base}/chat/completions", json={"messages": USER}, timeout=5)
        assert r.json()["choices"][0]["message"]["content"] == "hi"
    finally:
        proc.terminate()
        proc.wait(5)
