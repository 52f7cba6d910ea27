"""Configuration: defaults < the user's file < a trusted project's crow.yaml < environment.

The user's file is `--config PATH` or `$CROW_HOME/config.yaml` (`CROW_HOME` defaults to
`~/.crow`). A project's `crow.yaml` is the nearest one from a session's cwd up to the
repository root; it applies to that session only, merged key by key over the user's file,
and only when the user trusts it (crow/trust.py; the merge: crow/project_config.py).
Environment overrides: `CROW_MODEL`, `CROW_HOME`, `CROW_TRACE`, `CROW_MODE`, `CROW_SANDBOX`,
`CROW_STORE`.
Provider keys and base URLs come from the provider's own variables (`OPENAI_API_KEY`,
`OPENAI_BASE_URL`, `ANTHROPIC_API_KEY`, ...).
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from crow.errors import ConfigError
from crow.private import DB_FILE, crow_home

log = logging.getLogger("crow.config")

DEFAULT_SYSTEM_PROMPT = """You are crow, a coding agent working in the user's workspace at {cwd}.
Use the tools to read, search, edit and run code; prefer small, verifiable steps. Paths are
relative to the workspace. Keep a todo list with write_todos for multi-step work. When you are
done, answer briefly with what you did."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProviderSettings(_Model):
    """One provider endpoint (`providers.NAME`); the registry's builtins are these too.
    Fields left unset fall back to the builtin entry of the same name."""

    kind: Literal["openai", "anthropic"] | None = None  # None: as the builtin of that name
    base_url: str | None = None
    base_url_env: str | None = None  # an environment variable that overrides base_url
    api_key_env: str | None = None
    api_key: str | None = None  # prefer api_key_env: a key in a file is a key on disk
    connect_timeout: float | None = None
    read_timeout: float | None = None
    max_retries: int | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    # User config only: a trusted project's crow.yaml may point this provider elsewhere.
    allow_project_base_url: bool = False

    def merged(self, override: ProviderSettings) -> ProviderSettings:
        """This entry with what `override` sets laid over it."""
        return self.model_copy(update=override.model_dump(exclude_unset=True))


# A price above this (USD per million tokens) is a typo, and a huge one would make the
# cost overflow to inf, which JSON cannot carry.
MAX_PRICE = 10_000.0


class Pricing(_Model):
    """`model_settings.REF.pricing`: USD per million tokens, shown as the session's cost.
    Cache reads and writes cost the input price unless given."""

    input: float = Field(ge=0, le=MAX_PRICE, allow_inf_nan=False)
    output: float = Field(ge=0, le=MAX_PRICE, allow_inf_nan=False)
    cache_read: float | None = Field(None, ge=0, le=MAX_PRICE, allow_inf_nan=False)
    cache_write: float | None = Field(None, ge=0, le=MAX_PRICE, allow_inf_nan=False)


_LEVEL_PATTERN = r"^[a-z][a-z0-9_-]{0,31}$"


class ReasoningSettings(_Model):
    """`model_settings.REF.reasoning`: the thought levels a model takes (crow/reasoning.py).
    OpenAI-style models get the level as `reasoning_effort`; Anthropic ones a thinking
    budget (`budgets`, else crow's own; "off"/"none" or a budget of 0: no thinking).
    `levels: []` says the model takes none."""

    levels: list[str]
    default: str | None = None  # shown while the session chose none; else the model's own
    budgets: dict[str, int] = Field(default_factory=dict)  # Anthropic budget_tokens per level

    @model_validator(mode="after")
    def _consistent(self) -> ReasoningSettings:
        for level in self.levels:
            if not re.match(_LEVEL_PATTERN, level):
                raise ValueError(f"level {level!r}: lower-case letters, digits, '-' and '_' only")
        if len(set(self.levels)) != len(self.levels):
            raise ValueError(f"levels repeat a name: {self.levels}")
        if self.default is not None and self.default not in self.levels:
            raise ValueError(f"default {self.default!r} is not one of the levels {self.levels}")
        for level, budget in self.budgets.items():
            if level not in self.levels:
                raise ValueError(f"budgets.{level}: not one of the levels {self.levels}")
            if budget != 0 and not 1024 <= budget <= 1_000_000:
                raise ValueError(f"budgets.{level}: {budget} (0 = no thinking, else 1024 to 1000000 tokens)")
        return self


class ModelSettings(_Model):
    """Per-model settings (`model_settings.REF`), by `provider:model` or model name."""

    context_window: int | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    reasoning_effort: str | None = None
    thinking_budget: int | None = None
    images: bool | None = None  # whether the model accepts images (None: crow's known list)
    pricing: Pricing | None = None  # the user's config only (crow/project_config.py)
    reasoning: ReasoningSettings | None = None


class CommandHookEntry(_Model):
    command: str
    phases: list[str] = Field(default_factory=lambda: ["agent_stop"])
    timeout: float = 30.0
    name: str | None = None


class HooksConfig(_Model):
    disable: list[str] = Field(default_factory=list)  # builtin or entry-point hooks to leave out
    extra: list[str] = Field(default_factory=list)  # "module:object" hooks to add
    settings: dict[str, dict[str, Any]] = Field(default_factory=dict)  # per-hook options
    commands: list[CommandHookEntry] = Field(default_factory=list)
    entry_points: bool = True  # load hooks installed under the crow.hooks groups


def valid_variables(value: dict[str, str], key: str) -> dict[str, str]:
    """Environment variables a process can be given: a name without '=' or NUL, a value
    without NUL (`key` names the setting in the error)."""
    for name, text in value.items():
        if not name or "=" in name or "\0" in name or "\0" in text:
            raise ValueError(f"{key}: {name!r} is not a valid variable (no '=' or NUL)")
    return value


class EnvironmentPolicy(_Model):
    """What processes started on the model's behalf (execute, command hooks, stdio MCP
    servers) inherit from crow's environment. Secrets are always dropped (see crow.trust)."""

    inherit: Literal["all", "core", "none"] = "all"
    exclude: list[str] = Field(default_factory=list)  # globs over variable names
    include_only: list[str] = Field(default_factory=list)  # globs; empty = no filter
    set: dict[str, str] = Field(default_factory=dict)

    @field_validator("set")
    @classmethod
    def _valid_names(cls, value: dict[str, str]) -> dict[str, str]:
        return valid_variables(value, "environment.set")


_MEMORY = re.compile(r"(\d+(?:\.\d+)?)\s*([kmg]?)i?b?", re.IGNORECASE)


class BackendConfig(_Model):
    """Where the file tools and `execute` act (seed 000's `backend`): `local` (this machine's
    disk; `execute` under the sandbox) or `docker` (a container per session, from `image`,
    through the Docker Engine API at DOCKER_HOST: Docker or Podman, local or remote; see
    docs/containers.md). `sync`: how the workspace reaches the container: `mount` (a bind
    mount: the engine's machine must see this folder), `copy` (copied in when the container
    starts, changed files synced back at the end of each turn), `auto` (mount for a unix
    socket, copy for tcp:// and ssh://)."""

    type: Literal["local", "docker"] = "local"
    image: str | None = None
    workdir: str = "/workspace"
    network: bool = True
    cpus: float | None = Field(None, gt=0)
    memory: int | None = Field(None, gt=0)  # bytes; "512m", "2g" are read too
    user: str | None = None  # the container's user ("1000", "1000:1000", "app"); default the image's
    mounts: list[str] = Field(default_factory=list)  # "HOST:CONTAINER[:ro]", HOST absolute
    env: dict[str, str] = Field(default_factory=dict)  # the commands' environment in the container
    sync: Literal["auto", "mount", "copy"] = "auto"

    @field_validator("workdir")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or "\0" in value:
            raise ValueError(f"backend.workdir must be an absolute path in the container, got {value!r}")
        return posixpath.normpath(value)

    @field_validator("memory", mode="before")
    @classmethod
    def _bytes(cls, value: Any) -> Any:
        if isinstance(value, str):
            match = _MEMORY.fullmatch(value.strip())
            if match is None:
                raise ValueError(f"backend.memory: {value!r} is not a size (e.g. 512m, 2g, or bytes)")
            scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[match[2].lower()]
            return int(float(match[1]) * scale)
        return value

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, value: list[str]) -> list[str]:
        for mount in value:
            parts = mount.split(":")
            if not 2 <= len(parts) <= 3 or not parts[0].startswith("/") or not parts[1].startswith("/"):
                raise ValueError(f"backend.mounts: {mount!r} is not HOST:CONTAINER[:ro] with absolute paths")
            if len(parts) == 3 and parts[2] not in ("ro", "rw"):
                raise ValueError(f"backend.mounts: {mount!r}: the option after the paths is ro or rw")
        return value

    @field_validator("env")
    @classmethod
    def _valid_env(cls, value: dict[str, str]) -> dict[str, str]:
        return valid_variables(value, "backend.env")

    @model_validator(mode="after")
    def _image_for_docker(self) -> BackendConfig:
        if self.type == "docker" and not self.image:
            raise ValueError("backend.type docker needs backend.image (e.g. python:3.12-slim)")
        return self


class PermissionRules(_Model):
    """`TOOL` or `TOOL(PATTERN)` rules; deny > ask > allow in every mode."""

    allow: list[str] = Field(default_factory=list)
    ask: list[str] = Field(default_factory=list)
    deny: list[str] = Field(default_factory=list)

    @field_validator("allow", "ask", "deny")
    @classmethod
    def _parse(cls, rules: list[str]) -> list[str]:
        if rules:  # a rule that cannot be parsed is an error at load, not a silent no-op
            from crow.rules import compile_rules

            compile_rules(tuple(rules), (), ())  # raises RuleError (a ValueError) naming the rule
        return rules


class CompactionConfig(_Model):
    """`compaction:` — when a session's context is summarized, and how (crow/compact/)."""

    threshold: float = Field(0.85, gt=0, le=1)  # share of the model's context window
    keep_ratio: float = Field(0.10, ge=0, lt=1)  # recent messages kept verbatim...
    min_keep: int = Field(2, ge=1)  # ...at least this many
    summary_words: int = Field(2000, ge=1)
    max_tool_arg_chars: int = Field(2000, ge=1)  # old write/edit arguments in a standalone request
    cache_preserving: bool = True  # repeat the last request's prefix (the provider's cache)
    # After a failed summary, automatic compaction waits until the history has grown by
    # max(backoff_messages, backoff_ratio x its length at the failure).
    backoff_messages: int = Field(4, ge=0)
    backoff_ratio: float = Field(0.10, ge=0)


# Where compaction was configured before `compaction:` (still read, logged as deprecated).
_OLD_HOOK_KEYS = ("threshold", "keep_ratio", "min_keep", "summary_words", "cache_preserving")
_warned: set[str] = set()


def fold_old_compaction_keys(data: Any) -> Any:
    """One config layer with `compact_threshold` and `hooks.settings.summarization.{threshold,
    keep_ratio, min_keep, summary_words, cache_preserving}` moved into `compaction:`. A field
    the section sets itself wins; the hook's threshold won over `compact_threshold` before."""
    if not isinstance(data, Mapping):
        return data
    out, old = dict(data), {}
    if "compact_threshold" in out:
        _deprecated("compact_threshold", "compaction.threshold")
        old["threshold"] = out.pop("compact_threshold")
    hooks = out.get("hooks")
    settings = hooks.get("settings") if isinstance(hooks, Mapping) else None
    hook = settings.get("summarization") if isinstance(settings, Mapping) else None
    if isinstance(hook, Mapping) and (picked := {k: v for k, v in hook.items() if k in _OLD_HOOK_KEYS}):
        _deprecated("hooks.settings.summarization", "compaction")
        old |= picked
        rest = {k: v for k, v in hook.items() if k not in picked}
        out["hooks"] = {**hooks, "settings": {**settings, "summarization": rest}}  # type: ignore[dict-item]
    if old:
        section = out.get("compaction")
        if isinstance(section, BaseModel):
            section = section.model_dump(exclude_unset=True)
        out["compaction"] = {**old, **(section if isinstance(section, Mapping) else {})}
    return out


def _deprecated(key: str, instead: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning("config: %s is deprecated; set %s instead", key, instead)


MODES = ("ask", "accept_edits", "yolo", "read_only", "plan")


class Config(_Model):
    model: str | None = None  # "provider:model"
    models: list[str] = Field(default_factory=list)  # offered in the editor's model picker
    providers: dict[str, ProviderSettings] = Field(default_factory=dict)
    model_settings: dict[str, ModelSettings] = Field(default_factory=dict)
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    max_iterations: int = Field(25, ge=1)
    max_continues: int = Field(5, ge=0)
    compaction: CompactionConfig = Field(default_factory=CompactionConfig)
    mode: Literal["ask", "accept_edits", "yolo", "read_only", "plan"] = "ask"
    permission_timeout: float = 600.0
    permissions: PermissionRules = Field(default_factory=PermissionRules)
    # "workspace": execute runs under bubblewrap when it is installed; "off": it does not.
    sandbox: Literal["workspace", "off"] = "workspace"
    network: bool = True  # sandboxed commands reach the network
    environment: EnvironmentPolicy = Field(default_factory=EnvironmentPolicy)
    backend: BackendConfig = Field(default_factory=BackendConfig)
    trace: str | None = None
    hooks: HooksConfig = Field(default_factory=HooksConfig)
    tools: list[str] = Field(default_factory=list)  # "module:function" served as tools
    home: Path = Field(default_factory=lambda: Path("~/.crow").expanduser())
    # Where sessions are kept: None = the SQLite file in `home`; "postgresql://…" (or
    # "postgres://…") = a PostgreSQL database (crow.store.postgres). The user's choice only.
    store: str | None = None
    # The environment and command-line layer, re-applied over a project's file.
    _top: dict[str, Any] = PrivateAttr(default_factory=dict)
    # The user's file it was read from (`--config PATH` may lie outside crow's home): it may
    # hold keys, so the model's tools must not reach it (builtin_hooks/filesystem).
    _source: Path | None = PrivateAttr(default=None)

    @property
    def source(self) -> Path | None:
        return self._source

    @model_validator(mode="before")
    @classmethod
    def _old_compaction_keys(cls, data: Any) -> Any:
        return fold_old_compaction_keys(data)

    @field_validator("sandbox", mode="before")
    @classmethod
    def _sandbox_alias(cls, value: Any) -> Any:
        # "bwrap" was the only value before the sandbox was on by default; None meant off.
        return {"bwrap": "workspace", None: "off", False: "off"}.get(value, value)

    @field_validator("store")
    @classmethod
    def _store_url(cls, value: str | None) -> str | None:
        if value is None or value == "" or value == "sqlite":
            return None
        if value.startswith(("postgresql://", "postgres://")):
            return value
        raise ValueError(
            "store must be a postgresql:// URL (or left out: the SQLite file in crow's home)"
        )

    @property
    def db_path(self) -> Path:
        return self.home / DB_FILE

    def model_choices(self) -> list[str]:
        seen = [self.model] if self.model else []
        return list(dict.fromkeys([*seen, *self.models]))


# Values in a config once YAML aliases are expanded; a real one has a few hundred. A few
# hundred bytes of nested aliases expand to billions, which printing or copying would build.
MAX_CONFIG_VALUES = 100_000


def read_yaml(path: Path, raw: bytes | None = None) -> dict[str, Any]:
    """`path` (or its bytes already read, `raw`) as a YAML mapping."""
    import yaml

    try:
        text = raw.decode("utf-8") if raw is not None else path.read_text(encoding="utf-8")
        loaded = yaml.safe_load(text) or {}
    except RecursionError:  # PyYAML composes nodes recursively: "[[[[..." of any depth
        raise ConfigError(f"cannot read {path}: nested too deeply") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    except (ValueError, TypeError, AttributeError) as exc:  # PyYAML's constructors: `a: 2024-13-45`
        raise ConfigError(f"cannot read {path}: a value cannot be read ({exc})") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    if _too_many_values(loaded, MAX_CONFIG_VALUES):
        raise ConfigError(
            f"{path}: more than {MAX_CONFIG_VALUES:,} values once its aliases are expanded; "
            "not a configuration crow will read"
        )
    return loaded


def _too_many_values(loaded: Any, limit: int) -> bool:
    """Counts values as if aliases were expanded, stopping at `limit` (so a self-referencing
    alias ends too)."""
    stack, seen = [loaded], 0
    while stack:
        value = stack.pop()
        seen += 1
        if seen > limit:
            return True
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


def find_config_file(explicit: str | None, home: Path) -> Path | None:
    """The user's config: `--config PATH`, else `$CROW_HOME/config.yaml` if it exists."""
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        return path
    candidate = home / "config.yaml"
    return candidate if candidate.is_file() else None


def _env_layer(env: Mapping[str, str]) -> dict[str, Any]:
    return {
        key: env[var]
        for var, key in (
            ("CROW_MODEL", "model"),
            ("CROW_TRACE", "trace"),
            ("CROW_MODE", "mode"),
            ("CROW_SANDBOX", "sandbox"),
            ("CROW_STORE", "store"),
        )
        if env.get(var)
    }


def validate_config(data: Mapping[str, Any], where: str) -> Config:
    """`data` as a Config; an invalid one is a ConfigError saying where it came from."""
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        said = str(exc)
        if isinstance(store := data.get("store"), str) and store:
            # pydantic quotes the input, and a store URL may carry the database's password
            # (CROW_STORE is a secret): only its scheme is shown.
            said = said.replace(store, store.partition("://")[0] + "://…" if "://" in store else "…")
        raise ConfigError(f"invalid configuration{where}: {said}") from exc
    return config  # hooks.disable is checked where hooks are found (crow.plugins)


def load_config(
    explicit: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """The user's configuration: defaults < `--config PATH` or `$CROW_HOME/config.yaml` <
    environment < `overrides` (command-line flags). A project's crow.yaml is not read here:
    it is merged per session, for that session's cwd, by `compose` (and only if trusted)."""
    env = os.environ if env is None else env
    home = crow_home(env)
    path = find_config_file(explicit, home)
    data: dict[str, Any] = read_yaml(path) if path is not None else {}
    data["home"] = home
    top = {**_env_layer(env), **(overrides or {})}
    config = validate_config({**data, **top}, f" in {path}" if path else "")
    config._top = top
    config._source = path.absolute() if path is not None else None
    return config


NO_MODEL_MESSAGE = (
    "No model is configured. Set CROW_MODEL=provider:model (for example "
    "`openai:gpt-4.1-mini` with OPENAI_API_KEY, `anthropic:claude-sonnet-4-5` with "
    "ANTHROPIC_API_KEY, or `ollama:qwen3:8b` for a local Ollama), or put `model:` in "
    "~/.crow/config.yaml (or a trusted project's crow.yaml)."
)
