"""Hooks for the message-id end-to-end tests (loaded with PYTHONPATH=tests/support): one
calls the model again when the stream is cut after the user saw part of the answer, one
adds an earlier message to the session again."""

from __future__ import annotations

from typing import Any

from crow import Continue, Hook
from crow.errors import StreamCutError


class RetryCut(Hook):
    name = "retry_cut"

    async def wrap_model_call(self, ctx: Any, request: Any, call_next: Any) -> Any:
        try:
            return await call_next(request)
        except StreamCutError:
            return await call_next(request)


class RepeatPrompt(Hook):
    """Once, when the model is done, sends the first message of the session again (the
    same `Message`, id and all)."""

    name = "repeat_prompt"

    async def agent_stop(self, ctx: Any) -> Any:
        if ctx.session.state.setdefault("repeated", False):
            return None
        ctx.session.state["repeated"] = True
        return Continue([ctx.session.messages[0]])
