"""Summarization: compact the session before its context outgrows the model's window.

Two moments, both asking the agent's one `CompactService` whether compaction is due
(`ctx.should_compact()`: over `compaction.threshold`, not backing off a failed summary):

- `before_agent`: a prompt arrives on a history already over the threshold (a resumed
  session, a long paste) — compact before the first model call of the turn.
- `after_model_call`: the model answered with tool calls, so the loop goes on; returning
  `Compact()` makes the next call start from the compacted context. A final answer (no
  tool calls) is left alone: the next turn's `before_agent` catches it if needed.

Its settings are the config's `compaction:` section.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from crow import Compact, Hook, HookContext, ModelResponse

if TYPE_CHECKING:
    from crow import Agent


class SummarizationHook(Hook):
    name = "summarization"

    async def before_agent(self, ctx: HookContext) -> None:
        if ctx.should_compact():
            await ctx.compact()

    async def after_model_call(self, ctx: HookContext, response: ModelResponse) -> Compact | None:
        if response.message.tool_calls and ctx.should_compact():
            return Compact()
        return None


def factory(agent: Agent) -> SummarizationHook:
    return SummarizationHook()
