"""Session state an ACP client sees: modes, config options, and stored-session listings."""

from __future__ import annotations

from typing import Any

from acp.schema import (
    SessionConfigOptionSelect,
    SessionConfigSelectOption,
    SessionInfo,
    SessionMode,
    SessionModeState,
)

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


def session_info(record: Any) -> SessionInfo:
    return SessionInfo(
        session_id=record.id,
        cwd=record.cwd,
        title=record.title or None,
        updated_at=record.updated_at or None,
        additional_directories=list(record.additional_directories) or None,
    )
