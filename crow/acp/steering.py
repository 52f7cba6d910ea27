"""`_session/steering`: a user message added to the running turn (`crow.steering`).

The wire shape is the one codex-acp and claude-agent-acp use, so a client written for them
steers crow unchanged: request `{sessionId, prompt: ContentBlock[], _meta?: {steering?:
{idleBehavior?: "promptRequired"}}}`, answer `{outcome: "injected"}` (crow adds the stored
message's `messageId`), advertised by `initialize`'s top-level `_meta.steering.supported`.
The answer comes once the turn has taken the message (stored, echoed as a
`user_message_chunk`, and part of its next model request), never before: a turn that ends
without taking it answers the no-turn error, so an accepted message is never lost.

With no turn running, crow starts none (codex-acp would; claude-agent-acp lets a client opt
out): the answer is JSON-RPC -32600 with `data.reason` "noRunningTurn", or, for a client
that asked for `idleBehavior: "promptRequired"`, `{outcome: "promptRequired", reason:
"noRunningTurn"}` as claude-agent-acp answers it. Either way the message was not consumed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from acp import RequestError
from acp.schema import PromptRequest
from pydantic import ValidationError

from crow import steering
from crow.acp import convert as acp_convert

if TYPE_CHECKING:
    from crow.agent import Agent

METHOD = "session/steering"  # on the wire `_session/steering`; the SDK strips the underscore
NO_TURN = -32600  # JSON-RPC invalid request: what kimi-code and Reasonix answer with no turn
NO_TURN_REASON = "noRunningTurn"  # claude-agent-acp's word for it


async def steer(agent: Agent, params: dict[str, Any]) -> dict[str, Any]:
    session_id = params.get("sessionId")
    if not isinstance(session_id, str) or not session_id:
        raise RequestError.invalid_params({"sessionId": "required"})
    blocks = params.get("prompt")
    if not isinstance(blocks, list) or not blocks:
        raise RequestError.invalid_params({"prompt": "a non-empty list of content blocks"})
    try:  # the blocks as session/prompt takes them (the SDK's own model)
        parsed = PromptRequest.model_validate({"sessionId": session_id, "prompt": blocks}).prompt
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise RequestError.invalid_params({"prompt": f"{where}: {first['msg']}"}) from exc
    message = acp_convert.prompt_message(parsed)  # -32602 for an empty prompt or a bad image
    session = agent.sessions.get(session_id)
    try:
        if session is None:  # not loaded in this crow: nothing of it runs here
            raise steering.NoTurnRunning(f"no turn is running in session {session_id}; send it as a prompt")
        message_id = await steering.steer(session, message)
    except steering.NoTurnRunning as exc:
        if _prompt_required(params):
            return {"outcome": "promptRequired", "reason": NO_TURN_REASON}
        raise RequestError(NO_TURN, str(exc), {"reason": NO_TURN_REASON}) from exc
    return {"outcome": "injected", "messageId": message_id}


def _prompt_required(params: dict[str, Any]) -> bool:
    meta = params.get("_meta")
    options = meta.get("steering") if isinstance(meta, dict) else None
    return isinstance(options, dict) and options.get("idleBehavior") == "promptRequired"
