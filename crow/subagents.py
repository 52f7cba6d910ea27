"""What a subagent may be: the pure rules crow's `task` tool (builtin_hooks/subagents.py)
applies to an agent definition before it runs a child, and the words it uses.

An agent definition narrows a child, never widens it: its mode only when stricter than the
parent's; its model only when it is the user's own choice; its limits are the user's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("crow.subagents")

MAX_PROMPT = 100_000  # characters of a task's prompt: files are named, not pasted
MAX_DESCRIPTION = 200  # characters of its title
LISTED_AGENTS = 50  # agents the tool's description names...
LISTED_CHARS = 200  # ...each description cut to this
# How strict a mode is: a child runs in the stricter of its parent's and its definition's.
STRICTNESS = {"yolo": 0, "accept_edits": 1, "ask": 2, "read_only": 3, "plan": 3}


@dataclass(frozen=True)
class Limits:
    """`hooks.settings.subagents` of the user's config, clamped."""

    max_depth: int = 1  # sessions this deep (a child is 1) are not offered `task`
    max_turns: int = 25  # model calls per child
    max_concurrent: int = 4  # running children per parent session; the rest wait

    @classmethod
    def from_settings(cls, settings: Any) -> Limits:
        given = settings if isinstance(settings, dict) else {}

        def number(key: str, default: int, low: int, high: int) -> int:
            value = given.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int):
                log.warning("hooks.settings.subagents.%s: %r is not a whole number; %d", key, value, default)
                return default
            return min(max(value, low), high)

        return cls(
            max_depth=number("max_depth", 1, 0, 3),
            max_turns=number("max_turns", 25, 1, 1000),
            max_concurrent=number("max_concurrent", 4, 1, 16),
        )


def child_mode(parent: str, wanted: str | None) -> str:
    """The parent's mode unless the definition's is stricter; plan (which a child could
    not leave) runs as read_only."""
    mode = parent if parent in STRICTNESS else "ask"
    if wanted in STRICTNESS and STRICTNESS[wanted] > STRICTNESS[mode]:
        mode = wanted
    return "read_only" if mode == "plan" else mode


def foreign_model(ref: str, scope: str, config: Any) -> str | None:
    """Why a definition from `scope` may not choose model `ref` (None: it may): a
    repository's agent file may name only a model the user's own config names; the user's
    own files (in crow's home) any."""
    if scope == "user" or ref in config.model_choices() or ref in config.model_settings:
        return None
    return (
        "it is not one of your configured models (model, models or model_settings in your "
        "crow config), and a project's agent file may not choose another"
    )


def bad_arguments(description: str, prompt: str) -> str | None:
    """What is wrong with a task's arguments, for the model to read; None: nothing."""
    if not description.strip():
        return "`description` is empty: give the task a short title (3-7 words)"
    if len(description) > MAX_DESCRIPTION:
        return f"`description` is {len(description):,} characters; keep it under {MAX_DESCRIPTION}"
    if not prompt.strip():
        return "`prompt` is empty: say what the subagent should do and report back"
    if len(prompt) > MAX_PROMPT:
        return (
            f"`prompt` is {len(prompt):,} characters; keep it under {MAX_PROMPT:,}: name the files "
            "the subagent should read instead of pasting them"
        )
    return None


def listing(agents: list[Any]) -> str:
    """The agents as the tool's description lists them: name and description, capped."""
    ordered = sorted(agents, key=lambda d: d.name)
    lines = [f"- {d.name}: {cut(d.description, LISTED_CHARS)}" for d in ordered[:LISTED_AGENTS]]
    if len(ordered) > LISTED_AGENTS:
        lines.append(f"({len(ordered) - LISTED_AGENTS} more not listed)")
    return "\n".join(lines)


def footer(agent: str, turns: int, tokens_in: int, tokens_out: int, cost: float | None) -> str:
    """The line under a child's answer: what it took."""
    spent = "" if cost is None else f", ${cost:.4f}"
    calls = f"{turns} model call{'s' * (turns != 1)}"
    return f"[subagent {agent}: {calls}, {tokens_in:,} input / {tokens_out:,} output tokens{spent}]"


def cut(text: str, limit: int) -> str:
    """`text` on one line, at most `limit` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
