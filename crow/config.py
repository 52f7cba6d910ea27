"""Configuration: defaults < YAML file < environment.

The file is the first of `--config PATH`, `./crow.yaml`, `$CROW_HOME/config.yaml`
(`CROW_HOME` defaults to `~/.crow`). Environment overrides: `CROW_MODEL`, `CROW_HOME`,
`CROW_TRACE`, `CROW_MODE`, `CROW_SANDBOX`. Provider keys and base URLs come from the
provider's own variables (`OPENAI_API_KEY`, `OPENAI_BASE_URL`, `ANTHROPIC_API_KEY`, ...).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from crow.errors import ConfigError

DEFAULT_SYSTEM_PROMPT = """You are crow, a coding agent working in the user's workspace at {cwd}.
Use the tools to read, search, edit and run code; prefer small, verifiable steps. Paths are
relative to the workspace. Keep a todo list with write_todos for multi-step work. When you are
done, answer briefly with what you did."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProviderEntry(_Model):
    kind: Literal["openai", "anthropic"] | None = None  # None: as the builtin of that name
    base_url: str | None = None
    api_key_env: str | None = None
    api_key: str | None = None  # prefer api_key_env: a key in a file is a key on disk
    connect_timeout: float | None = None
    read_timeout: float | None = None
    max_retries: int | None = None
    headers: dict[str, str] = Field(default_factory=dict)


class ModelEntry(_Model):
    context_window: int | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    reasoning_effort: str | None = None
    thinking_budget: int | None = None


class CommandHookEntry(_Model):
    command: str
    phases: list[str] = Field(default_factory=lambda: ["agent_stop"])
    timeout: float = 30.0
    name: str | None = None


class HooksConfig(_Model):
    disable: list[str] = Field(default_factory=list)  # builtin hook names to switch off
    extra: list[str] = Field(default_factory=list)  # "module:object" hooks to add
    settings: dict[str, dict[str, Any]] = Field(default_factory=dict)  # per-hook options
    commands: list[CommandHookEntry] = Field(default_factory=list)
    entry_points: bool = True  # load hooks installed under the crow.hooks groups


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
        for name, text in value.items():
            if not name or "=" in name or "\0" in name or "\0" in text:
                raise ValueError(f"environment.set: {name!r} is not a valid variable (no '=' or NUL)")
        return value


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


MODES = ("ask", "accept_edits", "yolo", "read_only", "plan")


class Config(_Model):
    model: str | None = None  # "provider:model"
    models: list[str] = Field(default_factory=list)  # offered in the editor's model picker
    providers: dict[str, ProviderEntry] = Field(default_factory=dict)
    model_settings: dict[str, ModelEntry] = Field(default_factory=dict)
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    max_iterations: int = Field(25, ge=1)
    max_continues: int = Field(5, ge=0)
    compact_threshold: float = Field(0.85, gt=0, le=1)
    mode: Literal["ask", "accept_edits", "yolo", "read_only", "plan"] = "ask"
    permission_timeout: float = 600.0
    permissions: PermissionRules = Field(default_factory=PermissionRules)
    # "workspace": execute runs under bubblewrap when it is installed; "off": it does not.
    sandbox: Literal["workspace", "off"] = "workspace"
    network: bool = True  # sandboxed commands reach the network
    environment: EnvironmentPolicy = Field(default_factory=EnvironmentPolicy)
    trace: str | None = None
    hooks: HooksConfig = Field(default_factory=HooksConfig)
    tools: list[str] = Field(default_factory=list)  # "module:function" served as tools
    home: Path = Field(default_factory=lambda: Path("~/.crow").expanduser())

    @field_validator("sandbox", mode="before")
    @classmethod
    def _sandbox_alias(cls, value: Any) -> Any:
        # "bwrap" was the only value before the sandbox was on by default; None meant off.
        return {"bwrap": "workspace", None: "off", False: "off"}.get(value, value)

    @property
    def db_path(self) -> Path:
        return self.home / "crow.db"

    def providers_settings(self) -> dict[str, Any]:
        from crow.llm.registry import ProviderSettings

        return {
            name: ProviderSettings(**entry.model_dump(exclude_unset=True))
            for name, entry in self.providers.items()
        }

    def models_settings(self) -> dict[str, Any]:
        from crow.llm.registry import ModelSettings

        return {
            ref: ModelSettings(**entry.model_dump(exclude_unset=True))
            for ref, entry in self.model_settings.items()
        }

    def model_choices(self) -> list[str]:
        seen = [self.model] if self.model else []
        return list(dict.fromkeys([*seen, *self.models]))


def find_config_file(explicit: str | None, cwd: Path, home: Path) -> Path | None:
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        return path
    for candidate in (cwd / "crow.yaml", home / "config.yaml"):
        if candidate.is_file():
            return candidate
    return None


def load_config(
    explicit: str | None = None, *, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> Config:
    env = os.environ if env is None else env
    home = Path(env.get("CROW_HOME") or "~/.crow").expanduser()
    data: dict[str, Any] = {}
    path = find_config_file(explicit, cwd or Path.cwd(), home)
    if path is not None:
        import yaml

        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        data.update(loaded)
    data["home"] = home
    for var, key in (
        ("CROW_MODEL", "model"),
        ("CROW_TRACE", "trace"),
        ("CROW_MODE", "mode"),
        ("CROW_SANDBOX", "sandbox"),
    ):
        if env.get(var):
            data[key] = env[var]
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        where = f" in {path}" if path else ""
        raise ConfigError(f"invalid configuration{where}: {exc}") from exc


NO_MODEL_MESSAGE = (
    "No model is configured. Set CROW_MODEL=provider:model (for example "
    "`openai:gpt-4.1-mini` with OPENAI_API_KEY, `anthropic:claude-sonnet-4-5` with "
    "ANTHROPIC_API_KEY, or `ollama:qwen3:8b` for a local Ollama), or put `model:` in "
    "crow.yaml or ~/.crow/config.yaml."
)
