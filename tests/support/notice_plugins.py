"""A hook that warns the user, for the end-to-end notice tests (loaded via config)."""

from __future__ import annotations

from crow import Hook, HookContext


class Warner(Hook):
    name = "warner"

    async def before_agent(self, ctx: HookContext) -> None:
        await ctx.notify("3 files changed since the last lint run.", "warning", "Lint is stale")


class Shouter(Hook):
    """Tells with a severity ACP has not got (a hook's typo; hooks are not type-checked)."""

    name = "shouter"

    async def before_agent(self, ctx: HookContext) -> None:
        await ctx.notify("the build is on fire", "critical", "Build")  # type: ignore[arg-type]
