"""crow's builtin hooks. Each is an ordinary hook on crow's public API: anything one does,
a hook installed from PyPI can do the same way.

`install(agent)` registers the builtin hooks the config leaves on (`hooks.disable` names
the ones to switch off), then hooks from config (`hooks.extra`, `hooks.commands`) and from
entry points. Order matters for onions: the first registered is the outermost.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from crow.agent import Agent


def install(agent: Agent) -> None:
    from crow.plugins import load_entry_points, load_extra

    config = agent.config.hooks
    disabled = set(config.disable)
    for name, path in BUILTINS:
        if name in disabled:
            continue
        module, _, attr = path.partition(":")
        hook = getattr(importlib.import_module(module), attr)(agent)
        if hook is not None:  # a factory returns None when its hook has nothing to do
            agent.hooks.add(hook, name=name)
    if config.extra:
        load_extra(agent.hooks, config.extra)
    if config.commands:
        from crow.command_hooks import command_hook

        for i, entry in enumerate(config.commands):
            agent.hooks.add(command_hook(entry), name=entry.name or f"command-{i + 1}")
    if config.entry_points:
        load_entry_points(agent.hooks, blocked=disabled)


# (name, "module:factory"), outermost first: tracing sees everything, permissions decide
# before the filesystem runs anything, and plan (exit_plan_mode; calls sent beside it) next.
BUILTINS: list[tuple[str, str]] = [
    ("tracing", "builtin_hooks.tracing:factory"),  # None unless CROW_TRACE / trace is set
    ("permissions", "builtin_hooks.permissions:factory"),
    ("plan", "builtin_hooks.plan:factory"),
    ("filesystem", "builtin_hooks.filesystem:factory"),
    ("todolist", "builtin_hooks.todolist:factory"),
    ("skills", "builtin_hooks.skills:factory"),
    ("memory", "builtin_hooks.memory:factory"),
    ("summarization", "builtin_hooks.summarization:factory"),
    ("project_commands", "builtin_hooks.project_commands:factory"),  # a trusted crow.yaml's commands
]
