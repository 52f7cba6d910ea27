"""Thought levels: which models take one, which levels, and the one a session's requests carry.

A model takes a level when `model_settings.REF.reasoning` says so (crow/config.py
`ReasoningSettings`; `levels: []` says it takes none), else when it is on the list below
for its provider's kind. OpenAI-style requests carry the level as `reasoning_effort`;
Anthropic ones as a thinking budget (crow/llm/anthropic.py; "off" sends no thinking).
The session remembers the level chosen (`Session.thought_level`, stored); a model that
does not offer that level gets none (its own default) and the level is kept for a model
that does.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from crow.config import ReasoningSettings
from crow.pricing import model_name

if TYPE_CHECKING:
    from crow.config import Config
    from crow.session import Session

__all__ = ["LEVEL_BUDGETS", "levels_for", "request_effort", "shown_level"]

# Anthropic budget_tokens per level when the config gives none (0: no thinking).
LEVEL_BUDGETS = {"off": 0, "none": 0, "minimal": 1024, "low": 2048, "medium": 8192, "high": 16384}

# (provider kind, model pattern, levels, default): the model's name is matched whole, after
# any "vendor/" prefix and snapshot date. The defaults are what the API does when the
# request names no level. Checked 2025-11-25 against the OpenAI reasoning guide and
# Anthropic's extended-thinking models.
_BUILTIN: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("openai", r"o1|o1-pro|o3|o3-mini|o3-pro|o4-mini", ("low", "medium", "high"), "medium"),
    ("openai", r"gpt-5(-mini|-nano)?", ("minimal", "low", "medium", "high"), "medium"),
    ("openai", r"gpt-5(\.\d+)?-codex(-mini)?", ("low", "medium", "high"), "medium"),
    ("openai", r"gpt-5\.\d+", ("none", "low", "medium", "high"), "none"),
    (
        "anthropic",
        r"claude-(3-7-sonnet|sonnet-4|sonnet-4-\d|opus-4|opus-4-\d|haiku-4-5)",
        ("off", "low", "medium", "high"),
        "off",
    ),
)


def _kind(provider: str, config: Config | None) -> str | None:
    from crow.llm.registry import BUILTIN_PROVIDERS

    configured = config.providers.get(provider) if config is not None else None
    if configured is not None and configured.kind:
        return configured.kind
    builtin = BUILTIN_PROVIDERS.get(provider)
    return builtin.kind if builtin is not None else ("openai" if configured is not None else None)


def levels_for(ref: str, config: Config | None) -> ReasoningSettings | None:
    """The levels `provider:model` takes, or None when it takes none."""
    provider, _, model = ref.partition(":")
    if not model:
        return None
    models = config.model_settings if config is not None else {}
    for key in (ref, model):
        settings = models.get(key)
        if settings is not None and settings.reasoning is not None:
            return settings.reasoning if settings.reasoning.levels else None
    name = model_name(model.lower().rsplit("/", 1)[-1])
    for kind, pattern, levels, default in _BUILTIN:
        # the kind only for a name on the list: it imports the registry (~2 ms, session/new)
        if re.fullmatch(pattern, name) and _kind(provider, config) == kind:
            return ReasoningSettings(levels=list(levels), default=default)
    return None


def shown_level(session: Session, ref: str) -> str | None:
    """The level the session's requests to `ref` are made at, as the editor shows it."""
    settings = levels_for(ref, session.config)
    if settings is None:
        return None
    if session.thought_level in settings.levels:
        return session.thought_level
    return settings.default or settings.levels[0]


def request_effort(session: Session, ref: str) -> str | None:
    """The level a request to `ref` carries: the session's choice when the model offers
    it; else None (the model's default, or what the model's settings configure)."""
    if not session.thought_level:
        return None
    settings = levels_for(ref, session.config)
    offered = settings is not None and session.thought_level in settings.levels
    return session.thought_level if offered else None
