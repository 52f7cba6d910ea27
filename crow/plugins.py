"""Hook discovery: every hook crow runs is found here, once, in the agent's warm-up.

Sources, all registered into the agent's one `HookRegistry`:

    builtins        `crow.hooks` entry points of crow's own distribution (its pyproject.toml)
    plugins         `crow.hooks` and `crow.hooks.<phase>` entry points of any other distribution
    hooks.extra     `module:Hook` or `module:function@phase` named in the user's config
    hooks.commands  the user's command hooks, then `project_commands` (a trusted project's)
    programmatic    `agent.hooks.register(...)`, any time before the first turn

The stack's order does not depend on when a hook was registered (`HookRegistry`), only on:

    band 0  crow's builtins, by `order`: tracing -100, permissions -90, plan -80,
            filesystem -70, todolist -60, skills -50, memory -40, summarization 0.
            Every hook that runs tools is inside permissions: the builtins after it in this
            band, and all of band 1.
    band 1  everyone else's hooks, by `order` (default 0), then name. `project_commands`
            has order 1000: inside the user's own hooks.

For the onions the first is the outermost layer. `Agent(builtin_hooks=False)` leaves band
0 out and nothing else. `hooks.disable` names builtins, entry-point hooks or
`project_commands` to leave out; a name that is none of those is a configuration error.

    [project.entry-points."crow.hooks"]            a Hook class, instance or factory
    my_audit = "my_pkg:AuditHook"

    [project.entry-points."crow.hooks.mid_react"]  an async function at one phase
    compaction = "my_pkg:compaction_hook"

A factory is any other callable: it is called with the `Agent` (for its config) and
returns a Hook, or None to stay out. Imports and factories run in a worker thread (the
event loop keeps serving sessions meanwhile), so a factory must not need the running loop.
Everything is loaded and validated first, then
registered: a broken plugin fails the warm-up with its entry-point name and distribution,
and nothing is left half-registered.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from importlib.metadata import Distribution, EntryPoint, entry_points
from typing import TYPE_CHECKING, Any

import anyio

from crow.command_hooks import command_hook
from crow.errors import ConfigError, HookError
from crow.hooks import ALIASES, PHASES, SEED_PHASES, Hook, HookRegistry
from crow.project_commands import PROJECT_COMMANDS, ProjectCommandsHook

if TYPE_CHECKING:
    from crow.agent import Agent

log = logging.getLogger("crow.plugins")

GROUP = "crow.hooks"
CROW_DISTRIBUTION = "crow-agent"  # pyproject.toml's project name: its entry points are the builtins
_PHASE_GROUPS = [*PHASES, *ALIASES, *SEED_PHASES]


@dataclass(frozen=True, slots=True)
class Found:
    """A hook discovery found, not registered yet."""

    name: str
    hook: Any  # a Hook, or an async function when `phase` is set
    phase: str | None = None
    builtin: bool = False


async def install(agent: Agent, *, builtins: bool = True) -> None:
    """Find every hook (scanning installed packages in a worker thread) and register them."""
    found = await anyio.to_thread.run_sync(discover, agent, builtins)
    register_all(agent.hooks, found)


def discover(agent: Agent, builtins: bool = True) -> list[Found]:
    """Every hook the installed packages and the agent's config name, loaded and checked."""
    config = agent.config.hooks
    installed = entry_points()  # one scan of the installed distributions, then cheap selects
    points = [(ep, None) for ep in installed.select(group=GROUP)]
    for phase in _PHASE_GROUPS:
        points += [(ep, phase) for ep in installed.select(group=f"{GROUP}.{phase}")]
    points.sort(key=lambda p: (p[0].name, not _is_crow(p[0]), p[1] or ""))  # a builtin first
    if builtins and not any(_is_crow(ep) for ep, _ in points):
        raise HookError(
            f"crow's builtin hooks are not installed: no {GROUP!r} entry points of "
            f"{CROW_DISTRIBUTION!r} were found. Reinstall crow (pip install -e .)."
        )
    _check_disabled(config.disable, [ep.name for ep, _ in points], agent)
    blocked = set(config.disable)
    found: list[Found] = []
    taken: dict[str, EntryPoint] = {}
    for ep, phase in points:
        builtin = _is_crow(ep)
        if ep.name in blocked or not (builtins if builtin else config.entry_points):
            continue
        if (first := taken.setdefault(ep.name, ep)) is not ep:  # named here, with both sources
            dist = _dist_name(ep.dist) if getattr(ep, "dist", None) else "it"
            raise HookError(
                f"{_provenance(ep)}: the name {ep.name!r} is taken by {_provenance(first)}; "
                f"hook names are unique: uninstall {dist} (hooks.disable would switch off both)"
            )
        try:
            obj = ep.load()
            hook = obj if phase else _made(obj, agent)
        except Exception as exc:
            raise HookError(f"{_provenance(ep)}: failed to load: {exc}") from exc
        except SystemExit as exc:  # would end the warm-up's task group, and a server with it
            raise HookError(f"{_provenance(ep)}: failed to load: it called sys.exit({exc.code!r})") from exc
        if hook is not None:
            found.append(Found(ep.name, hook, phase, builtin))
    found += extra_hooks(config.extra, agent)
    width = len(str(len(config.commands)))  # command-01 ... command-12 sort as listed
    for i, entry in enumerate(config.commands):
        found.append(Found(entry.name or f"command-{i + 1:0{width}d}", command_hook(entry)))
    if PROJECT_COMMANDS not in blocked:
        found.append(Found(PROJECT_COMMANDS, ProjectCommandsHook(config.commands)))
    return found


def extra_hooks(specs: Iterable[str], agent: Agent) -> list[Found]:
    """Hooks named in config: `module:Hook` (class, instance or factory) or
    `module:function@phase`."""
    found: list[Found] = []
    for spec in specs:
        target, _, phase = spec.partition("@")
        obj = load_object(target)
        if phase:
            found.append(Found(target.rsplit(":", 1)[-1], obj, phase))
            continue
        try:
            hook = _made(obj, agent)
        except Exception as exc:
            raise HookError(f"hook {spec!r}: {exc}") from exc
        if hook is not None:
            found.append(Found(hook.name or target.rsplit(":", 1)[-1], hook))
    return found


def load_object(spec: str) -> Any:
    """`package.module:attr` -> the object."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise HookError(f"hook {spec!r}: expected 'module:object'")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise HookError(f"hook {spec!r}: {exc}") from exc
    except Exception as exc:  # the module itself failed: the user must learn which one
        raise HookError(f"hook {spec!r}: importing {module} raised {type(exc).__name__}: {exc}") from exc
    except SystemExit as exc:
        raise HookError(f"hook {spec!r}: it called sys.exit({exc.code!r})") from exc
    return obj


def register_all(registry: HookRegistry, found: list[Found]) -> None:
    """Register every hook found, or none: a throwaway registry checks the whole batch
    (and the names already taken) before the real one changes."""
    trial = HookRegistry()
    for item in found:
        if item.name in registry:
            raise HookError(f"a hook named {item.name!r} is already registered")
        _register(trial, item)
    for item in found:
        _register(registry, item)
        log.info("loaded hook %s%s", item.name, f" at {item.phase}" if item.phase else "")


def _register(registry: HookRegistry, item: Found) -> None:
    if item.phase is None:
        registry.register(item.hook, name=item.name, builtin=item.builtin)
    else:
        registry.register(item.phase, item.hook, name=item.name, builtin=item.builtin)


def _made(obj: Any, agent: Agent) -> Hook | None:
    """A Hook from what an entry point or config names: the instance itself, the class
    made with no arguments, or what a factory makes of the agent (None: stay out)."""
    if isinstance(obj, Hook):
        return obj
    if inspect.isclass(obj) and issubclass(obj, Hook):
        return obj()
    if callable(obj) and not inspect.iscoroutinefunction(obj):
        made = obj(agent)
        if made is None or isinstance(made, Hook):
            return made
        raise HookError(f"factory returned {made!r}, not a crow.Hook")
    raise HookError(f"{obj!r} is not a Hook class, instance or factory")


@functools.cache
def _dist_name(dist: Distribution) -> str:
    # Each read of `name` parses the distribution's METADATA (~1 ms); its entry points
    # share one Distribution object, so this parses it once.
    return str(dist.name)


def _is_crow(ep: EntryPoint) -> bool:
    dist = getattr(ep, "dist", None)
    return dist is not None and _dist_name(dist) == CROW_DISTRIBUTION


def _provenance(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    origin = f" from {dist.name} {dist.version}" if dist is not None else ""
    return f"entry point {ep.group}:{ep.name} = {ep.value}{origin}"


def _check_disabled(disabled: Iterable[str], names: list[str], agent: Agent) -> None:
    known = {*names, PROJECT_COMMANDS}
    unknown = sorted(set(disabled) - known)
    if unknown:
        where = f" in {agent.config.source}" if agent.config.source else ""
        raise ConfigError(
            f"invalid configuration{where}: hooks.disable names unknown hook(s) "
            f"{', '.join(map(repr, unknown))}; the hooks are {', '.join(sorted(known))}"
        )
