"""Finding hooks outside crow: entry points and `module:object` names from config.

    [project.entry-points."crow.hooks"]            a Hook class, instance or factory
    my_audit = "my_pkg:AuditHook"

    [project.entry-points."crow.hooks.mid_react"]  an async function at one phase
    compaction = "my_pkg:compaction_hook"

Everything is loaded and validated first, then registered: a broken plugin fails startup
with its entry-point name and distribution, and nothing is left half-registered.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from crow.errors import HookError
from crow.hooks import ALIASES, PHASES, SEED_PHASES, Hook, HookRegistry

log = logging.getLogger("crow.plugins")

GROUP = "crow.hooks"
_PHASE_GROUPS = [*PHASES, *ALIASES, *SEED_PHASES]


def _as_hook(obj: Any, where: str) -> Hook:
    if isinstance(obj, Hook):
        return obj
    if inspect.isclass(obj) and issubclass(obj, Hook):
        return obj()
    if callable(obj) and not inspect.iscoroutinefunction(obj):
        made = obj()
        if isinstance(made, Hook):
            return made
        raise HookError(f"{where}: factory returned {made!r}, not a crow.Hook")
    raise HookError(f"{where}: {obj!r} is not a Hook class, instance or factory")


def _provenance(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    origin = f" from {dist.name} {dist.version}" if dist is not None else ""
    return f"entry point {ep.group}:{ep.name} = {ep.value}{origin}"


def load_entry_points(registry: HookRegistry, *, blocked: set[str] | frozenset[str] = frozenset()) -> int:
    """Register every installed crow hook not blocked by name. Returns how many."""
    staged: list[tuple[str, str | None, Any]] = []  # (name, phase or None, hook or fn)
    installed = entry_points()  # one scan of the installed distributions, then cheap selects
    for ep in sorted(installed.select(group=GROUP), key=lambda e: e.name):
        if ep.name in blocked or ep.name in registry:
            continue
        where = _provenance(ep)
        try:
            staged.append((ep.name, None, _as_hook(ep.load(), where)))
        except HookError:
            raise
        except Exception as exc:
            raise HookError(f"{where}: failed to load: {exc!r}") from exc
    for phase in _PHASE_GROUPS:
        for ep in sorted(installed.select(group=f"{GROUP}.{phase}"), key=lambda e: e.name):
            if ep.name in blocked or ep.name in registry:
                continue
            try:
                staged.append((ep.name, phase, ep.load()))
            except Exception as exc:
                raise HookError(f"{_provenance(ep)}: failed to load: {exc!r}") from exc
    _register_all(registry, staged)
    return len(staged)


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
    return obj


def load_extra(registry: HookRegistry, specs: list[str]) -> None:
    """Hooks named in config: `module:HookClass` or `module:function@phase`."""
    staged: list[tuple[str, str | None, Any]] = []
    for spec in specs:
        target, _, phase = spec.partition("@")
        obj = load_object(target)
        name = target.rsplit(":", 1)[-1]
        staged.append((name, phase or None, obj if phase else _as_hook(obj, spec)))
    _register_all(registry, staged)


def _register_all(registry: HookRegistry, staged: list[tuple[str, str | None, Any]]) -> None:
    # A throwaway registry validates the whole batch before the real one changes.
    trial = HookRegistry()
    for name, phase, obj in staged:
        if name in registry:
            raise HookError(f"a hook named {name!r} is already registered")
        if phase is None:
            trial.add(obj, name=name)
        else:
            trial.register(phase, obj, name=name)
    for name, phase, obj in staged:
        if phase is None:
            registry.add(obj, name=name)
        else:
            registry.register(phase, obj, name=name)
        log.info("loaded hook %s%s", name, f" at {phase}" if phase else "")
