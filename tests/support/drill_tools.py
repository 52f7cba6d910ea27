"""Programmatic tools the fault drills (tests/test_drills.py) load into crow via config."""

from __future__ import annotations

import json

import anyio


async def drill_sleep(seconds: float) -> str:
    """Sleep for the given number of seconds, then say done."""
    await anyio.sleep(seconds)
    return "slept"


async def drill_add(a: int, b: int) -> str:
    """Add two integers and return the sum."""
    return json.dumps({"sum": a + b})
