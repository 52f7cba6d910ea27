"""Session state an ACP client sees: modes, config options, and stored-session listings."""

from __future__ import annotations

from typing import Any

from acp import RequestError
from acp.schema import (
    SessionConfigOptionSelect,
    SessionConfigSelectOption,
    SessionInfo,
    SessionMode,
    SessionModeState,
)

from crow import reasoning
from crow.errors import CrowError, RootsError
from crow.events import UsageUpdated
from crow.session import Session

MODES = [
    SessionMode(id="ask", name="Ask", description="Ask before edits, commands and other changes"),
    SessionMode(
        id="accept_edits", name="Accept edits", description="Edit files without asking; ask before commands"
    ),
    SessionMode(id="yolo", name="Yolo", description="Never ask"),
    SessionMode(id="read_only", name="Read only", description="Only read-only tools run"),
    SessionMode(
        id="plan",
        name="Plan",
        description="Read and plan; no edits or commands until you approve the plan",
    ),
]
MODE_IDS = [m.id for m in MODES]


def mode_state(session: Session) -> SessionModeState:
    return SessionModeState(current_mode_id=session.mode, available_modes=MODES)


def model_choices(configured: list[str], session: Session) -> list[str]:
    return list(dict.fromkeys([*([session.model] if session.model else []), *configured]))


def config_options(session: Session, configured_models: list[str]) -> list[Any]:
    options: list[Any] = []
    models = model_choices(configured_models, session)
    if models:
        options.append(
            SessionConfigOptionSelect(
                id="model",
                name="Model",
                category="model",
                type="select",
                current_value=session.model or models[0],
                options=[SessionConfigSelectOption(value=m, name=m) for m in models],
            )
        )
    if thought := thought_level_option(session, models[0] if models else ""):
        options.append(thought)
    options.append(
        SessionConfigOptionSelect(
            id="mode",
            name="Mode",
            category="mode",
            type="select",
            current_value=session.mode,
            options=[
                SessionConfigSelectOption(value=m.id, name=m.name, description=m.description) for m in MODES
            ],
        )
    )
    return options


def thought_level_option(session: Session, ref: str) -> SessionConfigOptionSelect | None:
    """The `thought_level` select, offered only while the session's model takes a level."""
    settings = reasoning.levels_for(ref, session.config)
    if settings is None:
        return None
    return SessionConfigOptionSelect(
        id="thought_level",
        name="Thinking",
        category="thought_level",
        type="select",
        current_value=reasoning.shown_level(session, ref) or settings.levels[0],
        options=[SessionConfigSelectOption(value=v, name=v.capitalize()) for v in settings.levels],
    )


def checked_level(session: Session, ref: str | None, value: object) -> str:
    """`value` as a thought level for the session's model `ref`, or -32602 saying why not."""
    settings = reasoning.levels_for(ref or "", session.config)
    if settings is None:
        raise RequestError.invalid_params(
            {"configId": f"the model {ref or '(none)'} takes no thought level"}
        )
    if value not in settings.levels:
        raise RequestError.invalid_params(
            {"value": f"unknown thought level {value!r} for {ref}; one of {settings.levels}"}
        )
    return str(value)


def stored_usage(agent: Any, session: Session) -> UsageUpdated | None:
    """What a loaded session has cost so far, for the editor to show before its next call
    (None when nothing is known to show)."""
    if not session.cost:
        return None
    try:
        provider = agent.provider_for(agent.model_ref(session), session.config)
    except CrowError:
        return None
    if provider is None:
        return None
    return UsageUpdated(session.context_tokens(), provider.context_window, session.cost)


def session_info(record: Any) -> SessionInfo:
    return SessionInfo(
        session_id=record.id,
        cwd=record.cwd,
        title=record.title or None,
        updated_at=record.updated_at or None,
        additional_directories=list(record.additional_directories) or None,
    )


FAILED = -32000  # crow could not do what was asked; the message says why (not "Internal error")
BUSY = -32001  # a prompt is already running in this session (here or in another crow process)
CANCELLED = -32800  # ACP's "request cancelled": session/cancel stopped a crow.compact
UNKNOWN_SESSION = -32002  # ACP's resource-not-found, for a session id crow does not know


def session_error(exc: CrowError) -> RequestError:
    if isinstance(exc, RootsError):
        return RequestError(-32602, f"Invalid params: {exc}", {"additionalDirectories": str(exc)})
    code = UNKNOWN_SESSION if "unknown session" in str(exc) else -32602
    return RequestError(code, str(exc))


def roots(given: list[str] | None) -> list[str]:
    """ACP: the list a load/resume/fork sends is the session's roots; none sent, none."""
    return list(given or [])
