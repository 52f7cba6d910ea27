"""OpenAI-compatible and Anthropic providers against a real local HTTP server (and a few
MockTransport cases for wire shapes the scripted server does not produce)."""

from __future__ import annotations

import contextlib
import json
import re
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from email.utils import formatdate
from typing import Any

import anyio
import httpx2
import pytest

from crow.errors import (
    AuthError,
    ConfigError,
    ContextLengthError,
    ProviderError,
    RateLimitError,
    StreamCutError,
)
from crow.llm import (
    ModelEvent,
    ModelRequest,
    ModelResponse,
    ModelSettings,
    ProviderSettings,
    TextDelta,
    ThoughtDelta,
    ToolCallDelta,
    ToolSpec,
    Usage,
    create_provider,
    default_context_window,
    list_known_providers,
    sse,
)
from crow.llm import anthropic as anth
from crow.llm import openai as oai
from crow.llm.anthropic import AnthropicProvider
from crow.llm.http import parse_retry_after, tls_context
from crow.llm.openai import OpenAIProvider
from crow.messages import Image, Message, ToolCall, validate
from tests.llm_server import Cut, Fault, Reply, ScriptedLLM, Stall, ToolCallSpec

pytestmark = pytest.mark.anyio

SECRET = "sk-test-SECRET-0123456789"
FAST = {"backoff_base": 0.01, "backoff_cap": 0.02, "read_timeout": 2.0, "connect_timeout": 2.0}
TOOLS = (
    ToolSpec("read_file", "Read a file", {"type": "object", "properties": {}}),
    ToolSpec("write_file", "Write a file", {"type": "object", "properties": {}}),
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as server:
        yield server


def openai_provider(llm: ScriptedLLM, **kw: Any) -> OpenAIProvider:
    return OpenAIProvider(
        "scripted-model",
        base_url=llm.base_url,
        api_key=SECRET,
        api_key_env="TEST_OPENAI_KEY",
        **{**FAST, **kw},
    )


def anthropic_provider(llm: ScriptedLLM, **kw: Any) -> AnthropicProvider:
    return AnthropicProvider(
        "claude-test",
        base_url=llm.root_url,
        api_key=SECRET,
        api_key_env="TEST_ANTHROPIC_KEY",
        **{**FAST, **kw},
    )


def ask(text: str = "hi", **kw: Any) -> ModelRequest:
    return ModelRequest([Message("user", text)], **kw)


async def collect(provider: Any, request: ModelRequest) -> list[ModelEvent]:
    try:
        return [event async for event in provider.stream(request)]
    finally:
        await provider.aclose()


def final(events: list[ModelEvent]) -> ModelResponse:
    assert isinstance(events[-1], ModelResponse)
    assert sum(isinstance(e, ModelResponse) for e in events) == 1
    return events[-1]


# ---------------------------------------------------------------- OpenAI-compatible


async def test_openai_text_streaming(llm: ScriptedLLM) -> None:
    llm.push(Reply(text="Hello there, world"))
    events = await collect(openai_provider(llm), ask(max_tokens=50, temperature=0.2))
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Hello there, world"
    assert sum(isinstance(e, TextDelta) for e in events) > 1
    response = final(events)
    assert response.message.content == "Hello there, world"
    assert response.stop_reason == "end_turn"
    req = llm.requests[0]
    assert req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == f"Bearer {SECRET}"
    assert req.body["stream"] is True
    assert req.body["stream_options"] == {"include_usage": True}
    assert req.body["max_tokens"] == 50 and req.body["temperature"] == 0.2


async def test_openai_tool_name_split_across_chunks_is_joined(llm: ScriptedLLM) -> None:
    """Some servers stream a tool's name in pieces; only the first piece was kept."""
    calls = [ToolCallSpec("read_file", {"path": "a.txt"}), ToolCallSpec("write_file", {"path": "b"})]
    llm.push(Reply(tool_calls=calls, name_chunks=3))
    events = await collect(openai_provider(llm), ask(tools=TOOLS))
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert [(d.index, d.name) for d in deltas] == [(0, "read_file"), (1, "write_file")]
    got = final(events).message.tool_calls
    assert [(c.name, c.args) for c in got] == [("read_file", {"path": "a.txt"}), ("write_file", {"path": "b"})]


async def test_openai_reasoning_becomes_thought(llm: ScriptedLLM) -> None:
    llm.push(Reply(text="42", reasoning="let me think about it"))
    events = await collect(openai_provider(llm), ask())
    thoughts = [e.text for e in events if isinstance(e, ThoughtDelta)]
    assert "".join(thoughts) == "let me think about it"
    assert final(events).message.thinking == "let me think about it"
    assert final(events).message.content == "42"


async def test_openai_two_interleaved_tool_calls(llm: ScriptedLLM) -> None:
    llm.push(
        Reply(
            tool_calls=[
                ToolCallSpec("read_file", {"path": "a.txt", "limit": 100}),
                ToolCallSpec("write_file", {"path": "b.txt", "content": "x" * 40}),
            ]
        )
    )
    events = await collect(openai_provider(llm), ask(tools=TOOLS))
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert [(d.index, d.name) for d in deltas] == [(0, "read_file"), (1, "write_file")]
    response = final(events)
    assert response.stop_reason == "tool_use"
    calls = response.message.tool_calls
    assert [c.id for c in calls] == [d.id for d in deltas]
    assert calls[0].args == {"path": "a.txt", "limit": 100}
    assert calls[1].args == {"path": "b.txt", "content": "x" * 40}
    assert all(c.parse_error is None for c in calls)
    sent = llm.requests[0].body["tools"]
    assert sent[0] == {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {}},
        },
    }


async def test_openai_invalid_tool_json_is_recorded_not_raised(llm: ScriptedLLM) -> None:
    llm.push(Reply(tool_calls=[ToolCallSpec("read_file", raw_arguments='{"path": "a.txt')]))
    response = final(await collect(openai_provider(llm), ask(tools=TOOLS)))
    (call,) = response.message.tool_calls
    assert call.parse_error and "not valid JSON" in call.parse_error
    assert call.raw_args == '{"path": "a.txt'


async def test_openai_usage_with_cache_reads(llm: ScriptedLLM) -> None:
    llm.push(Reply(text="ok", usage=(100, 20), cache=(60, 0)))
    response = final(await collect(openai_provider(llm), ask()))
    assert response.usage == Usage(input_tokens=40, output_tokens=20, cache_read_tokens=60)


async def test_openai_429_honours_retry_after(llm: ScriptedLLM) -> None:
    llm.push(Fault(status=429, retry_after=0.3), Reply(text="finally"))
    start = time.monotonic()
    response = final(await collect(openai_provider(llm), ask()))
    assert time.monotonic() - start >= 0.3
    assert response.message.content == "finally"
    assert len(llm.requests) == 2


async def test_openai_500_twice_then_success(llm: ScriptedLLM) -> None:
    llm.push(Fault(status=500, times=2), Reply(text="recovered"))
    response = final(await collect(openai_provider(llm), ask()))
    assert response.message.content == "recovered"
    assert len(llm.requests) == 3


async def test_openai_500_forever_gives_up_after_max_retries(llm: ScriptedLLM) -> None:
    llm.push(Fault(status=500, times=10))
    with pytest.raises(ProviderError) as info:
        await collect(openai_provider(llm, max_retries=3), ask())
    assert info.value.status == 500 and info.value.retryable
    assert len(llm.requests) == 3


async def test_retries_are_logged_without_the_key(
    llm: ScriptedLLM, caplog: pytest.LogCaptureFixture
) -> None:
    llm.push(Fault(status=503, message=f"upstream said {SECRET}"), Reply(text="ok"))
    with caplog.at_level("WARNING", logger="crow.llm"):
        final(await collect(openai_provider(llm), ask()))
    assert any("retrying" in r.getMessage() for r in caplog.records)
    assert all(SECRET not in r.getMessage() for r in caplog.records)


async def test_openai_400_is_not_retried_and_carries_server_message(llm: ScriptedLLM) -> None:
    llm.push(Fault(status=400, message="Invalid value for 'temperature': 7"))
    with pytest.raises(ProviderError) as info:
        await collect(openai_provider(llm), ask())
    assert "Invalid value for 'temperature': 7" in str(info.value)
    assert info.value.status == 400 and not info.value.retryable
    assert len(llm.requests) == 1


async def test_openai_401_names_variable_and_hides_key(llm: ScriptedLLM) -> None:
    llm.push(Fault(status=401, message=f"Incorrect API key provided: {SECRET}"))
    with pytest.raises(AuthError) as info:
        await collect(openai_provider(llm), ask())
    assert "TEST_OPENAI_KEY" in str(info.value)
    assert SECRET not in str(info.value) and SECRET not in repr(info.value.__cause__)
    assert len(llm.requests) == 1


async def test_openai_context_length_error(llm: ScriptedLLM) -> None:
    llm.push(
        Fault(
            status=400,
            error_type="context_length_exceeded",
            message="This model's maximum context length is 8192 tokens.",
        )
    )
    with pytest.raises(ContextLengthError):
        await collect(openai_provider(llm), ask())


async def test_openai_cut_before_output_is_retried(llm: ScriptedLLM) -> None:
    llm.push(Cut(after_chunks=0, text="lost"), Reply(text="second try"))
    events = await collect(openai_provider(llm), ask())
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["second ", "try"]
    assert len(llm.requests) == 2


async def test_openai_cut_after_output_raises_partial(llm: ScriptedLLM) -> None:
    llm.push(Cut(after_chunks=2, text="this never finishes at all"))
    seen: list[ModelEvent] = []
    provider = openai_provider(llm)
    with pytest.raises(StreamCutError) as info:
        async for event in provider.stream(ask()):
            seen.append(event)
    await provider.aclose()
    assert info.value.partial is True
    assert [e.text for e in seen if isinstance(e, TextDelta)] == ["this ", "never "]
    assert len(llm.requests) == 1


async def test_openai_read_timeout_retried_then_fails(llm: ScriptedLLM) -> None:
    llm.push(Stall(seconds=3), Reply(text="after stall"))
    response = final(await collect(openai_provider(llm, read_timeout=0.2), ask()))
    assert response.message.content == "after stall"
    llm.reset()
    llm.push(Stall(seconds=3), Stall(seconds=3), Stall(seconds=3))
    with pytest.raises(ProviderError, match="timed out") as info:
        await collect(openai_provider(llm, read_timeout=0.2, max_retries=3), ask())
    assert info.value.retryable
    assert len(llm.requests) == 3


async def test_openai_cancellation_closes_connection(llm: ScriptedLLM) -> None:
    llm.push(Reply(text="word " * 100, chunk_delay=0.05))
    provider = openai_provider(llm)
    seen: list[ModelEvent] = []
    with anyio.move_on_after(0.3) as scope:
        async for event in provider.stream(ask()):
            seen.append(event)
    assert scope.cancelled_caught and seen
    deadline = time.monotonic() + 3
    # the counter lives in the server thread; there is no event to await
    while llm.disconnects < 1 and time.monotonic() < deadline:  # noqa: ASYNC110
        await anyio.sleep(0.02)
    assert llm.disconnects == 1
    await provider.aclose()


async def test_openai_request_conversion() -> None:
    call = ToolCall.from_raw("call_1", "read_file", '{"path": "a"}')
    bad = ToolCall.from_raw("call_2", "read_file", "{oops")
    messages = [
        Message("system", "be brief"),
        Message("user", "look", images=(Image("image/png", "AAAA"),)),
        Message("assistant", "", (call, bad), thinking="secret thoughts"),
        Message("tool", "file body", tool_call_id="call_1", name="read_file"),
        Message("tool", "bad args", tool_call_id="call_2", name="read_file", is_error=True),
    ]
    provider = OpenAIProvider("gpt-4.1", api_key="k", max_tokens=99, reasoning_effort="low")
    body = provider.build_body(ModelRequest(messages, TOOLS, tool_choice="none"))
    await provider.aclose()
    assert body["max_completion_tokens"] == 99 and body["reasoning_effort"] == "low"
    assert body["tool_choice"] == "none"
    sys_msg, user, assistant, tool1, _ = body["messages"]
    assert sys_msg == {"role": "system", "content": "be brief"}
    assert user["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,AAAA"},
    }
    assert "secret thoughts" not in json.dumps(assistant)
    assert [c["function"]["arguments"] for c in assistant["tool_calls"]] == ['{"path": "a"}', "{}"]
    assert tool1 == {"role": "tool", "tool_call_id": "call_1", "content": "file body"}


def sse_transport(body: str, seen: list[httpx2.Request] | None = None) -> httpx2.MockTransport:
    def handler(request: httpx2.Request) -> httpx2.Response:
        if seen is not None:
            seen.append(request)
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, content=body.encode()
        )

    return httpx2.MockTransport(handler)


async def test_openai_no_done_no_usage_missing_id_is_accepted() -> None:
    body = (
        'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
        'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
        '"function":{"name":"read_file","arguments":"{}"}}]}}]}\n\n'
        'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    )
    client = httpx2.AsyncClient(transport=sse_transport(body))
    provider = OpenAIProvider("m", base_url="http://local/v1", api_key="", client=client)
    response = final(await collect(provider, ask()))
    await client.aclose()
    assert response.usage is None
    assert response.stop_reason == "tool_use"
    (call,) = response.message.tool_calls
    assert call.id.startswith("call_") and call.args == {}


async def test_openai_clean_close_without_finish_is_a_cut() -> None:
    body = 'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    seen: list[httpx2.Request] = []
    client = httpx2.AsyncClient(transport=sse_transport(body, seen))
    provider = OpenAIProvider("m", base_url="http://local/v1", api_key="", client=client)
    with pytest.raises(StreamCutError) as info:
        await collect(provider, ask())
    await client.aclose()
    assert info.value.partial and len(seen) == 1


async def test_a_stream_line_past_the_limit_is_an_error_not_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hostile or broken server's endless line: crow stops reading at the limit (it used
    to keep the whole line, however long, until the body ended)."""
    monkeypatch.setattr(sse, "MAX_LINE", 1 << 20)
    sent: list[int] = []

    async def serve(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            head = b""
            while b"\r\n\r\n" not in head:
                head += await stream.receive()
            await stream.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b"x" * 65536
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                await stream.send(b"%x\r\ndata: \r\n" % 6)
                for _ in range(48):  # 3 MB, no line end
                    await stream.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    sent.append(len(chunk))
                await stream.send(b"0\r\n\r\n")

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        provider = OpenAIProvider("m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=1)
        with pytest.raises(ProviderError, match="longer than 1048576 bytes") as info:
            await collect(provider, ask())
        await provider.aclose()
        tg.cancel_scope.cancel()
    assert not isinstance(info.value, StreamCutError) and not info.value.retryable


async def test_missing_key_for_public_endpoint_is_config_error() -> None:
    provider = OpenAIProvider("gpt-4.1", api_key="", api_key_env="MY_OPENAI_KEY")
    with pytest.raises(ConfigError, match="MY_OPENAI_KEY"):
        await collect(provider, ask())
    provider2 = AnthropicProvider("claude-sonnet-4-5", api_key="")
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        await collect(provider2, ask())


# ---------------------------------------------------------------- Anthropic


async def test_anthropic_text_thinking_and_tool_use(llm: ScriptedLLM) -> None:
    llm.push(
        Reply(
            text="Reading it.",
            reasoning="need the file",
            tool_calls=[ToolCallSpec("read_file", {"path": "x.py"})],
            usage=(50, 9),
            cache=(30, 5),
        )
    )
    provider = anthropic_provider(llm, thinking_budget=2048)
    events = await collect(provider, ask(tools=TOOLS))
    assert "".join(e.text for e in events if isinstance(e, ThoughtDelta)) == "need the file"
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Reading it."
    (delta,) = [e for e in events if isinstance(e, ToolCallDelta)]
    response = final(events)
    m = response.message
    assert m.thinking == "need the file" and m.thinking_signature.startswith("sig-")
    assert m.tool_calls[0].args == {"path": "x.py"} and m.tool_calls[0].id == delta.id
    assert response.stop_reason == "tool_use"
    assert response.usage == Usage(50, 9, 30, 5)
    req = llm.requests[0]
    assert req.path == "/v1/messages"
    assert req.headers["x-api-key"] == SECRET
    assert req.headers["anthropic-version"] == "2023-06-01"
    assert req.body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert req.body["max_tokens"] == 8192 and req.body["stream"] is True


async def test_anthropic_cache_control_placement(llm: ScriptedLLM) -> None:
    llm.push(Reply(text="ok"))
    messages = [
        Message("system", "sys one"),
        Message("system", "sys two"),
        Message("user", "q1"),
        Message("assistant", "a1"),
        Message("user", "q2"),
    ]
    await collect(anthropic_provider(llm), ModelRequest(messages, TOOLS, tool_choice="none"))
    body = llm.requests[0].body
    marked = {"type": "ephemeral"}
    assert [b.get("cache_control") for b in body["system"]] == [None, marked]
    assert [t.get("cache_control") for t in body["tools"]] == [None, marked]
    assert body["messages"][-1]["content"][-1]["cache_control"] == marked
    assert json.dumps(body).count('"cache_control"') == 3
    assert body["tool_choice"] == {"type": "none"}


async def test_anthropic_overloaded_retried_and_context_length(llm: ScriptedLLM) -> None:
    llm.push(Fault(status=529), Reply(text="ok"))
    response = final(await collect(anthropic_provider(llm), ask()))
    assert response.message.content == "ok" and len(llm.requests) == 2
    llm.push(Fault(status=400, message="prompt is too long: 210000 tokens > 200000 maximum"))
    with pytest.raises(ContextLengthError):
        await collect(anthropic_provider(llm), ask())


async def test_anthropic_in_stream_error_event() -> None:
    body = (
        'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
        '"message":"Overloaded"}}\n\n'
    )
    seen: list[httpx2.Request] = []
    client = httpx2.AsyncClient(transport=sse_transport(body, seen))
    provider = AnthropicProvider(
        "c",
        base_url="http://local",
        api_key="",
        client=client,
        backoff_base=0.001,
        backoff_cap=0.001,
    )
    with pytest.raises(RateLimitError, match="Overloaded"):
        await collect(provider, ask())
    await client.aclose()
    assert len(seen) == 3


async def test_anthropic_ids_sanitized_consistently(llm: ScriptedLLM) -> None:
    llm.push(Reply(text="done"))
    odd = ToolCall.from_raw("functions.read_file:0", "read_file", '{"path": "a"}')
    messages = [
        Message("user", "go"),
        Message("assistant", "", (odd,)),
        Message("tool", "body", tool_call_id=odd.id, name="read_file"),
    ]
    await collect(anthropic_provider(llm), ModelRequest(messages, TOOLS))
    body = llm.requests[0].body
    tool_use = body["messages"][1]["content"][0]
    tool_result = body["messages"][2]["content"][0]
    assert re.fullmatch(r"[a-zA-Z0-9_-]+", tool_use["id"])
    assert tool_use["id"] == tool_result["tool_use_id"] == "functions_read_file_0"


def openai_history() -> list[Message]:
    c1 = ToolCall.from_raw("call_abc.1", "read_file", '{"path": "a.py"}')
    c2 = ToolCall.from_raw("call:xyz", "write_file", "{not json")
    return [
        Message("system", "You are crow."),
        Message("user", "fix it", images=(Image("image/png", "QUJD"),)),
        Message("assistant", "Looking.", (c1, c2), thinking="unsigned thought"),
        Message("tool", "print(1)", tool_call_id=c1.id, name="read_file"),
        Message("tool", "Error: bad JSON", tool_call_id=c2.id, name="write_file", is_error=True),
        Message("user", "and also this"),
        Message("assistant", "Done."),
        Message("user", "thanks"),
    ]


def test_openai_history_converts_to_valid_anthropic_turns() -> None:
    history = openai_history()
    validate(history)
    system, turns = anth.convert_messages(history)
    assert system == [{"type": "text", "text": "You are crow."}]
    assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant", "user"]
    assistant, results = turns[1]["content"], turns[2]["content"]
    assert [b["type"] for b in assistant] == ["text", "tool_use", "tool_use"]  # no signature
    assert assistant[2]["input"] == {}  # parse_error -> {}
    assert [b["type"] for b in results] == ["tool_result", "tool_result", "text"]
    assert [b["tool_use_id"] for b in results[:2]] == [b["id"] for b in assistant[1:]]
    assert results[1]["is_error"] is True
    assert turns[0]["content"][0]["type"] == "image"


async def test_openai_history_replayed_through_anthropic(llm: ScriptedLLM) -> None:
    llm.push(Reply(text="ok"))
    final(await collect(anthropic_provider(llm), ModelRequest(openai_history(), TOOLS)))
    msgs = llm.requests[0].messages
    calls = next(m for m in msgs if m.get("tool_calls"))["tool_calls"]
    results = [m for m in msgs if m["role"] == "tool"]
    assert [r["tool_call_id"] for r in results] == [c["id"] for c in calls]
    # and the same history still converts for OpenAI unchanged
    assert len(oai.convert_messages(openai_history())) == len(openai_history())


# ---------------------------------------------------------------- registry and helpers


def test_create_provider_builtins_and_overrides() -> None:
    p = create_provider("ollama:qwen3:8b", env={"OLLAMA_BASE_URL": "http://gpu:11434/v1"})
    assert (p.name, p.model, p.context_window) == ("ollama", "qwen3:8b", 40_960)
    assert isinstance(p, OpenAIProvider) and p.base_url == "http://gpu:11434/v1"
    a = create_provider(
        "anthropic:claude-sonnet-4-5",
        env={"ANTHROPIC_API_KEY": "k"},
        models={"claude-sonnet-4-5": ModelSettings(thinking_budget=1024)},
    )
    assert isinstance(a, AnthropicProvider) and a.thinking_budget == 1024
    assert a.context_window == 200_000
    custom = create_provider(
        "corp:big-model",
        providers={
            "corp": ProviderSettings(
                kind="anthropic", base_url="http://corp", api_key_env="CORP_KEY", max_retries=5
            )
        },
        models={"corp:big-model": ModelSettings(context_window=50_000, max_tokens=123)},
        env={"CORP_KEY": "k"},
    )
    assert isinstance(custom, AnthropicProvider)
    assert (custom.context_window, custom.max_tokens, custom.retry.max_retries) == (50_000, 123, 5)
    over = create_provider(
        "openai:gpt-4.1-mini",
        env={},
        providers={"openai": ProviderSettings(base_url="http://proxy/v1")},
    )
    assert over.base_url == "http://proxy/v1" and over.api_key_env == "OPENAI_API_KEY"
    assert over.context_window == 1_047_576


def test_create_provider_errors() -> None:
    with pytest.raises(ConfigError, match=r"known providers: .*ollama"):
        create_provider("nope:model", env={})
    with pytest.raises(ConfigError, match="provider:model"):
        create_provider("gpt-4.1", env={})
    assert {"openai", "anthropic", "openrouter", "ollama", "llamacpp", "vllm", "lmstudio"} <= set(
        list_known_providers()
    )


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("gpt-4.1-mini", 1_047_576),
        ("gpt-4o", 128_000),
        ("gpt-5-mini", 400_000),
        ("o4-mini", 200_000),
        ("claude-sonnet-4-5", 200_000),
        ("openai/gpt-4.1", 1_047_576),
        ("llama3.1:8b", 131_072),
        ("mystery", 128_000),
    ],
)
def test_default_context_window(model: str, window: int) -> None:
    assert default_context_window(model) == window


def test_parse_retry_after() -> None:
    assert parse_retry_after({"retry-after": "2"}) == 2.0
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "1"}) == 0.25
    future = formatdate(time.time() + 30, usegmt=True)
    assert 25 < (parse_retry_after({"retry-after": future}) or 0) <= 30
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


def test_importing_crow_llm_does_not_import_httpx2() -> None:
    code = "import sys, crow.llm; assert 'httpx2' not in sys.modules, 'httpx2 imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_plain_http_endpoints_skip_the_ca_bundle_and_would_fail_closed() -> None:
    ctx = tls_context("http://127.0.0.1:8080/v1")
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.cert_store_stats()["x509_ca"] == 0  # no trusted roots: https could never pass
    assert tls_context("https://api.openai.com/v1") is True  # the system's usual verification


def anthropic_sse(*events: dict[str, Any]) -> str:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)


async def test_anthropic_several_and_redacted_thinking_blocks_go_back_unmodified() -> None:
    def block(i: int, b: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_start", "index": i, "content_block": b}

    def delta(i: int, d: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": i, "delta": d}

    body = anthropic_sse(
        {"type": "message_start", "message": {"model": "claude-test", "usage": {"input_tokens": 5}}},
        block(0, {"type": "thinking", "thinking": ""}),
        delta(0, {"type": "thinking_delta", "thinking": "first, "}),
        delta(0, {"type": "signature_delta", "signature": "sig-A"}),
        {"type": "content_block_stop", "index": 0},
        block(1, {"type": "redacted_thinking", "data": "ENCRYPTED"}),
        {"type": "content_block_stop", "index": 1},
        block(2, {"type": "thinking", "thinking": ""}),
        delta(2, {"type": "thinking_delta", "thinking": "then this"}),
        delta(2, {"type": "signature_delta", "signature": "sig-B"}),
        {"type": "content_block_stop", "index": 2},
        block(3, {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {}}),
        delta(3, {"type": "input_json_delta", "partial_json": '{"path": "a"}'}),
        {"type": "content_block_stop", "index": 3},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}},
        {"type": "message_stop"},
    )
    client = httpx2.AsyncClient(transport=sse_transport(body))
    provider = AnthropicProvider("claude-test", base_url="http://local", api_key="k", client=client)
    events = await collect(provider, ask(tools=TOOLS))
    await client.aclose()
    assert "".join(e.text for e in events if isinstance(e, ThoughtDelta)) == "first, then this"
    m = final(events).message
    blocks = [
        {"type": "thinking", "thinking": "first, ", "signature": "sig-A"},
        {"type": "redacted_thinking", "data": "ENCRYPTED"},
        {"type": "thinking", "thinking": "then this", "signature": "sig-B"},
    ]
    assert m.meta == {anth.THINKING_BLOCKS: blocks} and m.thinking == "first, then this"
    assert Message.from_dict(json.loads(json.dumps(m.to_dict()))) == m  # survives the store

    history = [Message("user", "hi"), m, Message("tool", "body", tool_call_id="toolu_1", name="read_file")]
    _system, turns = anth.convert_messages(history)
    assert turns[1]["content"][:3] == blocks
    assert turns[1]["content"][3]["type"] == "tool_use"


async def test_anthropic_one_signed_thinking_block_keeps_the_plain_fields() -> None:
    body = anthropic_sse(
        {"type": "message_start", "message": {"model": "claude-test", "usage": {}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hm"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "s"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {}},
        {"type": "message_stop"},
    )
    client = httpx2.AsyncClient(transport=sse_transport(body))
    provider = AnthropicProvider("claude-test", base_url="http://local", api_key="k", client=client)
    m = final(await collect(provider, ask())).message
    await client.aclose()
    assert (m.thinking, m.thinking_signature, m.meta) == ("hm", "s", None)
