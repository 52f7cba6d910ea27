"""The environment of every process crow starts on the model's behalf.

`execute` (locally and in an editor terminal), command hooks and stdio MCP servers all get
`child_environment(config)`: crow's own environment filtered by `config.environment`

    environment:
      inherit: all          # all | core | none: what to start from
      exclude: ["AWS_*"]    # globs over names, dropped
      include_only: []      # globs; when given, only matching names are kept
      set: {PAGER: cat}     # set last, verbatim

in this order: start from `inherit` (`core` is `CORE_VARIABLES`), drop every secret, drop
`exclude`, keep only `include_only`, then apply `set`. A secret is a name containing one of
`SECRET_MARKERS` (case-insensitive), one of crow's own that may hold a credential
(`CROW_SECRETS`: CROW_STORE's URL may carry a database password), or a provider key variable
crow knows (the builtin providers' and each configured `api_key_env`). `include_only` can
never re-admit a secret: a glob such as `*` must not undo the protection. `set` is explicit,
so it may set any name, secret-looking or not — that is the one way to hand a process a
credential on purpose.
Keys stored by `crow login` (`crow.credentials`) never enter an environment at all: crow
reads them from its file into the provider, so no child can inherit them.

Computed once per Config and cached: a tool call costs a dict lookup.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from crow.config import Config, EnvironmentPolicy

__all__ = [
    "CORE_VARIABLES",
    "CROW_SECRETS",
    "SECRET_MARKERS",
    "child_environment",
    "compute_environment",
    "is_secret",
    "provider_key_variables",
]

SECRET_MARKERS = ("KEY", "SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "PRIVATE")
# crow's variables that may hold a credential with no marker in their name.
CROW_SECRETS = frozenset({"CROW_STORE"})

# What `inherit: core` keeps: enough for a shell, a locale and a terminal.
CORE_VARIABLES = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TERM",
    "COLORTERM",
    "TMPDIR",
    "TZ",
    "PWD",
)


def provider_key_variables(config: Config | None = None) -> frozenset[str]:
    """The variables crow reads provider keys from: the builtin providers' and, for each
    configured provider, its `api_key_env` (or the `NAME_API_KEY` crow would read)."""
    from crow.llm.registry import BUILTIN_PROVIDERS

    names = {p.api_key_env for p in BUILTIN_PROVIDERS.values() if p.api_key_env}
    if config is not None:
        for name, entry in config.providers.items():
            names.add(entry.api_key_env or f"{name.upper().replace('-', '_')}_API_KEY")
    return frozenset(names)


def is_secret(name: str, known: Iterable[str] = ()) -> bool:
    upper = name.upper()
    return name in known or name in CROW_SECRETS or any(marker in upper for marker in SECRET_MARKERS)


def _matches(name: str, globs: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, g) for g in globs)


def compute_environment(
    policy: EnvironmentPolicy, parent: Mapping[str, str], secrets: Iterable[str] = ()
) -> dict[str, str]:
    """The child environment for `policy` over `parent` (pure; see the module docstring)."""
    known = frozenset(secrets)
    if policy.inherit == "all":
        env = dict(parent)
    elif policy.inherit == "core":
        env = {k: v for k, v in parent.items() if _matches(k, CORE_VARIABLES)}
    else:
        env = {}
    env = {k: v for k, v in env.items() if not is_secret(k, known) and not _matches(k, policy.exclude)}
    if policy.include_only:
        env = {k: v for k, v in env.items() if _matches(k, policy.include_only)}
    env.update(policy.set)
    return env


# id(config) -> (config, environment). The config is kept so its id cannot be reused while
# the entry lives; a handful of configs exist per process (the agent's, per-session ones).
_cache: dict[int, tuple[object, Mapping[str, str]]] = {}
_CACHE_MAX = 64


def child_environment(config: Config | None = None) -> Mapping[str, str]:
    """The environment for processes started on the model's behalf under `config` (the
    default policy when None), read-only and cached per config."""
    key = id(config)
    hit = _cache.get(key)
    if hit is not None and hit[0] is config:
        return hit[1]
    if config is None:
        from crow.config import EnvironmentPolicy

        policy = EnvironmentPolicy()
    else:
        policy = config.environment
    env = MappingProxyType(compute_environment(policy, os.environ, provider_key_variables(config)))
    if len(_cache) >= _CACHE_MAX:
        _cache.clear()
    _cache[key] = (config, env)
    return env
