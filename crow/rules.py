"""Permission rules: `TOOL` or `TOOL(PATTERN)`, parsed once per config, matched per call.

    execute(git status *)   a glob over each command of the line; `X *` also matches `X`
    edit_file(src/**)       a gitignore-style pattern over the workspace-relative path
    shout  /  shout(*)      any other tool: its name

Precedence is deny > ask > allow. A command line is split on the shell's operators; an
allow rule covers it only when every command in it is covered and nothing in it can run
code the rules do not see (command substitution, output redirection to a file,
heredocs, control structures, assignments); a deny or ask rule matches when the line or
any command in it (substitutions and `sh -c` strings included) matches. Paths are
normalised and symlinks resolved; a path outside the workspace never matches an allow
rule. Deny rules on `execute` catch the ordinary ways of writing a command, not a model
set on evading them (`python -c`, `find -delete`): the sandbox is the hard boundary.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from crow.shell_parse import RUNS_OTHERS, Command, Parsed, split_commands

FILE_TOOLS = frozenset({"read_file", "write_file", "edit_file", "ls", "glob", "grep"})
EDIT_TOOLS = frozenset({"write_file", "edit_file"})
# ToolResult.meta key the permission hook sets on a call it refused (a rule, the mode, the
# user, or nobody to ask): front ends tell a refusal from a failed tool (`crow run` exit 4).
REFUSED = "crow/refused"
Decision = Literal["allow", "ask", "deny"]

_NAME = re.compile(r"[^\s()]+")
_SPACES = re.compile(r"\s+")


class RuleError(ValueError):
    """A rule that cannot be parsed; the message says which and why."""


@dataclass(frozen=True)
class Rule:
    text: str
    tool: str
    pattern: str | None  # None: every call of the tool
    origin: str = "config"  # "config" | "session"
    _regex: Any = field(default=None, repr=False, compare=False)  # execute: compiled glob
    _spec: Any = field(default=None, repr=False, compare=False)  # file tools: pathspec

    def __str__(self) -> str:
        return self.text


def parse_rule(text: Any, origin: str = "config") -> Rule:
    """`TOOL` or `TOOL(PATTERN)` -> Rule; RuleError with a reason for anything else."""
    if not isinstance(text, str):
        raise RuleError(f"a rule must be a string like 'execute(git status *)', not {text!r}")
    rule = text.strip()
    name, paren, rest = rule.partition("(")
    if not name or not _NAME.fullmatch(name):
        raise RuleError(f"invalid rule {text!r}: expected TOOL or TOOL(PATTERN), e.g. 'edit_file(src/**)'")
    if not paren:
        return Rule(rule, name, None, origin)
    if not rest.endswith(")"):
        raise RuleError(f"invalid rule {text!r}: the pattern must end with ')'")
    pattern = rest[:-1].strip()
    if not pattern:
        raise RuleError(f"invalid rule {text!r}: empty pattern (write just {name!r} for every call)")
    if name == "execute":
        pattern = _SPACES.sub(" ", pattern)
        return Rule(f"execute({pattern})", name, pattern, origin, _regex=_command_glob(pattern))
    if name in FILE_TOOLS:
        return Rule(f"{name}({pattern})", name, pattern, origin, _spec=_path_spec(text, pattern))
    if pattern != "*":
        raise RuleError(
            f"invalid rule {text!r}: patterns are understood for execute (a command glob) and "
            f"the file tools {', '.join(sorted(FILE_TOOLS))} (a path); for {name!r} write "
            f"{name!r} or '{name}(*)'"
        )
    return Rule(f"{name}(*)", name, None, origin)


def _command_glob(pattern: str) -> re.Pattern[str]:
    regex = fnmatch.translate(pattern)
    if pattern.endswith(" *"):  # `git status *` covers `git status` alone too
        regex = f"(?:{fnmatch.translate(pattern[:-2])})|(?:{regex})"
    return re.compile(regex)


def _path_spec(text: str, pattern: str) -> Any:
    import pathspec

    if pattern.startswith("!"):
        raise RuleError(f"invalid rule {text!r}: negated patterns are not supported; use another list")
    try:
        spec = pathspec.GitIgnoreSpec.from_lines([pattern])
    except (ValueError, IndexError) as exc:
        raise RuleError(f"invalid rule {text!r}: {exc}") from None
    if not spec.patterns or spec.patterns[0].include is not True:
        raise RuleError(f"invalid rule {text!r}: {pattern!r} is not a usable gitignore-style pattern")
    return spec


# --------------------------------------------------------------------------- subjects
@dataclass
class Subject:
    """What rules see of one call, computed once per call."""

    tool: str
    line: str = ""  # execute: the command line, whitespace collapsed
    commands: list[Command] = field(default_factory=list)  # execute: every command, nested too
    plain: bool = False  # execute: an allow rule may cover it (see the module docstring)
    paths: list[str] = field(default_factory=list)  # file tools: candidate paths (see below)
    inside: bool = False  # file tools: every candidate is inside the workspace


def subject(name: str, args: Mapping[str, Any], root: str) -> Subject:
    if name == "execute":
        command = args.get("command")
        line = _SPACES.sub(" ", command).strip() if isinstance(command, str) else ""
        parsed = split_commands(command) if isinstance(command, str) else Parsed([], False)
        return Subject(name, line=line, commands=parsed.commands, plain=parsed.plain)
    if name in FILE_TOOLS:
        paths, inside = path_candidates(args.get("path", "."), root)
        return Subject(name, paths=paths, inside=inside)
    return Subject(name)


def path_candidates(path: Any, root: str) -> tuple[list[str], bool]:
    """The path as written (normalised) and as it resolves (symlinks followed), relative to
    the workspace when inside it, else absolute without the leading '/'."""
    if not isinstance(path, str) or "\x00" in path:
        return [], False
    lexical_root, real_root = _roots(root)
    joined = os.path.join(lexical_root, path)
    try:
        resolved = os.path.realpath(joined)
    except (OSError, ValueError):  # a symlink loop, a name too long: the tool will refuse it
        return [], False
    out: list[str] = []
    inside = True
    for candidate, base in ((os.path.normpath(joined), lexical_root), (resolved, real_root)):
        if candidate == base:
            rel = "."
        elif candidate.startswith(base.rstrip("/") + "/"):
            rel = candidate[len(base.rstrip("/")) + 1 :]
        else:
            rel, inside = candidate.lstrip("/"), False
        if rel not in out:
            out.append(rel)
    return out, inside


@functools.lru_cache(maxsize=64)
def _roots(root: str) -> tuple[str, str]:
    return os.path.normpath(root), os.path.realpath(root)


# --------------------------------------------------------------------------- rule sets
class RuleSet:
    """Rules grouped by decision and tool."""

    def __init__(self, allow: Iterable[Rule] = (), ask: Iterable[Rule] = (), deny: Iterable[Rule] = ()):
        self.by: dict[str, dict[str, list[Rule]]] = {"allow": {}, "ask": {}, "deny": {}}
        for decision, rules in (("allow", allow), ("ask", ask), ("deny", deny)):
            for rule in rules:
                self.by[decision].setdefault(rule.tool, []).append(rule)

    def add(self, decision: Decision, rule: Rule) -> None:
        rules = self.by[decision].setdefault(rule.tool, [])
        if rule not in rules:
            rules.append(rule)

    def rules(self, decision: Decision, tool: str) -> list[Rule]:
        return self.by[decision].get(tool, [])

    def __bool__(self) -> bool:
        return any(self.by.values())


@functools.lru_cache(maxsize=32)
def compile_rules(allow: tuple[str, ...], ask: tuple[str, ...], deny: tuple[str, ...]) -> RuleSet:
    """The configured rules, parsed once per distinct configuration."""
    return RuleSet(map(parse_rule, allow), map(parse_rule, ask), map(parse_rule, deny))


def decide(subj: Subject, *sets: RuleSet) -> tuple[Decision | None, Rule | None]:
    """deny > ask > allow over all the sets; (None, None) when no rule speaks."""
    for decision in ("deny", "ask"):
        for s in sets:
            for rule in s.rules(decision, subj.tool):  # type: ignore[arg-type]
                if _matches_any(rule, subj):
                    return decision, rule  # type: ignore[return-value]
    allows = [r for s in sets for r in s.rules("allow", subj.tool)]
    if not allows:
        return None, None
    whole = next((r for r in allows if r.pattern is None), None)
    if whole is not None:
        return "allow", whole
    if subj.tool == "execute":
        if not subj.plain or not subj.commands:
            return None, None
        used: list[Rule] = []
        for cmd in subj.commands:
            rule = next((r for r in allows if r._regex.match(cmd.text)), None)
            if rule is None:
                return None, None
            used.append(rule)
        return "allow", used[0]
    if subj.tool in FILE_TOOLS:
        if not subj.inside or not subj.paths:
            return None, None
        first: Rule | None = None
        for path in subj.paths:
            rule = next((r for r in allows if r._spec.match_file(path)), None)
            if rule is None:
                return None, None
            first = first or rule
        return "allow", first
    return None, None


def _matches_any(rule: Rule, subj: Subject) -> bool:
    if rule.pattern is None:
        return True
    if subj.tool == "execute":
        rx = rule._regex
        return bool(
            rx.match(subj.line)
            or any(rx.match(c.text) or rx.match(c.bare) or any(map(rx.match, c.tails)) for c in subj.commands)
        )
    if subj.tool in FILE_TOOLS:
        return any(rule._spec.match_file(p) for p in subj.paths)
    return True


# --------------------------------------------------------------------------- choices
@dataclass(frozen=True)
class Choice:
    """One answer a permission prompt offers; `rules` are what it adds for the session."""

    id: str
    kind: Literal["allow_once", "allow_always", "reject_once", "reject_always"]
    label: str
    rules: tuple[str, ...] = ()


# Programs whose second word picks what they do: `git status` is not `git push`.
_SUBCOMMAND_PROGRAMS = frozenset(
    {"git", "hg", "svn", "jj", "npm", "pnpm", "yarn", "bun", "deno", "cargo", "go", "docker",
     "podman", "kubectl", "helm", "pip", "pip3", "uv", "poetry", "pdm", "hatch", "conda", "brew",
     "apt", "apt-get", "dnf", "gh", "terraform", "dotnet", "mvn", "gradle", "rustup",
     "systemctl", "make", "just", "nix", "bazel", "mix", "composer", "gem", "bundle", "rake"}
)  # fmt: skip
_SUBCOMMAND = re.compile(r"[A-Za-z][A-Za-z0-9_:.-]*")


def choices(subj: Subject, asked_by_rule: bool) -> list[Choice]:
    """The prompt's options, each always-option scoped and named by what it covers. A call
    asked because of an `ask` rule gets no always-allow: the rule would still ask."""
    always: list[Choice] = []  # allow_always options, narrowest first
    reject: tuple[str, tuple[str, ...]] | None = None  # (label, rules) of "always reject"
    if subj.tool == "execute":
        scopes = list(dict.fromkeys(_scope(c) for c in subj.commands)) if subj.plain else []
        if scopes and all(scopes):
            rules = tuple(f"execute({_glob_escape(s)} *)" for s in scopes)
            always.append(_always("allow_always", f"{_names(scopes)} commands", rules))
            if len(scopes) == 1:
                reject = (f"{_names(scopes)} commands", rules)
        if reject is None and subj.line:
            reject = ("this exact command", (f"execute({_glob_escape(subj.line)})",))
    elif subj.tool in FILE_TOOLS:
        if subj.inside and len(subj.paths) == 1 and subj.paths[0] != ".":
            rel = subj.paths[0]
            edits = subj.tool in EDIT_TOOLS
            tools = sorted(EDIT_TOOLS) if edits else [subj.tool]
            what = "edits" if edits else f"`{subj.tool}`"
            on = f"{'to' if edits else 'on'} {rel}"
            file_rules = tuple(f"{t}(/{_path_escape(rel)})" for t in tools)
            always.append(_always("allow_always", f"{what} {on}", file_rules))
            folder = os.path.dirname(rel)
            if folder:
                folder_rules = tuple(f"{t}(/{_path_escape(folder)}/**)" for t in tools)
                always.append(_always("allow_always_folder", f"{what} in {folder}/", folder_rules))
            reject = (f"{what} {on}", file_rules)
    else:
        always.append(_always("allow_always", f"`{subj.tool}`", (subj.tool,)))
        reject = (f"`{subj.tool}`", (subj.tool,))
    if always:  # the narrowest, also for every session in this project
        first = always[0]
        label = first.label.replace("Always allow", "Always allow in this project:", 1)
        always.append(Choice("allow_always_project", "allow_always", label, first.rules))
    out = [Choice("allow_once", "allow_once", "Allow")]
    if not asked_by_rule:
        out.extend(always)
    out.append(Choice("reject_once", "reject_once", "Reject"))
    if reject is not None:
        out.append(Choice("reject_always", "reject_always", f"Always reject {reject[0]}", reject[1]))
    return out


def _always(option_id: str, what: str, rules: tuple[str, ...]) -> Choice:
    return Choice(option_id, "allow_always", f"Always allow {what}", rules)


def _scope(cmd: Command) -> str:
    """`git status -s` -> `git status`; `ls -la` -> `ls`; "" for no always-option: `sudo`,
    `timeout`, `xargs` or `bash` "commands" would be every command."""
    if not cmd.plain or not cmd.words:
        return ""
    program = cmd.words[0]
    if os.path.basename(program) in RUNS_OTHERS:
        return ""
    if (
        os.path.basename(program) in _SUBCOMMAND_PROGRAMS
        and len(cmd.words) > 1
        and _SUBCOMMAND.fullmatch(cmd.words[1])
    ):
        return f"{program} {cmd.words[1]}"
    return program


def _names(scopes: Sequence[str]) -> str:
    quoted = [f"`{s}`" for s in scopes]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def _path_escape(path: str) -> str:
    escaped = re.sub(r"([*?\[\]\\])", r"\\\1", path)
    return escaped[:-1] + "\\ " if escaped.endswith(" ") else escaped
