"""The `initialize` answer: who crow is and what it offers, given what the client said."""

from __future__ import annotations

import acp
from acp.schema import (
    AgentAuthCapabilities,
    AgentCapabilities,
    Implementation,
    InitializeResponse,
    LogoutCapabilities,
    McpCapabilities,
    PromptCapabilities,
    SessionAdditionalDirectoriesCapabilities,
    SessionCapabilities,
    SessionCloseCapabilities,
    SessionDeleteCapabilities,
    SessionForkCapabilities,
    SessionListCapabilities,
    SessionResumeCapabilities,
)

from crow import __version__
from crow.acp import auth as acp_auth
from crow.acp.protocol import ClientFeatures

# advertised under agentCapabilities._meta.crow (wire names without the leading underscore)
EXTENSIONS = ["crow.compact", "crow.rewind", "session/steering"]
# Top-level `_meta`, where codex-acp and claude-agent-acp advertise `_session/steering`
# (crow.acp.steering); `idlePromptRequired`: it honours `idleBehavior: "promptRequired"`.
PEER_META = {"steering": {"supported": True, "idlePromptRequired": True}}


def initialize_response(features: ClientFeatures) -> InitializeResponse:
    """Everything crow implements, and only that (a terminal auth method only to a client
    that can run one)."""
    return InitializeResponse(
        protocol_version=acp.PROTOCOL_VERSION,
        agent_info=Implementation(name="crow", title="crow", version=__version__),
        agent_capabilities=AgentCapabilities(
            load_session=True,
            prompt_capabilities=PromptCapabilities(image=True, embedded_context=True),
            mcp_capabilities=McpCapabilities(http=True, sse=True),
            session_capabilities=SessionCapabilities(
                list=SessionListCapabilities(),
                resume=SessionResumeCapabilities(),
                fork=SessionForkCapabilities(),
                close=SessionCloseCapabilities(),
                delete=SessionDeleteCapabilities(),
                additional_directories=SessionAdditionalDirectoriesCapabilities(),
            ),
            auth=AgentAuthCapabilities(logout=LogoutCapabilities()),
            field_meta={"crow": {"version": __version__, "extensions": EXTENSIONS}},
        ),
        auth_methods=acp_auth.methods(terminal=features.auth_terminal),
        field_meta=PEER_META,
    )
