"""Hooks and tools that end-to-end tests load into a crow subprocess via config."""

from __future__ import annotations

import json
import os

import anyio

from crow import Hook


def _record(entry: str) -> None:
    path = os.environ.get("CROW_TEST_ORDER_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(entry + "\n")


def _recorder(label: str, rank: int) -> type[Hook]:
    """A hook class that records when it enters and leaves model and tool calls."""

    class Recorder(Hook):
        name = label
        order = rank

        async def wrap_model_call(self, ctx, request, call_next):  # type: ignore[no-untyped-def]
            _record(f"{label}:model:before")
            response = await call_next(request)
            _record(f"{label}:model:after")
            return response

        async def wrap_tool_call(self, ctx, call, call_next):  # type: ignore[no-untyped-def]
            _record(f"{label}:tool:{call.name}:before")
            result = await call_next(call)
            _record(f"{label}:tool:{call.name}:after")
            return result

    return Recorder


Outer = _recorder("outer", -1)  # by name alone "inner" would be outside
Inner = _recorder("inner", 0)


async def add(a: int, b: int) -> str:
    """Add two integers and return the sum."""
    return json.dumps({"sum": a + b})


async def slow(seconds: float) -> str:
    """Sleep for the given number of seconds, then say done."""
    await anyio.sleep(seconds)
    return "done"
