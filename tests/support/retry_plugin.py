"""A hook for end-to-end tests: it calls the model once more when the stream is cut after
the user already saw part of the answer (loaded with PYTHONPATH=tests/support)."""

from __future__ import annotations

from typing import Any

from crow import Hook
from crow.errors import StreamCutError


class RetryCut(Hook):
    name = "retry_cut"

    async def wrap_model_call(self, ctx: Any, request: Any, call_next: Any) -> Any:
        try:
            return await call_next(request)
        except StreamCutError:
            return await call_next(request)
