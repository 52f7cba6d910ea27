"""Model providers behind one method: `Provider.stream(request) -> AsyncIterator[ModelEvent]`.

Import-cheap: nothing here imports httpx2. `create_provider("openai:gpt-4.1-mini")` loads the
provider module when it is first needed; `OpenAIProvider` / `AnthropicProvider` load lazily
on attribute access too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from crow.llm.base import (
    ModelEvent,
    ModelRequest,
    ModelResponse,
    ModelStopReason,
    Provider,
    ScriptedProvider,
    TextDelta,
    ThoughtDelta,
    ToolCallDelta,
    ToolSpec,
    Usage,
    complete,
)

if TYPE_CHECKING:
    from crow.llm.anthropic import AnthropicProvider
    from crow.llm.openai import OpenAIProvider
    from crow.llm.registry import (
        ModelSettings,
        ProviderSettings,
        create_provider,
        default_context_window,
        list_known_providers,
    )

__all__ = [
    "AnthropicProvider",
    "ModelEvent",
    "ModelRequest",
    "ModelResponse",
    "ModelSettings",
    "ModelStopReason",
    "OpenAIProvider",
    "Provider",
    "ProviderSettings",
    "ScriptedProvider",
    "TextDelta",
    "ThoughtDelta",
    "ToolCallDelta",
    "ToolSpec",
    "Usage",
    "complete",
    "create_provider",
    "default_context_window",
    "list_known_providers",
]

# Loaded on first use: the path to the ACP `initialize` answer needs none of them.
_LAZY = {
    "OpenAIProvider": "crow.llm.openai",
    "AnthropicProvider": "crow.llm.anthropic",
    **dict.fromkeys(
        [
            "ModelSettings",
            "ProviderSettings",
            "create_provider",
            "default_context_window",
            "list_known_providers",
        ],
        "crow.llm.registry",
    ),
}


def __getattr__(name: str) -> Any:
    if module := _LAZY.get(name):
        import importlib

        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module 'crow.llm' has no attribute {name!r}")
