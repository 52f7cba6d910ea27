"""OpenAI-compatible chat completions (OpenAI, OpenRouter, Ollama, vLLM, llama.cpp, LM Studio)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from crow.llm.base import (
    ModelEvent,
    ModelRequest,
    ModelResponse,
    ModelStopReason,
    TextDelta,
    ThoughtDelta,
    ToolCallDelta,
    ToolSpec,
    Usage,
    token_count,
)
from crow.llm.body import RawJSON
from crow.llm.http import HTTPProvider, parse_event
from crow.messages import Message, ToolCall

__all__ = ["OpenAIProvider", "convert_messages", "convert_tools"]

_STOP: dict[str, ModelStopReason] = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}


# Chat completions' tool messages hold text only: a tool's images follow the run of tool
# messages as one user message, each announced in its tool's text (goose does the same).
TOOL_IMAGES_FOLLOW = "[{count} image(s) from this tool follow in the next message]"
TOOL_IMAGES_HEAD = "Image(s) from tool call {id} ({name}):"


def _image_parts(m: Message) -> list[dict[str, Any]]:
    return [
        {"type": "image_url", "image_url": {"url": f"data:{i.mime_type};base64,{i.data}"}} for i in m.images
    ]


def convert_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    held: list[dict[str, Any]] = []  # image parts of the current run of tool messages
    for m in messages:
        if held and m.role != "tool":
            out.append({"role": "user", "content": held})
            held = []
        if m.role == "tool":
            content = m.content
            if m.images:
                note = TOOL_IMAGES_FOLLOW.format(count=len(m.images))
                content = f"{content}\n{note}" if content else note
                held += [{"type": "text", "text": TOOL_IMAGES_HEAD.format(id=m.tool_call_id, name=m.name)}]
                held += _image_parts(m)
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": content})
        elif m.role == "assistant":
            item: dict[str, Any] = {"role": "assistant", "content": m.content or None}
            if m.tool_calls:
                item["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments_json},
                    }
                    for c in m.tool_calls
                ]
            elif not m.content:
                item["content"] = ""  # a thinking-only turn: thinking is not sent back
            out.append(item)
        elif m.images:
            parts: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
            out.append({"role": m.role, "content": parts + _image_parts(m)})
        else:
            out.append({"role": m.role, "content": m.content})
    if held:
        out.append({"role": "user", "content": held})
    return out


def convert_tool(t: ToolSpec) -> dict[str, Any]:
    function = {"name": t.name, "description": t.description, "parameters": dict(t.parameters)}
    return {"type": "function", "function": function}


def convert_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [convert_tool(t) for t in tools]


@dataclass(slots=True)
class _PendingCall:
    id: str = ""
    name: str = ""
    args: list[str] = field(default_factory=list)
    announced: bool = False


class _StreamState:
    """Assembles one streamed completion; `feed()` returns the deltas an event produced."""

    def __init__(self, provider: str, stream_error: Callable[[str], Exception]) -> None:
        self.provider = provider
        self.stream_error = stream_error
        self.ended = False  # [DONE] came
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.calls: dict[int, _PendingCall] = {}
        self.finish: str | None = None
        self.usage: Usage | None = None
        self.model = ""

    @property
    def finished(self) -> bool:
        return self.finish is not None

    def feed(self, data: str) -> list[ModelEvent]:
        if data.strip() == "[DONE]":
            self.ended = True
            return []
        chunk = parse_event(self.provider, data)
        if "error" in chunk:  # some servers report failures inside a 200 stream
            raise self.stream_error(data)
        return self._feed_chunk(chunk)

    def _feed_chunk(self, chunk: Mapping[str, Any]) -> list[ModelEvent]:
        events: list[ModelEvent] = []
        self.model = chunk.get("model") or self.model
        if usage := chunk.get("usage"):
            cached = token_count((usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
            self.usage = Usage(  # more cached than prompt tokens: a server's error, none uncached
                input_tokens=max(0, token_count(usage.get("prompt_tokens")) - cached),
                output_tokens=token_count(usage.get("completion_tokens")),
                cache_read_tokens=cached,
            )
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if thought := delta.get("reasoning_content") or delta.get("reasoning"):
                self.thinking.append(thought)
                events.append(ThoughtDelta(thought))
            if text := delta.get("content"):
                self.text.append(text)
                events.append(TextDelta(text))
            for frag in delta.get("tool_calls") or ():
                events.extend(self._feed_call(frag))
            if reason := choice.get("finish_reason"):
                self.finish = reason
                if self.calls:  # calls whose arguments never started
                    events.extend(self._announce(max(self.calls)))
        return events

    def _feed_call(self, frag: Mapping[str, Any]) -> list[ModelEvent]:
        """A tool call's name may arrive in pieces: they are joined until its arguments
        start (a name repeated whole in later deltas, as some servers send, is not added
        again). The call is announced once its arguments start or the stream finishes."""
        index = frag.get("index")
        if not isinstance(index, int):
            index = len(self.calls)
        call = self.calls.setdefault(index, _PendingCall())
        fn = frag.get("function") or {}
        if frag.get("id") and not call.id:
            call.id = frag["id"]
        name = fn.get("name")
        if name and not call.args and name != call.name:
            call.name += name
        if fn.get("arguments"):
            call.args.append(
                fn["arguments"] if isinstance(fn["arguments"], str) else json.dumps(fn["arguments"])
            )
            return [] if call.announced else self._announce(index)
        return []

    def _announce(self, upto: int) -> list[ModelEvent]:
        """ToolCallDeltas for the named calls up to index `upto`, in index order."""
        events: list[ModelEvent] = []
        for position, index in enumerate(sorted(self.calls)):
            call = self.calls[index]
            if index > upto:
                break
            if call.announced or not call.name:
                continue
            call.id = call.id or f"call_{uuid.uuid4().hex[:24]}"
            call.announced = True
            events.append(ToolCallDelta(position, call.id, call.name))
        return events

    def response(self) -> ModelResponse:
        calls = tuple(
            ToolCall.from_raw(c.id or f"call_{uuid.uuid4().hex[:24]}", c.name, "".join(c.args))
            for _, c in sorted(self.calls.items())
            if c.name
        )
        stop = _STOP.get(self.finish or "", "end_turn")
        if calls and stop == "end_turn":
            stop = "tool_use"  # some servers say "stop" after tool calls
        message = Message("assistant", "".join(self.text), tool_calls=calls, thinking="".join(self.thinking))
        return ModelResponse(message, self.usage, stop, self.model)


class OpenAIProvider(HTTPProvider):
    default_base_url = "https://api.openai.com/v1"
    default_key_env = "OPENAI_API_KEY"
    default_name = "openai"

    def build_body(self, request: ModelRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": request.model or self.model,
            "messages": convert_messages(request.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = RawJSON(f"[{','.join(self._tool_texts(request.tools))}]")
            if request.tool_choice == "none":
                body["tool_choice"] = "none"
        if (max_tokens := request.max_tokens or self.max_tokens) is not None:
            # OpenAI itself rejects max_tokens for reasoning models; local servers know only it
            key = "max_completion_tokens" if "api.openai.com" in self.base_url else "max_tokens"
            body[key] = max_tokens
        if (temperature := request.temperature) is None:
            temperature = self.temperature
        if temperature is not None:
            body["temperature"] = temperature
        if effort := request.reasoning_effort or self.reasoning_effort:
            body["reasoning_effort"] = effort
        body.update(request.extra)
        return body

    def convert_tool(self, tool: ToolSpec) -> dict[str, Any]:
        return convert_tool(tool)

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream", **self._extra_headers}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def _new_stream(self) -> _StreamState:
        return _StreamState(self.name, self._stream_error)
