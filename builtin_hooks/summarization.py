"""Summarization: compact the session before its context outgrows the model's window.

Two moments, both through the agent's one `CompactService` (`crow.compact`):

- `before_agent`: a prompt arrives on a history already over the threshold (a resumed
  session, a long paste) — compact before the first model call of the turn.
- `after_model_call`: the model answered with tool calls, so the loop goes on; returning
  `Compact()` makes the next call start from the compacted context. A final answer (no
  tool calls) is left alone: the next turn's `before_agent` catches it if needed.

Settings (`hooks.settings.summarization` in crow.yaml): `threshold` (default: the agent's
`compact_threshold`, 0.85), `keep_ratio` (0.10), `min_keep` (2), `cache_preserving` (true),
`summary_words` (2000).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from crow import Compact, CompactService, Hook, HookContext, ModelResponse, should_compact

if TYPE_CHECKING:
    from crow import Agent


class SummarizationHook(Hook):
    name = "summarization"

    def __init__(self, threshold: float | None = None) -> None:
        self.threshold = threshold

    def due(self, ctx: HookContext) -> bool:
        if ctx.provider is None or ctx.compactor is None:
            return False
        threshold = ctx.compact_threshold if self.threshold is None else self.threshold
        return should_compact(ctx.context_tokens, ctx.context_window, threshold)

    async def before_agent(self, ctx: HookContext) -> None:
        if self.due(ctx):
            await ctx.compact()

    async def after_model_call(self, ctx: HookContext, response: ModelResponse) -> Compact | None:
        if response.message.tool_calls and self.due(ctx):
            return Compact()
        return None


def factory(agent: Agent) -> SummarizationHook:
    """Build the hook from `hooks.settings.summarization` and give the agent a
    `CompactService` built from the same settings unless it already has one."""
    settings: dict[str, Any] = dict(agent.config.hooks.settings.get("summarization", {}))
    if agent.compactor is None:
        agent.compactor = CompactService(
            keep_ratio=float(settings.get("keep_ratio", 0.10)),
            min_keep=int(settings.get("min_keep", 2)),
            summary_words=int(settings.get("summary_words", 2000)),
            cache_preserving=bool(settings.get("cache_preserving", True)),
        )
    threshold = settings.get("threshold")
    return SummarizationHook(threshold=None if threshold is None else float(threshold))
