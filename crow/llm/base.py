"""The provider interface: one method, `stream(request) -> AsyncIterator[ModelEvent]`.

A stream yields `TextDelta`, `ThoughtDelta` and `ToolCallDelta` while the model talks (and
`Retrying` when a failed attempt is tried again) and ends with exactly one `ModelResponse`
holding the whole assistant message, usage and stop reason. The loop never imports httpx2;
tests can drive it with a `ScriptedProvider`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from crow.messages import Message

ModelStopReason = Literal["end_turn", "tool_use", "max_tokens", "refusal", "error"]
"""Why one model reply ended (`ModelResponse.stop_reason`); a turn's is `crow.actions.TurnStopReason`."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as the model sees it (name, description, parameters), plus what crow knows of
    it: `read_only` (believed only for trusted servers), and how an editor shows a call:
    `kind` (an ACP tool kind) and a `title` template (see crow.acp.view.tool_title)."""

    name: str
    description: str
    parameters: Mapping[str, Any]  # JSON Schema object
    read_only: bool = False
    kind: str = "other"
    title: str = ""


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """What one model call sends. Hooks change it with `.replace(...)`, never in place."""

    messages: Sequence[Message]
    tools: Sequence[ToolSpec] = ()
    model: str = ""
    max_tokens: int | None = None
    temperature: float | None = None
    reasoning_effort: str | None = None
    tool_choice: Literal["auto", "none"] = "auto"
    # provider-specific request fields, passed through untouched
    extra: Mapping[str, Any] = field(default_factory=dict)

    def replace(self, **changes: Any) -> ModelRequest:
        return dataclasses.replace(self, **changes)

    def with_system(self, text: str) -> ModelRequest:
        """A copy with `text` appended to the system message (one is put first if there is
        none). Text added at the end keeps the provider's cache of what comes before it."""
        messages = list(self.messages)
        if messages and messages[0].role == "system":
            first = messages[0]
            messages[0] = first.replace(content=f"{first.content}\n\n{text}" if first.content else text)
        else:
            messages.insert(0, Message("system", text))
        return self.replace(messages=messages)


MAX_TOKEN_COUNT = 2**53  # past JSON's exact integers: no real call, and a float cost overflows


def token_count(reported: object) -> int:
    """A token count as a server reported it, or 0 when it is not a count (negative, a
    fraction, text, past `MAX_TOKEN_COUNT`): a cost or a context size is never computed
    from an impossible one."""
    if isinstance(reported, bool) or not isinstance(reported, int):
        return 0
    return reported if 0 <= reported <= MAX_TOKEN_COUNT else 0


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def context_tokens(self) -> int:
        """Tokens the prompt plus answer occupy in the window."""
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        # Field by field: dataclasses.astuple deep-copies (~80 us a model call, 2% of a turn).
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str
    message_id: str = ""  # the `Message.id` the answer will be stored under (the loop sets it)


@dataclass(frozen=True, slots=True)
class ThoughtDelta:
    text: str
    message_id: str = ""  # as TextDelta's


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A tool call became known (name and id), before its arguments finished streaming."""

    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ModelResponse:
    message: Message
    usage: Usage | None = None
    stop_reason: ModelStopReason = "end_turn"
    model: str = ""


@dataclass(frozen=True, slots=True)
class Retrying:
    """The call failed before any output and is tried again after `delay` seconds:
    attempt `attempt` of `attempts` comes next. Not output: `complete` skips it."""

    error: str
    attempt: int
    attempts: int
    delay: float


ModelEvent = TextDelta | ThoughtDelta | ToolCallDelta | Retrying | ModelResponse


@runtime_checkable
class Provider(Protocol):
    name: str
    model: str
    context_window: int

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]: ...

    async def aclose(self) -> None: ...


async def complete(provider: Provider, request: ModelRequest) -> ModelResponse:
    """Run a request to the end and return only the response (summaries, titles)."""
    async for event in provider.stream(request):
        if isinstance(event, ModelResponse):
            return event
    raise RuntimeError(f"provider {provider.name} ended its stream without a response")


class ScriptedProvider:
    """A provider whose answers come from a function: the seam for loop tests."""

    name = "scripted"

    def __init__(
        self,
        handler: Callable[[ModelRequest], Awaitable[ModelResponse] | ModelResponse],
        *,
        model: str = "scripted",
        context_window: int = 128_000,
    ) -> None:
        self._handler = handler
        self.model = model
        self.context_window = context_window
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.requests.append(request)
        response = self._handler(request)
        if not isinstance(response, ModelResponse):
            response = await response
        if response.message.thinking:
            yield ThoughtDelta(response.message.thinking)
        if response.message.content:
            yield TextDelta(response.message.content)
        yield response

    async def aclose(self) -> None:
        return None
