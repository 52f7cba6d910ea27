"""What ACP schema 1.25 has and the Python SDK (0.12.1, generated from 1.19) lacks: one place.

- client capabilities the SDK drops when it parses `initialize` (`session.compaction`,
  `session.notices`, the unstable `subagents`), read into `ClientFeatures`, which the
  adapter asks before it sends a 1.25 update (an update is sent only when its capability was advertised);
- update types: `compaction_update`, `compaction_summary_chunk`, `notice`, `tool_call`
  with the tool's programmatic `name`, and the unstable `subagent_update`;
- routes the SDK has request models for but does not route: `session/delete`, `logout`,
  `$/cancel_request` (registered by `crow.acp.wire.connect`, which owns the SDK internals).

Every model here serializes the way the SDK's own do (by alias, camelCase), so the adapter
sends them through the same `notification_params`; like the SDK's, an update's
`sessionUpdate` has no default (that writer leaves default values out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from acp import schema
from pydantic import ConfigDict, Field, ValidationError, field_validator

# The SDK's models read their field docstrings from the source (inspect + ast) at class
# creation: ~2 ms a class, on the path to the `initialize` answer. These need none.
_FAST = ConfigDict(use_attribute_docstrings=False)

# ------------------------------------------------------------------ client capabilities


def _or_none(value: Any, handler: Any) -> Any:
    """The schema's `x-deserialize-default-on-error`, as the SDK reads its own fields: a
    malformed capability is not advertised. Failing instead would fail `initialize` (a
    top-level one) or drop every session capability with it (one under `session`)."""
    try:
        return handler(value)
    except ValidationError:
        return None


class ClientSessionCapabilities(schema.ClientSessionCapabilities):
    model_config = _FAST
    compaction: dict[str, Any] | None = None
    notices: dict[str, Any] | None = None

    @field_validator("compaction", "notices", mode="wrap")
    @classmethod
    def _not_advertised_if_malformed(cls, value: Any, handler: Any) -> Any:
        return _or_none(value, handler)


class ClientCapabilities(schema.ClientCapabilities):
    model_config = _FAST
    session: ClientSessionCapabilities | None = None  # type: ignore[assignment]
    subagents: dict[str, Any] | None = None  # unstable: {} = child sessions are understood

    @field_validator("subagents", mode="wrap")
    @classmethod
    def _not_advertised_if_malformed(cls, value: Any, handler: Any) -> Any:
        return _or_none(value, handler)


class InitializeRequest(schema.InitializeRequest):
    model_config = _FAST
    client_capabilities: ClientCapabilities | None = Field(  # type: ignore[assignment]
        default=None, alias="clientCapabilities"
    )


@dataclass(frozen=True, slots=True)
class ClientFeatures:
    """What the client said it handles, beyond the SDK's `ClientCapabilities`."""

    compaction: bool = False  # compaction_update / compaction_summary_chunk
    notices: bool = False  # notice
    boolean_options: bool = False  # config options of type "boolean"
    elicitation_form: bool = False
    elicitation_url: bool = False
    auth_terminal: bool = False  # an auth method of type "terminal" may be offered
    subagents: bool = False  # subagent_update, and a child's updates on its own session

    @classmethod
    def of(cls, caps: schema.ClientCapabilities | None) -> ClientFeatures:
        if caps is None:
            return cls()
        session = caps.session
        options = session.config_options if session is not None else None
        elicitation = caps.elicitation
        return cls(
            compaction=getattr(session, "compaction", None) is not None,
            notices=getattr(session, "notices", None) is not None,
            boolean_options=options is not None and options.boolean is not None,
            elicitation_form=elicitation is not None and elicitation.form is not None,
            elicitation_url=elicitation is not None and elicitation.url is not None,
            auth_terminal=bool(caps.auth is not None and caps.auth.terminal),
            subagents=getattr(caps, "subagents", None) is not None,
        )


# ------------------------------------------------------------------ session updates

CompactionStatus = Literal["in_progress", "completed", "failed", "cancelled"]
NoticeSeverity = Literal["info", "warning", "error"]


class CompactionUpdate(schema.BaseModel):
    """One compaction's state; later updates with the same id patch it in place."""

    model_config = _FAST

    session_update: Literal["compaction_update"] = Field(alias="sessionUpdate")
    compaction_id: str = Field(alias="compactionId")
    status: CompactionStatus
    error: str | None = None
    field_meta: dict[str, Any] | None = Field(default=None, alias="_meta")


class CompactionSummaryChunk(schema.BaseModel):
    """A block appended to a compaction's summary."""

    model_config = _FAST

    session_update: Literal["compaction_summary_chunk"] = Field(alias="sessionUpdate")
    compaction_id: str = Field(alias="compactionId")
    content: schema.TextContentBlock
    field_meta: dict[str, Any] | None = Field(default=None, alias="_meta")


class NoticeUpdate(schema.BaseModel):
    """Live information for the user: not part of the session's history."""

    model_config = _FAST

    session_update: Literal["notice"] = Field(alias="sessionUpdate")
    severity: NoticeSeverity
    title: str = Field(min_length=1)
    description: str | None = None
    field_meta: dict[str, Any] | None = Field(default=None, alias="_meta")


class ToolCallStart(schema.ToolCallStart):
    """`tool_call` with the tool's programmatic name (1.25)."""

    model_config = _FAST

    name: str | None = None


class SubagentUpdate(schema.BaseModel):
    """(Unstable) sent on the parent's session: announces child session `session_id` (its
    first one), then patches it; a field left out keeps its value. `state` is a whole
    snapshot: {"state": "running"} or {"state": "idle", "stopReason": ..., "usage": ...}."""

    model_config = _FAST

    session_update: Literal["subagent_update"] = Field(alias="sessionUpdate")
    session_id: str = Field(alias="sessionId")
    title: str | None = None
    description: str | None = None
    state: dict[str, Any] | None = None
    cwd: str | None = None
    additional_directories: list[str] | None = Field(default=None, alias="additionalDirectories")
    field_meta: dict[str, Any] | None = Field(default=None, alias="_meta")


# ------------------------------------------------------------------ requests the SDK does not route

DeleteSessionRequest = schema.DeleteSessionRequest
DeleteSessionResponse = schema.DeleteSessionResponse
LogoutRequest = schema.LogoutRequest
LogoutResponse = schema.LogoutResponse
CancelRequestNotification = schema.CancelRequestNotification

# method -> (request model, handler attribute on the adapter, kind)
ROUTES: dict[str, tuple[type[schema.BaseModel], str, Literal["request", "notification"]]] = {
    "initialize": (InitializeRequest, "initialize", "request"),
    "session/delete": (DeleteSessionRequest, "delete_session", "request"),
    "logout": (LogoutRequest, "logout", "request"),
    "$/cancel_request": (CancelRequestNotification, "cancel_request", "notification"),
}
