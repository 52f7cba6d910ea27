"""SubagentsHook: the `task(description, prompt, agent?)` tool, a child agent run to the end.

TODO(helper: core): the tool, the child's run (`Agent.create_child`, `Agent.run_turn`),
concurrency, limits, cost, cancel; see docs/agents.md.
"""

from __future__ import annotations

from typing import Any

from crow import Hook


class SubagentsHook(Hook):
    name = "subagents"
    order = -74  # inside permissions, plan and ask; outside the hooks that run file tools

    def __init__(self, agent: Any) -> None:
        self.agent = agent


def factory(agent: Any) -> SubagentsHook:
    return SubagentsHook(agent)
