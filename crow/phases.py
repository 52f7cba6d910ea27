"""The hook phases: their names, the seed names accepted as aliases, and what each phase
offers its hooks (they are called by these parameter names)."""

from __future__ import annotations

from crow.errors import HookError

PHASES: tuple[str, ...] = (
    "before_agent",
    "modify_request",
    "wrap_model_call",
    "after_model_call",
    "wrap_tool_call",
    "agent_stop",
    "after_agent",
    "on_error",
)
# What each phase calls its hooks with: a hook takes any of these names.
PHASE_ARGS: dict[str, tuple[str, ...]] = {
    "before_agent": ("ctx",),
    "modify_request": ("ctx", "request"),
    "wrap_model_call": ("ctx", "request", "call_next"),
    "after_model_call": ("ctx", "response"),
    "wrap_tool_call": ("ctx", "call", "call_next"),
    "agent_stop": ("ctx",),
    "after_agent": ("ctx",),
    "on_error": ("ctx", "error"),
}
ALIASES: dict[str, str] = {
    "pre_request": "before_agent",
    "BeforeAgent": "before_agent",
    "ModifyRequest": "modify_request",
    "WrapModelCall": "wrap_model_call",
    "mid_react": "after_model_call",
    "AfterLLMCall": "after_model_call",
    "after_llm_call": "after_model_call",
    "WrapToolCall": "wrap_tool_call",
    "post_react_loop": "agent_stop",
    "post_request": "after_agent",
    "OnError": "on_error",
}
# Seed-003 phases around one model or tool call: (the onion they join, the names they offer).
SEED_PHASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "BeforeLLMCall": ("wrap_model_call", ("ctx", "request")),
    "before_llm_call": ("wrap_model_call", ("ctx", "request")),
    "BeforeToolExec": ("wrap_tool_call", ("ctx", "call")),
    "before_tool_exec": ("wrap_tool_call", ("ctx", "call")),
    "AfterToolExec": ("wrap_tool_call", ("ctx", "call", "result")),
    "after_tool_exec": ("wrap_tool_call", ("ctx", "call", "result")),
}
# The tool-call ones by side (command hooks run their command on either side).
TOOL_SIDES: dict[str, str] = {
    name: "after" if offers[-1] == "result" else "before"
    for name, (onion, offers) in SEED_PHASES.items()
    if onion == "wrap_tool_call"
}


def canonical_phase(name: str) -> str:
    """The phase a name runs at (a seed-003 per-call phase: the onion it joins)."""
    if name in SEED_PHASES:
        return SEED_PHASES[name][0]
    phase = ALIASES.get(name, name)
    if phase not in PHASES:
        known = ", ".join([*PHASES, *ALIASES, *SEED_PHASES])
        raise HookError(f"unknown hook phase {name!r}; known phases: {known}")
    return phase
