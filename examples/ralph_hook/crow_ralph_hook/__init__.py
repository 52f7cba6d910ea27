"""A Ralph loop: when the model first stops in a prompt, ask it to check its work once.

Inert unless `CROW_RALPH=1`.
"""

from __future__ import annotations

import os

from crow import Continue, HookContext

QUESTION = "Are you sure? Check your work."
_KEY = "ralph.asked"  # in ctx.turn_state, which every prompt starts empty


async def ralph(ctx: HookContext) -> Continue | None:
    if os.environ.get("CROW_RALPH") != "1":
        return None
    if ctx.turn_state.get(_KEY):
        return None  # asked once in this prompt: let it stop
    ctx.turn_state[_KEY] = True
    return Continue([QUESTION])
