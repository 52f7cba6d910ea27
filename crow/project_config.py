"""A project's crow.yaml: finding it, what it may not set, and composing it over the user's
config (`compose`) for a session whose cwd is in that project, once the user trusts it
(crow/trust.py). The user's own config is crow/config.py's."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from crow.config import CommandHookEntry, Config, fold_old_compaction_keys, validate_config
from crow.errors import ConfigError

# Keys a project's crow.yaml may not set, and why (the message names the reason).
PROJECT_FORBIDDEN: dict[str, str] = {
    "home": "crow's own folder (store, trust) is the user's choice",
    "store": "where sessions are kept (and who can read them) is the user's choice",
    "trace": "the trace file is written in the user's space",
    "tools": "Python tools load into crow's process for every session",
    "hooks.extra": "Python hooks load into crow's process for every session",
    "hooks.entry_points": "installed hooks are the user's choice",
    "hooks.disable": "builtin hooks are shared by every session of this crow process",
}
# Lists that a project extends rather than replaces: it may add rules, never drop the user's.
ADDITIVE_LISTS = {
    ("permissions", "allow"),
    ("permissions", "ask"),
    ("permissions", "deny"),
    ("environment", "exclude"),
    ("hooks", "commands"),  # a project's commands run after the user's (crow/project_commands.py)
}
PROJECT_FILE = "crow.yaml"


def merge(base: Mapping[str, Any], over: Mapping[str, Any], path: tuple[str, ...] = ()) -> dict[str, Any]:
    """`over` merged key by key into `base`: mappings merge deeply, lists replace (except
    ADDITIVE_LISTS, which append), anything else is replaced. Neither input is changed."""
    out = dict(base)
    for key, value in over.items():
        where = (*path, key)
        old = out.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            out[key] = merge(old, value, where)
        elif where in ADDITIVE_LISTS and isinstance(old, list) and isinstance(value, list):
            out[key] = [*old, *(v for v in value if v not in old)]
        else:
            out[key] = value
    return out


def find_project_file(cwd: Path, stop: Path | None = None) -> Path | None:
    """The nearest crow.yaml from `cwd` up to the repository root (the nearest folder with
    `.git`), else up to the user's home or `/`. Only the nearest applies: files higher up
    are not merged, so what a folder gets is one file the user can read and trust."""
    stop = stop if stop is not None else Path.home()
    folder = cwd
    while True:
        candidate = folder / PROJECT_FILE
        if candidate.is_file():
            return candidate
        if folder == stop or folder.parent == folder or (folder / ".git").exists():
            return None
        folder = folder.parent


def compose(user: Config, project: Mapping[str, Any], path: Path) -> Config:
    """`project` (a trusted crow.yaml's data) merged key by key over the user's config,
    then the environment and flags again: the project never replaces the user's file."""
    where = f" in {path}"
    for dotted, why in PROJECT_FORBIDDEN.items():
        head, _, tail = dotted.partition(".")
        value = project.get(head)
        if tail and isinstance(value, Mapping):
            value = value.get(tail)
        if value is not None:
            raise ConfigError(
                f"invalid configuration{where}: {dotted} cannot be set by a project's {PROJECT_FILE} "
                f"({why}); set it in your own config ({user.home / 'config.yaml'}) instead"
            )
    check_credentials(user, project, where)
    _check_prices(project, where, user.home)
    _check_commands(project, where)
    base = user.model_dump(exclude_unset=True)
    project = fold_old_compaction_keys(project)  # before the merge: a project's old key beats the user's
    config = validate_config({**merge(base, project), **user._top, "home": user.home}, where)
    config._top, config._source = user._top, user._source
    return config


def _check_prices(project: Mapping[str, Any], where: str, home: Path) -> None:
    """Prices are display-only, yet a project could show a cost far below what the user's
    account is charged (a price of 0 for an expensive model): what a model costs the user
    is the user's to say, in their own config or crow's list prices."""
    models = project.get("model_settings")
    if not isinstance(models, Mapping):
        return
    for ref, entry in models.items():
        if isinstance(entry, Mapping) and "pricing" in entry:
            raise ConfigError(
                f"invalid configuration{where}: model_settings.{ref}.pricing cannot be set by a "
                f"project's {PROJECT_FILE} (the cost shown is what your account pays); set it in "
                f"your own config ({home / 'config.yaml'}) instead"
            )


def _check_commands(project: Mapping[str, Any], where: str) -> None:
    """A project's command hooks are checked here, not at their first phase."""
    hooks = project.get("hooks")
    commands = hooks.get("commands") if isinstance(hooks, Mapping) else None
    if not isinstance(commands, list):
        return  # absent, or the schema check reports it
    from crow.command_hooks import command_hook
    from crow.errors import HookError

    for i, entry in enumerate(commands):
        try:
            command_hook(CommandHookEntry.model_validate(entry))
        except (ValidationError, HookError) as exc:
            raise ConfigError(f"invalid configuration{where}: hooks.commands[{i}]: {exc}") from exc


def check_credentials(user: Config, project: Mapping[str, Any], where: str) -> None:
    """A project may not send the user's key somewhere else: a provider whose `base_url` or
    `headers` the project sets must get its key from the project too (`api_key`, or an
    `api_key_env` that is not a key variable of any builtin or user provider), unless the
    user's own config says `allow_project_base_url: true` for that provider."""
    providers = project.get("providers")
    if not isinstance(providers, Mapping):
        return
    from crow.llm.registry import BUILTIN_PROVIDERS

    user_keys = {p.api_key_env for p in BUILTIN_PROVIDERS.values()}
    user_keys |= {e.api_key_env for e in user.providers.values() if e.api_key_env}
    user_keys |= {f"{n.upper().replace('-', '_')}_API_KEY" for n in [*BUILTIN_PROVIDERS, *user.providers]}
    for name, entry in providers.items():
        if not isinstance(entry, Mapping):
            continue  # the schema check reports it
        if "allow_project_base_url" in entry:
            raise ConfigError(
                f"invalid configuration{where}: providers.{name}.allow_project_base_url can only be "
                "set in the user's own config"
            )
        mine = user.providers.get(name)
        builtin = BUILTIN_PROVIDERS.get(name)
        its_own = {f"{name.upper().replace('-', '_')}_API_KEY"}
        its_own |= {p.api_key_env for p in (builtin, mine) if p is not None and p.api_key_env}
        key_env = entry.get("api_key_env")
        if key_env and key_env in user_keys and key_env not in its_own:
            raise ConfigError(
                f"invalid configuration{where}: providers.{name}.api_key_env names {key_env}, the key "
                f"of another provider: a project may not send one provider's key to another"
            )
        redirects = [k for k in ("base_url", "base_url_env", "headers") if entry.get(k)]
        if not redirects:
            continue
        if mine is not None and mine.allow_project_base_url:
            continue
        # The user's own entry is merged under the project's: its `api_key` (which wins over
        # any api_key_env) and its headers would go along to the project's endpoint.
        carried = [k for k in ("api_key", "headers") if mine is not None and getattr(mine, k)]
        carried = [k for k in carried if not (k == "api_key" and entry.get("api_key"))]
        if carried:
            raise ConfigError(
                f"invalid configuration{where}: providers.{name} sets {' and '.join(redirects)}, and your "
                f"config's providers.{name}.{' and '.join(carried)} would be sent there; a project may "
                f"redirect it only if your own config sets providers.{name}.allow_project_base_url: true. "
                "No request was sent."
            )
        own_key = entry.get("api_key") or (entry.get("api_key_env") and entry["api_key_env"] not in user_keys)
        if own_key:
            continue
        raise ConfigError(
            f"invalid configuration{where}: providers.{name} sets {' and '.join(redirects)}, but its "
            "API key would come from your environment or config; a project may redirect a provider "
            "only with a key it names itself (api_key_env: A_VARIABLE_FOR_THIS_PROJECT), or if your "
            f"own config sets providers.{name}.allow_project_base_url: true. No request was sent."
        )
