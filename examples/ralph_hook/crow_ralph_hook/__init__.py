"""A Ralph loop: when the model first stops in a prompt, ask it to check its work once.

Inert unless `CROW_RALPH=1`.
"""

from __future__ import annotations

import os

from crow import Continue, HookContext

QUESTION = "Are you sure? Check your work."
_KEY = "ralph.asked"  # the HookContext of the prompt we already asked in (one per prompt)


async def ralph(ctx: HookContext) -> Continue | None:
    if os.environ.get("CROW_RALPH") != "1":
        return None
    if ctx.session.state.get(_KEY) is ctx:
        return None  # asked once in this prompt: let it stop
    ctx.session.state[_KEY] = ctx
    return Continue([QUESTION])
