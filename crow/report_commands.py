"""The builtins that report on the session: `/usage` and `/mcp` (`crow.prompting.BUILTINS`).

Each answers with an info notice (stored outside the model context, shown on replay, as
agent text to a front end without notices); nothing is sent to the model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from crow.errors import CrowError
from crow.events import Emit, Notice, UsageUpdated
from crow.pricing import USAGE_TOTAL

if TYPE_CHECKING:
    from crow.agent import Agent
    from crow.llm.base import Usage
    from crow.loop import TurnResult
    from crow.session import Session
    from crow.tools import ServerState


async def usage(agent: Agent, session: Session, _rest: str, emit: Emit) -> TurnResult:
    """`/usage`: the context used and left, the session's tokens and its cost."""
    from crow.loop import TurnResult

    used = session.context_tokens()
    ref = agent.model_ref(session)
    try:
        provider = agent.provider_for(ref, session.config)
        window = provider.context_window if provider is not None else None
        why_unknown = "no model is configured"
    except CrowError as exc:
        window, why_unknown = None, str(exc)
    lines = [f"Model: {ref or 'none'}"]
    if window:
        share = min(100, round(100 * used / window))
        left = max(0, window - used)
        lines.append(f"Context: about {used:,} of {window:,} tokens used ({share}%); {left:,} left")
    else:
        lines.append(f"Context: about {used:,} tokens used; the window is unknown ({why_unknown})")
    total: Usage | None = session.state.get(USAGE_TOTAL)
    lines.append(
        f"Tokens since crow opened this session: {_tokens(total)}"
        if total is not None
        else "Tokens since crow opened this session: no model call yet"
    )
    if session.last_usage is not None:
        lines.append(f"Last model call: {_tokens(session.last_usage)}")
    lines.append(f"Cost of this session: {_cost(session.cost)}")
    if window:  # the editor's gauge too
        await emit(UsageUpdated(used, window, session.cost))
    await emit(Notice("\n".join(lines), "info", "Usage"))
    return TurnResult("end_turn")


def _tokens(u: Usage) -> str:
    cached = f", {u.cache_read_tokens:,} read from cache" if u.cache_read_tokens else ""
    written = f", {u.cache_write_tokens:,} written to cache" if u.cache_write_tokens else ""
    return f"{u.input_tokens:,} in{cached}{written}, {u.output_tokens:,} out"


def _cost(cost: float | None) -> str:
    if cost is None:
        return "unknown (a model call without a price or without reported usage)"
    return f"${cost:,.4f} (USD)"


async def mcp(agent: Agent, session: Session, _rest: str, emit: Emit) -> TurnResult:
    """`/mcp`: the session's MCP servers (crow's own, a plugin's, the editor's), each one's
    state (connected, failed and why, renamed) and the tools it offers the model."""
    from crow.agent import EDITOR_SERVERS
    from crow.loop import TurnResult

    hub = session.tools
    servers = hub.servers() if hub is not None else []
    editors = {spec.name for spec in session.state.get(EDITOR_SERVERS, ())}
    if not servers:
        text = "No MCP servers in this session."
    else:
        text = f"MCP servers of this session ({len(servers)}):\n" + "\n".join(
            _server_line(s, editors) for s in servers
        )
    await emit(Notice(text, "info", "MCP servers"))
    return TurnResult("end_turn")


def _server_line(s: ServerState, editors: set[str]) -> str:
    if s.transport == "inprocess":
        origin = "crow's own"
    elif (s.asked_as or s.name) in editors:
        origin = f"from the editor, {s.transport}"
    else:
        origin = f"from a plugin, {s.transport}"
    renamed = f"; named {s.asked_as!r}, which another server had" if s.asked_as else ""
    head = f"- {s.name} ({origin}{renamed}): "
    if s.state == "failed":
        return head + f"failed: {s.error}"
    if s.state != "connected":
        return head + s.state
    names = [name if name == own else f"{name} (its {own!r})" for name, own in s.tools]
    listed = ", ".join(names) if names else "none"
    return head + f"connected; {len(names)} tool{'s' if len(names) != 1 else ''}: {listed}"
