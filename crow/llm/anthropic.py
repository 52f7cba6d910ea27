"""Anthropic Messages API: request conversion (with prompt caching) and stream parsing."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
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
from crow.llm.body import RawJSON, dumps
from crow.llm.http import HTTPProvider, parse_event
from crow.messages import Message, ToolCall
from crow.reasoning import LEVEL_BUDGETS

__all__ = ["AnthropicProvider", "convert_messages", "convert_tools", "sanitize_tool_id"]

API_VERSION = "2023-06-01"
_EPHEMERAL = {"type": "ephemeral"}
_STOP: dict[str, ModelStopReason] = {
    "end_turn": "end_turn",
    "stop_sequence": "end_turn",
    "pause_turn": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "refusal": "refusal",
}
_BAD_ID_CHARS = re.compile(r"[^a-zA-Z0-9_-]")


# Message.meta key for a reply's thinking blocks when one `thinking` + signature cannot hold
# them: several blocks (each signed) or redacted ones. The API wants them back unmodified.
THINKING_BLOCKS = "anthropic_thinking_blocks"


def sanitize_tool_id(call_id: str) -> str:
    """Anthropic wants ids matching ^[a-zA-Z0-9_-]+$; OpenAI-style ids may not (":" or ".")."""
    return _BAD_ID_CHARS.sub("_", call_id) or "toolu_missing"


def _image_blocks(m: Message) -> list[dict[str, Any]]:
    return [
        {"type": "image", "source": {"type": "base64", "media_type": i.mime_type, "data": i.data}}
        for i in m.images
    ]


def _content_blocks(m: Message) -> list[dict[str, Any]]:
    if m.role == "tool":
        content: str | list[dict[str, Any]] = m.content
        if m.images:  # the API rejects empty text blocks
            content = ([{"type": "text", "text": m.content}] if m.content else []) + _image_blocks(m)
        return [
            {
                "type": "tool_result",
                "tool_use_id": sanitize_tool_id(m.tool_call_id),
                "content": content,
                "is_error": m.is_error,
            }
        ]
    blocks: list[dict[str, Any]] = []
    if m.role == "assistant":
        if m.meta and m.meta.get(THINKING_BLOCKS):
            # back exactly as they came; an unsigned one would be refused, as without meta
            blocks += [dict(b) for b in m.meta[THINKING_BLOCKS] if b.get("signature") or "data" in b]
        elif m.thinking and m.thinking_signature:
            blocks.append({"type": "thinking", "thinking": m.thinking, "signature": m.thinking_signature})
        if m.content:
            blocks.append({"type": "text", "text": m.content})
        blocks += [
            {
                "type": "tool_use",
                "id": sanitize_tool_id(c.id),
                "name": c.name,
                "input": {} if c.parse_error else dict(c.args),
            }
            for c in m.tool_calls
        ]
        return blocks
    blocks += _image_blocks(m)
    if m.content:  # the API rejects empty text blocks
        blocks.append({"type": "text", "text": m.content})
    return blocks


def convert_messages(
    messages: Sequence[Message],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(system blocks, messages): tool results become user turns, same roles merge."""
    system: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system":
            if m.content:
                system.append({"type": "text", "text": m.content})
            continue
        role = "assistant" if m.role == "assistant" else "user"
        blocks = _content_blocks(m)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    for turn in out:
        # tool_result blocks must lead their user turn
        turn["content"].sort(key=lambda b: b["type"] != "tool_result")
    return system, out


def convert_tool(t: ToolSpec) -> dict[str, Any]:
    return {"name": t.name, "description": t.description, "input_schema": dict(t.parameters)}


def convert_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [convert_tool(t) for t in tools]


def add_cache_control(system: list[dict[str, Any]], messages: list[dict[str, Any]]) -> None:
    """Mark the growing prefixes system and conversation as cache breakpoints (the tools'
    is marked in `AnthropicProvider.build_body`)."""
    if system:
        system[-1]["cache_control"] = dict(_EPHEMERAL)
    if messages and messages[-1]["content"]:
        last = messages[-1]["content"][-1]
        if last["type"] not in ("thinking", "redacted_thinking"):
            last["cache_control"] = dict(_EPHEMERAL)


class _StreamState:
    """Assembles one streamed message; `feed()` returns the deltas an event produced."""

    def __init__(self, provider: str, stream_error: Callable[[str], Exception]) -> None:
        self.provider = provider
        self.stream_error = stream_error
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.thinking_blocks: list[dict[str, Any]] = []  # in order: thinking, redacted_thinking
        self.blocks: dict[int, dict[str, Any]] = {}  # block index -> tool_use in progress
        self.calls: list[ToolCall] = []
        self.usage = Usage()
        self.stop: str | None = None
        self.ended = False  # message_stop came
        self.model = ""

    @property
    def finished(self) -> bool:
        return self.ended or self.stop is not None

    def feed(self, raw: str) -> list[ModelEvent]:
        data = parse_event(self.provider, raw)
        kind = data.get("type")
        if kind == "error":
            # overloaded_error maps to a retryable RateLimitError, api_error to retryable
            raise self.stream_error(raw)
        if kind == "message_start":
            message = data.get("message") or {}
            self.model = message.get("model") or ""
            self._usage(message.get("usage") or {})
        elif kind == "content_block_start":
            block = data.get("content_block") or {}
            if block.get("type") == "tool_use":
                ordinal = len(self.calls) + len(self.blocks)
                self.blocks[data.get("index", 0)] = {
                    "id": block.get("id", ""),
                    "name": block.get("name", ""),
                    "args": [],
                }
                return [ToolCallDelta(ordinal, block.get("id", ""), block.get("name", ""))]
            if block.get("type") == "text" and block.get("text"):
                self.text.append(block["text"])
                return [TextDelta(block["text"])]
            if block.get("type") == "thinking":
                self.thinking_blocks.append({"type": "thinking", "thinking": "", "signature": ""})
                return self._thinking(block.get("thinking") or "")
            if block.get("type") == "redacted_thinking":
                self.thinking_blocks.append({"type": "redacted_thinking", "data": block.get("data", "")})
        elif kind == "content_block_delta":
            return self._delta(data.get("index", 0), data.get("delta") or {})
        elif kind == "content_block_stop":
            if (call := self.blocks.pop(data.get("index", 0), None)) is not None:
                self.calls.append(ToolCall.from_raw(call["id"], call["name"], "".join(call["args"])))
        elif kind == "message_delta":
            self.stop = (data.get("delta") or {}).get("stop_reason") or self.stop
            self._usage(data.get("usage") or {})
        elif kind == "message_stop":
            self.ended = True
        return []

    def _delta(self, index: int, delta: Mapping[str, Any]) -> list[ModelEvent]:
        kind = delta.get("type")
        if kind == "text_delta" and delta.get("text"):
            self.text.append(delta["text"])
            return [TextDelta(delta["text"])]
        if kind == "thinking_delta":
            return self._thinking(delta.get("thinking") or "")
        if kind == "signature_delta":
            self._thinking_block()["signature"] = delta.get("signature", "")
        elif kind == "input_json_delta" and index in self.blocks:
            self.blocks[index]["args"].append(delta.get("partial_json", ""))
        return []

    def _thinking_block(self) -> dict[str, Any]:
        if not self.thinking_blocks or self.thinking_blocks[-1]["type"] != "thinking":
            self.thinking_blocks.append({"type": "thinking", "thinking": "", "signature": ""})
        return self.thinking_blocks[-1]

    def _thinking(self, text: str) -> list[ModelEvent]:
        if not text:
            return []
        self._thinking_block()["thinking"] += text
        self.thinking.append(text)
        return [ThoughtDelta(text)]

    def _usage(self, usage: Mapping[str, Any]) -> None:
        u = self.usage
        self.usage = Usage(
            input_tokens=token_count(usage.get("input_tokens")) or u.input_tokens,
            output_tokens=token_count(usage.get("output_tokens")) or u.output_tokens,
            cache_read_tokens=token_count(usage.get("cache_read_input_tokens")) or u.cache_read_tokens,
            cache_write_tokens=token_count(usage.get("cache_creation_input_tokens")) or u.cache_write_tokens,
        )

    def response(self) -> ModelResponse:
        # a block the server never closed still counts once the message finished
        for call in self.blocks.values():
            self.calls.append(ToolCall.from_raw(call["id"], call["name"], "".join(call["args"])))
        self.blocks.clear()
        blocks = self.thinking_blocks
        one = blocks[0] if len(blocks) == 1 and blocks[0]["type"] == "thinking" else None
        message = Message(
            "assistant",
            "".join(self.text),
            tool_calls=tuple(self.calls),
            thinking="".join(self.thinking),
            thinking_signature=one["signature"] if one else "",
            meta={THINKING_BLOCKS: blocks} if blocks and one is None else None,
        )
        return ModelResponse(message, self.usage, _STOP.get(self.stop or "", "end_turn"), self.model)


class AnthropicProvider(HTTPProvider):
    default_base_url = "https://api.anthropic.com"
    default_key_env = "ANTHROPIC_API_KEY"
    default_name = "anthropic"
    default_context_window = 200_000

    def __init__(
        self,
        model: str,
        *,
        thinking_budget: int | None = None,
        level_budgets: Mapping[str, int] | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(model, **settings)
        self.max_tokens = self.max_tokens or 8192  # required by the API
        self.thinking_budget = thinking_budget
        self.level_budgets = {**LEVEL_BUDGETS, **(level_budgets or {})}  # a level -> budget_tokens

    def build_body(self, request: ModelRequest) -> dict[str, Any]:
        system, messages = convert_messages(request.messages)
        add_cache_control(system, messages)
        body: dict[str, Any] = {
            "model": request.model or self.model,
            "messages": messages,
            "max_tokens": request.max_tokens or self.max_tokens,
            "stream": True,
        }
        if system:
            body["system"] = system
        if request.tools:
            tools = self._tool_texts(request.tools)
            tools[-1] = f'{tools[-1][:-1]},"cache_control":{dumps(_EPHEMERAL)}}}'  # the last: a breakpoint
            body["tools"] = RawJSON(f"[{','.join(tools)}]")
            if request.tool_choice == "none":
                body["tool_choice"] = {"type": "none"}
        # The request's level (the session's choice) wins over the configured budget, which
        # wins over the configured level; a level without a budget thinks not at all.
        effort = request.reasoning_effort
        if effort is None and self.thinking_budget is None:
            effort = self.reasoning_effort
        budget = self.level_budgets.get(effort, 0) if effort else self.thinking_budget
        if budget:
            body["thinking"] = {"type": "enabled", "budget_tokens": budget}
            # the API wants max_tokens above the budget and no custom temperature
            body["max_tokens"] = max(body["max_tokens"], budget + 1024)
        else:
            temperature = self.temperature if request.temperature is None else request.temperature
            if temperature is not None:
                body["temperature"] = temperature
        body.update(request.extra)
        return body

    def convert_tool(self, tool: ToolSpec) -> dict[str, Any]:
        return convert_tool(tool)

    def _headers(self) -> dict[str, str]:
        headers = {
            "anthropic-version": API_VERSION,
            "Accept": "text/event-stream",
            **self._extra_headers,
        }
        if self._api_key:
            headers["x-api-key"] = self._api_key
        return headers

    def _url(self) -> str:
        return f"{self.base_url}/v1/messages"

    def _new_stream(self) -> _StreamState:
        return _StreamState(self.name, self._stream_error)
