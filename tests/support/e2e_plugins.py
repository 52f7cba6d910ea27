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


class Outer(Hook):
    name = "outer"

    async def wrap_model_call(self, ctx, request, call_next):  # type: ignore[no-untyped-def]
        _record("outer:model:before")
        response = await call_next(request)
        _record("outer:model:after")
        return response

    async def wrap_tool_call(self, ctx, call, call_next):  # type: ignore[no-untyped-def]
        _record(f"outer:tool:{call.name}:before")
        result = await call_next(call)
        _record(f"outer:tool:{call.name}:after")
        return result


class Inner(Hook):
    name = "inner"

    async def wrap_model_call(self, ctx, request, call_next):  # type: ignore[no-untyped-def]
        _record("inner:model:before")
        response = await call_next(request)
        _record("inner:model:after")
        return response

    async def wrap_tool_call(self, ctx, call, call_next):  # type: ignore[no-untyped-def]
        _record(f"inner:tool:{call.name}:before")
        result = await call_next(call)
        _record(f"inner:tool:{call.name}:after")
        return result


async def add(a: int, b: int) -> str:
    """Add two integers and return the sum."""
    return json.dumps({"sum": a + b})


async def slow(seconds: float) -> str:
    """Sleep for the given number of seconds, then say done."""
    await anyio.sleep(seconds)
    return "done"
