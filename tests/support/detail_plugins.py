"""Hooks for the end-to-end tests of ids and editor details (loaded with
PYTHONPATH=tests/support): one calls the model again when the stream is cut after the user
saw part of the answer, one adds an earlier message to the session again, one holds tool
results back."""

from __future__ import annotations

from typing import Any

import anyio

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


class HoldResult(Hook):
    """Holds every tool result for 30 s once the tool has run (a cancel then lands between
    the tool's end and its result being shown)."""

    name = "hold_result"

    async def wrap_tool_call(self, ctx: Any, call: Any, call_next: Any) -> Any:
        result = await call_next(call)
        await anyio.sleep(30)
        return result
