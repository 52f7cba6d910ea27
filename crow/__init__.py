"""crow: an ACP-native coding-agent server with hooks and MCP tools.

The public surface is listed in `__all__`; names load lazily so `import crow` stays cheap
on the path to the ACP `initialize` answer.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# name -> the module defining it; a name that is a module's own last part is that module.
_EXPORTS = {
    "Agent": "crow.agent",
    "Hook": "crow.hooks",
    "HookRegistry": "crow.hooks",
    "Continue": "crow.hooks",
    "Compact": "crow.hooks",
    "Replace": "crow.hooks",
    "Stop": "crow.hooks",
    "PHASES": "crow.hooks",
    "CallModel": "crow.hooks",
    "CallTool": "crow.hooks",
    "HookContext": "crow.context",
    "EditorClient": "crow.editor",
    "Elicited": "crow.editor",
    "child_client": "crow.editor",
    "child_environment": "crow.environment",
    "direct_call_state": "crow.inprocess",
    "function_server": "crow.inprocess",
    "rules": "crow.rules",  # the permission-rule language: parse, compile, decide
    "ProjectRules": "crow.project_rules",
    "Session": "crow.session",
    "Message": "crow.messages",
    "Messages": "crow.messages",
    "ToolCall": "crow.messages",
    "ToolResult": "crow.messages",
    "ModelRequest": "crow.llm.base",
    "ModelResponse": "crow.llm.base",
    "TextDelta": "crow.llm.base",
    "ToolSpec": "crow.llm.base",
    "Usage": "crow.llm.base",
    "ServerSpec": "crow.tools",
    "PromptCommand": "crow.commands",
    "AgentDefinition": "crow.agent_definitions",
    "find_agents": "crow.agent_definitions",
    "subagents": "crow.subagents",  # what a subagent may be: mode, model, limits
    "CommandError": "crow.errors",
    "expand_arguments": "crow.commands",
    "split_frontmatter": "crow.frontmatter",
    "parse_frontmatter": "crow.frontmatter",
    "read_text_file": "crow.prompt_files",  # a file a repository may have prepared, read with care
    "Notice": "crow.events",
    "CompactionStarted": "crow.events",
    "CompactionFinished": "crow.events",
    "ModeChanged": "crow.events",
    "PlanUpdated": "crow.events",
    "UsageUpdated": "crow.events",
    "SubagentStarted": "crow.events",
    "SubagentEvent": "crow.events",
    "SubagentFinished": "crow.events",
    "child_call_id": "crow.events",
    "CompactService": "crow.compact",
    "CompactResult": "crow.compact",
    "should_compact": "crow.compact",
    "Config": "crow.config",
    "load_config": "crow.config",
    "serve": "crow.acp.server",
    "file_tools_hidden": "crow.roots",  # what the file tools never reach
    "sandbox_hidden": "crow.roots",
    "host_path": "crow.roots",  # a docker session's container path, as on this machine
    "checkpoints": "crow.checkpoints",  # per-turn file checkpoints, and putting them back
    "snapshots": "crow.snapshots",  # shadow git snapshots of a workspace
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> object:  # no `typing` at run time: `crow` starts first
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'crow' has no attribute {name!r}")
    imported = importlib.import_module(module)
    value = imported if module == f"crow.{name}" else getattr(imported, name)
    globals()[name] = value
    return value
