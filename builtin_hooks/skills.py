"""SkillsHook: a catalog of SKILL.md skills in the system prompt (progressive loading).

A skill is a folder holding a `SKILL.md` whose YAML frontmatter names and describes it:

    ---
    name: csv-analyzer
    description: Analyze CSV files and generate charts
    ---
    (instructions the model reads only when the skill is relevant)

Roots searched, one level deep (`<root>/<skill>/SKILL.md`), first hit of a name wins:
`hooks.settings.skills.paths` (relative to the session's cwd), `<cwd>/.crow/skills`,
`<cwd>/.agents/skills`, `<cwd>/.claude/skills`, `$CROW_HOME/skills`.

Only each skill's name, description and path go into the prompt; the model reads the file
when it needs it. `name` falls back to the folder name. A name over 64 characters, a
missing description, or frontmatter that is not a YAML mapping skips that skill with a
warning; a description over 1,024 characters is cut to 1,024 with a warning. Discovery
runs once per session (cached in `session.state`); each request then costs one string
join.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from crow import (
    CommandError,
    Hook,
    HookContext,
    ModelRequest,
    PromptCommand,
    ServerSpec,
    Session,
    expand_arguments,
    parse_frontmatter,
    read_text_file,
    split_frontmatter,
)

if TYPE_CHECKING:
    from crow import Agent

log = logging.getLogger("crow.hooks.skills")

MAX_NAME = 64
MAX_DESCRIPTION = 1024
CONVENTIONAL_ROOTS = (".crow/skills", ".agents/skills", ".claude/skills")
HEADER = (
    "## Skills\n"
    "Skills are folders of instructions for specialised tasks. Each line below names a "
    "skill, says what it is for and where its SKILL.md is. When a skill is relevant to the "
    "task, call read_skill with its name first and follow it; read other files it mentions "
    "(read_skill with `file`) only when you need them."
)
_STATE_KEY = "skills.catalog"


@dataclass(frozen=True, slots=True)
class Skill:
    name: str
    description: str
    path: Path  # absolute path of SKILL.md


def load_skill(path: Path) -> Skill | None:
    """One SKILL.md -> Skill, or None (with a warning) when it cannot be used."""
    try:
        meta = parse_frontmatter(read_text_file(path, errors="replace"))
    except (OSError, ValueError) as exc:
        log.warning("skill %s skipped: %s", path, exc)
        return None
    if meta is None:
        log.warning("skill %s skipped: no YAML frontmatter (---, name, description, ---)", path)
        return None
    name = meta.get("name") or path.parent.name
    description = meta.get("description")
    if not isinstance(name, str | int | float) or not isinstance(description, str) or not description.strip():
        log.warning("skill %s skipped: frontmatter needs a text 'description' (and 'name')", path)
        return None
    name = " ".join(str(name).split())
    if len(name) > MAX_NAME:
        log.warning("skill %s skipped: name %r is over %d characters", path, name[:80], MAX_NAME)
        return None
    description = " ".join(description.split())
    if len(description) > MAX_DESCRIPTION:
        log.warning("skill %s: description over %d characters; cut", path, MAX_DESCRIPTION)
        description = description[: MAX_DESCRIPTION - 1] + "…"
    return Skill(name, description, path.absolute())


def discover(roots: list[Path]) -> list[Skill]:
    """Every usable skill under `roots`, one level deep, first of each name kept."""
    found: dict[str, Skill] = {}
    seen: set[Path] = set()
    for root in roots:
        try:
            if not root.is_dir():
                continue
            folders = sorted(p for p in root.iterdir() if p.is_dir())
        except OSError as exc:
            log.warning("cannot list skills in %s: %s", root, exc)
            continue
        for folder in folders:
            skill_md = folder / "SKILL.md"
            if not skill_md.is_file():
                continue
            real = skill_md.resolve()
            if real in seen:
                continue
            seen.add(real)
            skill = load_skill(skill_md)
            if skill is None:
                continue
            if skill.name in found:
                log.info("skill %s at %s shadowed by %s", skill.name, skill.path, found[skill.name].path)
                continue
            found[skill.name] = skill
    return list(found.values())


def render_catalog(skills: list[Skill]) -> str:
    if not skills:
        return ""
    lines = [f"- {s.name}: {s.description} ({s.path})" for s in skills]
    return "\n".join([HEADER, *lines])


class SkillsHook(Hook):
    """Finds SKILL.md skills once per session and lists them in the system prompt."""

    name = "skills"
    order = -50

    def __init__(self, paths: list[str] | tuple[str, ...] = (), *, home: Path | str | None = None) -> None:
        self.paths = [str(p) for p in paths]
        self.home = Path(home).expanduser() if home is not None else Path("~/.crow").expanduser()

    def roots(self, cwd: Path) -> list[Path]:
        configured = [cwd / Path(p).expanduser() for p in self.paths]  # absolute paths stay absolute
        return [*configured, *(cwd / r for r in CONVENTIONAL_ROOTS), self.home / "skills"]

    def tool_servers(self, session: Session) -> list[ServerSpec]:
        """`read_skill`: skills often live outside the workspace the file tools are confined to."""
        from mcp.server.mcpserver.exceptions import ToolError

        from crow import function_server

        async def read_skill(name: str, file: str = "SKILL.md") -> str:
            """Read a skill's SKILL.md (or another file in the skill's folder) by skill name."""
            skills = session.state.get("skills")
            if skills is None:
                skills = await anyio.to_thread.run_sync(discover, self.roots(session.cwd))
            skill = next((s for s in skills if s.name == name), None)
            if skill is None:
                known = ", ".join(s.name for s in skills) or "none"
                raise ToolError(f"no skill named {name!r}; skills: {known}")
            folder = skill.path.parent.resolve()
            target = (folder / file).resolve()
            if not target.is_relative_to(folder) or not target.is_file():
                raise ToolError(f"{file!r} is not a file in the folder of skill {name!r}")
            try:
                return await anyio.to_thread.run_sync(partial(read_text_file, target, errors="replace"))
            except (OSError, ValueError) as exc:
                raise ToolError(f"{file!r} of skill {name!r} cannot be read: {exc}") from None

        shown = {"read_skill": ("read", "Read skill {name}")}
        server = function_server([(read_skill, True)], "crow-skills", shown)
        return [ServerSpec("skills", "inprocess", server=server)]

    def _skills(self, session: Session) -> list[Skill]:
        """The session's skills, found once (blocking: called in a worker thread)."""
        skills = session.state.get("skills")
        if skills is None:
            skills = session.state["skills"] = discover(self.roots(session.cwd))
        return list(skills)

    def commands(self, session: Session) -> list[PromptCommand]:
        """Each skill as `/<name>`: its instructions with the arguments. A skill in the
        session's workspace ranks with the project's commands, any other with the user's."""
        return [_command(skill, session) for skill in self._skills(session) if " " not in skill.name]

    async def before_agent(self, ctx: HookContext) -> None:
        state = ctx.session.state
        if _STATE_KEY in state:
            return
        parent = ctx.session.parent
        if parent is not None and parent.cwd == ctx.session.cwd and "skills" in parent.state:
            state["skills"] = parent.state["skills"]  # a subagent: its parent's, found once
            skills = list(state["skills"])
        else:
            skills = await anyio.to_thread.run_sync(self._skills, ctx.session)
        state[_STATE_KEY] = render_catalog(skills)
        if skills:
            log.info("session %s: %d skills: %s", ctx.session.id, len(skills), [s.name for s in skills])

    async def modify_request(self, ctx: HookContext, request: ModelRequest) -> ModelRequest | None:
        catalog = ctx.session.state.get(_STATE_KEY)
        if not catalog:
            return None
        return request.with_system(catalog)


def _command(skill: Skill, session: Session) -> PromptCommand:
    scope = "project" if any(skill.path.is_relative_to(r) for r in session.roots) else "user"

    async def expand(arguments: str) -> str:
        try:
            text = await anyio.to_thread.run_sync(partial(read_text_file, skill.path, errors="replace"))
            body = split_frontmatter(text)[1]
        except (OSError, ValueError) as exc:
            raise CommandError(f"skill {skill.name!r} ({skill.path}): {exc}") from exc
        head = f"Use the skill {skill.name!r} (its folder: {skill.path.parent}). Its instructions:"
        return f"{head}\n\n{expand_arguments(body.strip(), arguments)}"

    return PromptCommand(skill.name, skill.description, expand, "", scope, f"skill, {scope}")


def factory(agent: Agent) -> SkillsHook:
    """The `crow.hooks` entry point: paths from `hooks.settings.skills.paths`."""
    settings = agent.config.hooks.settings.get("skills", {})
    return SkillsHook(settings.get("paths", []), home=agent.config.home)
