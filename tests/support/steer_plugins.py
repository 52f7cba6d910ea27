"""A hook for the steering tests: stops the turn when the model says STOP."""

from __future__ import annotations

from crow import Hook
from crow.actions import Stop


class StopOnWord(Hook):
    name = "stop-on-word"

    async def after_model_call(self, ctx, response):  # type: ignore[no-untyped-def]
        return Stop() if "STOP" in response.message.content else None
