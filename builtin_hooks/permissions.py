"""PermissionsHook: rules first, then the mode, then the user.

Rules (`permissions: {allow, ask, deny}` in the config, see crow.rules) hold in every
mode: deny > ask > allow. Then the session's mode:
    ask           ask before edits, commands and any tool not trusted read-only
    accept_edits  file edits run without asking (but those inside a `.git` folder);
                  commands and other tools still ask
    yolo          nothing else asks
    read_only     trusted read-only tools run, and tools an allow rule names (never edits
                  or commands); the rest are refused without asking
    plan          as read_only, and the model is told to finish with exit_plan_mode(plan)

Only crow's own servers are believed when they call a tool read-only (ToolHub marks the
others' tools not read-only) or name its kind (an edit, the plan, leaving plan mode: the
kinds that relax a question); a kind that makes a tool stricter (edit, execute) is
believed from any server. "Always allow" / "always reject" add session rules scoped to
what the prompt named (`git status` commands, edits to one file or folder, one tool).
Requests are asked one at a time per session, each re-checked against the rules the
previous answer may have added. A subagent's session (`Session.parent`) shares its root
session's rules and question lock: the user's "always" holds across the tree, and the
tree asks one question at a time. A request nobody answers within `timeout` seconds counts
as a rejection, so a turn never hangs on an unseen prompt.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio

from crow import (
    EditorClient,
    Hook,
    HookContext,
    ProjectRules,
    ToolCall,
    ToolResult,
    host_path,
    rules,
    subagents,
)

log = logging.getLogger("crow.permissions")
MODES = ("ask", "accept_edits", "yolo", "read_only", "plan")
CHANGES = frozenset({"edit", "delete", "move", "execute"})  # kinds that always ask (or are refused)
NEVER_ASK = frozenset({"think", "switch_mode"})  # the plan, and leaving plan mode
_RULES = "permissions.rules"  # session.state: the session's RuleSet (from "always" answers)
_PROJECT_READ = "permissions.project_read"  # session.state: its project's rules are in _RULES
_LOCK = "permissions.lock"  # session.state: one question at a time


class PermissionsHook(Hook):
    name = "permissions"
    order = -90  # outside every hook that runs tools

    def __init__(self, timeout: float = 600.0) -> None:
        self.timeout = timeout

    async def wrap_tool_call(self, ctx: HookContext, call: ToolCall, call_next: Any) -> ToolResult:
        refusal = await self.check(ctx, call)
        if refusal is not None:
            return ToolResult(call.id, call.name, error=refusal, meta={rules.REFUSED: True})
        return await call_next(call)

    async def check(self, ctx: HookContext, call: ToolCall) -> str | None:
        """None to run the tool, else the reason the model reads."""
        session = ctx.session
        await _read_project_rules(session)
        settled = self._settle(session, call)
        if settled != "ask":
            return settled
        if session.client is None:
            return (
                f"{call.name} needs the user's permission, and no editor is attached to "
                "ask. Run with --yolo (or mode: yolo), or allow it with a permissions rule."
            )
        lock: anyio.Lock = session.root.state.setdefault(_LOCK, anyio.Lock())
        async with lock:
            settled = self._settle(session, call)  # the previous answer may have settled it
            if settled != "ask":
                return settled
            return await self._ask(session, call)

    def _settle(self, session: Any, call: ToolCall) -> str | None:
        """None (run), a refusal, or "ask"."""
        config = session.config
        perms = config.permissions if config is not None else None
        configured = None
        if perms is not None:
            configured = rules.compile_rules(tuple(perms.allow), tuple(perms.ask), tuple(perms.deny))
        sets = [s for s in (configured, _session_rules(session)) if s]
        decision, rule = None, None
        if sets:  # no rules, nothing to parse
            decision, rule = rules.decide(_subject(session, call), *sets)
        if decision == "deny":
            assert rule is not None
            if rule.origin == "session":
                return (
                    f"The user rejected {call.name} calls like this one for the session (rule "
                    f"`{rule}`); it was not run. Ask the user what they would like instead."
                )
            return (
                f"{call.name} is denied by the permission rule `{rule}` (permissions.deny in "
                "the configuration); it was not run. Do not try to get around the rule: ask "
                "the user if you need it."
            )
        hub = session.tools
        trusted_kind = hub.kind(call.name) if hub is not None else "other"
        if trusted_kind in NEVER_ASK:
            return None  # crow's own: another server's `write_todos` is judged like any tool
        spec = hub.spec(call.name) if hub is not None else None
        changes = spec is not None and spec.kind in CHANGES
        read_only = bool(spec and spec.read_only) and not changes
        # A subagent's: stricter still when a parent's mode was made so while it runs.
        mode = subagents.live_mode(session) if session.parent is not None else session.mode
        mode = mode if mode in MODES else "ask"
        if mode in ("read_only", "plan"):
            # Edits and commands never run here, whatever the rules; an allow rule can admit
            # another server's tool, whose read-only hint crow does not believe.
            allowed = decision == "allow" and not changes
            if not (read_only or allowed):
                return _refusal(mode, call.name)
        if decision is not None:
            return "ask" if decision == "ask" else None
        if read_only or mode == "yolo":
            return None
        if mode == "accept_edits" and trusted_kind == "edit" and not _in_git(session, call):
            return None
        return "ask"

    async def _ask(self, session: Any, call: ToolCall) -> str | None:
        subj = _subject(session, call)
        config = session.config
        perms = config.permissions if config is not None else None
        asked_by_rule = False
        if perms is not None and perms.ask:
            asked_by_rule = rules.decide(subj, rules.compile_rules((), tuple(perms.ask), ()))[0] == "ask"
        options = rules.choices(subj, asked_by_rule)
        hub = session.tools
        spec = hub.spec(call.name) if hub is not None else None
        client: EditorClient = session.client
        chosen = await client.ask_permission(call, options=options, spec=spec, timeout=self.timeout)
        choice = next((c for c in options if c.id == chosen), None)
        if choice is None:
            return "The user did not answer the permission request; the tool call was not run."
        if choice.rules:
            granted = _session_rules(session)
            decision = "allow" if choice.kind == "allow_always" else "deny"
            for text in choice.rules:
                granted.add(decision, rules.parse_rule(text, origin="session"))
        if choice.id == "allow_always_project" and config is not None:
            # kept before the tool runs; one not kept (logged) still holds for this session
            await ProjectRules(config.home, session.store).add(session.cwd, choice.rules)
        if choice.kind in ("allow_once", "allow_always"):
            return None
        if choice.kind == "reject_always":
            return (
                f"The user declined this tool call and chose: {choice.label.lower()} for this "
                "session. Ask what they would like instead."
            )
        return "The user declined this tool call. Ask what they would like instead."


def _session_rules(session: Any) -> rules.RuleSet:
    """The session's rules: those granted for its project (`_read_project_rules`) and its
    own "always" answers; a subagent's are its root session's."""
    return session.root.state.setdefault(_RULES, rules.RuleSet())


async def _read_project_rules(session: Any) -> None:
    """Add the rules granted for the session's project to its rules, once, at its first
    call (again at the next one when the store could not be read)."""
    root = session.root
    if root.state.get(_PROJECT_READ):
        return
    config = root.config
    granted = [] if config is None else await ProjectRules(config.home, root.store).allowed(root.cwd)
    if granted is None or root.state.get(_PROJECT_READ):  # unreadable now, or read meanwhile
        return
    found = _session_rules(root)
    for text in granted:
        try:
            found.add("allow", rules.parse_rule(text, origin="project"))
        except rules.RuleError as exc:
            log.warning("ignoring a stored project rule: %s", exc)
    root.state[_PROJECT_READ] = True


def _subject(session: Any, call: ToolCall) -> rules.Subject:
    """What the rules see of `call`; a docker session's container path (/workspace/src/x)
    as the file on this machine, so that `edit_file(src/**)` holds however it is written."""
    args = call.args
    if "path" in args:
        args = {**args, "path": host_path(session, args["path"])}
    return rules.subject(call.name, args, str(session.cwd))


def _in_git(session: Any, call: ToolCall) -> bool:
    """An edit inside a `.git` folder: its config and hooks are commands git runs (a
    `core.fsmonitor`, a `pre-commit`), so accept_edits still asks for it."""
    paths, _ = rules.path_candidates(host_path(session, call.args.get("path", ".")), str(session.cwd))
    return not paths or any(".git" in p.lower().split("/") for p in paths)


def _refusal(mode: str, name: str) -> str:
    if mode == "plan":
        return (
            f"{name} was not run: the session is in plan mode, where only read-only tools run "
            "and nothing is changed. Explore and write your plan; to proceed, call "
            "exit_plan_mode(plan) with the plan, and the user decides whether to go ahead."
        )
    return (
        f"{name} is not allowed: the session is in read-only mode. "
        "Only read-only tools may run; ask the user to change the mode."
    )


def factory(agent: Any) -> PermissionsHook:
    settings = agent.config.hooks.settings.get("permissions", {})
    return PermissionsHook(timeout=float(settings.get("timeout", agent.config.permission_timeout)))
