"""Provider references (`provider:model`) to configured `Provider` objects.

Import-cheap on purpose: the provider modules (and httpx2) load only when a provider is
created, so crow can answer ACP `initialize` without them. Providers and models are
described by the configuration's own models (`crow.config.ProviderSettings`,
`ModelSettings`): the builtins below are entries like the ones a config file holds.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from crow.config import ModelSettings, ProviderSettings
from crow.credentials import stored_key
from crow.errors import ConfigError
from crow.llm.base import Provider

__all__ = [
    "BUILTIN_PROVIDERS",
    "ModelSettings",
    "ProviderSettings",
    "create_provider",
    "default_accepts_images",
    "default_context_window",
    "endpoint",
    "list_known_providers",
]


def _builtin(
    kind: Literal["openai", "anthropic"], base_url: str, base_url_env: str | None, api_key_env: str
) -> ProviderSettings:
    return ProviderSettings(kind=kind, base_url=base_url, base_url_env=base_url_env, api_key_env=api_key_env)


BUILTIN_PROVIDERS: Mapping[str, ProviderSettings] = {
    "openai": _builtin("openai", "https://api.openai.com/v1", "OPENAI_BASE_URL", "OPENAI_API_KEY"),
    "anthropic": _builtin(
        "anthropic", "https://api.anthropic.com", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"
    ),
    "openrouter": _builtin("openai", "https://openrouter.ai/api/v1", None, "OPENROUTER_API_KEY"),
    "ollama": _builtin("openai", "http://localhost:11434/v1", "OLLAMA_BASE_URL", "OLLAMA_API_KEY"),
    "llamacpp": _builtin("openai", "http://localhost:8080/v1", "LLAMACPP_BASE_URL", "LLAMACPP_API_KEY"),
    "vllm": _builtin("openai", "http://localhost:8000/v1", "VLLM_BASE_URL", "VLLM_API_KEY"),
    "lmstudio": _builtin("openai", "http://localhost:1234/v1", "LMSTUDIO_BASE_URL", "LMSTUDIO_API_KEY"),
}

# First match wins, so more specific prefixes come first. Names are matched after any
# "vendor/" prefix (OpenRouter) and lower-cased.
_CONTEXT_WINDOWS: tuple[tuple[str, int], ...] = (
    (r"gpt-4\.1", 1_047_576),
    (r"gpt-4o|gpt-4-turbo|chatgpt-4o", 128_000),
    (r"gpt-5", 400_000),
    (r"o[134](-|$)", 200_000),
    (r"gpt-3\.5", 16_385),
    (r"claude", 200_000),
    (r"gemini", 1_048_576),
    (r"qwen3-coder", 262_144),
    (r"qwen3", 40_960),
    (r"qwen", 32_768),
    (r"llama-?3\.[123]|llama-?4", 131_072),
    (r"llama", 8_192),
    (r"(mistral|ministral|devstral|codestral)-?(large|small|medium|nemo)?", 131_072),
    (r"mixtral|mistral", 32_768),
    (r"deepseek", 128_000),
    (r"gemma-?3", 131_072),
    (r"gemma", 8_192),
    (r"phi-?4", 16_384),
    (r"kimi|glm-4\.[56]|gpt-oss", 131_072),
)


def default_context_window(model: str) -> int:
    name = model.lower().rsplit("/", 1)[-1]
    for pattern, window in _CONTEXT_WINDOWS:
        if re.match(pattern, name):
            return window
    return 128_000


# Model families known to take text only; a name with an image marker (`vl`, `vision`, ...)
# is an image variant of one. Any other model is taken to accept images, as crow has always
# sent prompt images to every model: `model_settings.REF.images` says otherwise.
_TEXT_ONLY = re.compile(
    r"gpt-3\.5|o1-mini|o3-mini|deepseek|qwen|codestral|mixtral|gpt-oss|kimi|glm-4\.[56](?!v)"
    r"|llama-?[23]|codellama|phi-?[34]|starcoder"
)
_IMAGE_MARKER = re.compile(r"vl\b|vl-|vision|llava|pixtral|multimodal|omni")


def default_accepts_images(model: str) -> bool:
    name = model.lower().rsplit("/", 1)[-1]
    return bool(_IMAGE_MARKER.search(name)) or not _TEXT_ONLY.match(name)


def list_known_providers(providers: Mapping[str, ProviderSettings] | None = None) -> list[str]:
    return sorted({*BUILTIN_PROVIDERS, *(providers or {})})


def _resolve(name: str, providers: Mapping[str, ProviderSettings] | None) -> ProviderSettings:
    builtin = BUILTIN_PROVIDERS.get(name)
    configured = (providers or {}).get(name)
    if builtin is None and configured is None:
        raise ConfigError(
            f"unknown provider {name!r}; known providers: {', '.join(list_known_providers(providers))}"
        )
    if builtin is None:
        assert configured is not None
        return configured
    return builtin.merged(configured) if configured is not None else builtin


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a provider's requests go and the key they carry ("" for none)."""

    name: str
    settings: ProviderSettings
    kind: Literal["openai", "anthropic"]
    base_url: str
    key_env: str  # the variable to set
    api_key: str

    @property
    def needs_key(self) -> bool:
        """A hosted API (a local server may need no key)."""
        return any(host in self.base_url for host in PUBLIC_HOSTS)


PUBLIC_HOSTS = ("api.openai.com", "api.anthropic.com")


def endpoint(
    name: str,
    providers: Mapping[str, ProviderSettings] | None = None,
    env: Mapping[str, str] | None = None,
    home: str | os.PathLike[str] | None = None,
) -> Endpoint:
    """Provider `name` resolved: its base URL (the `base_url_env` variable first) and its key,
    from the config file, else its variable in `env`, else `crow login`'s store in `home`
    (only for the base URL it was stored for)."""
    env = os.environ if env is None else env
    settings = _resolve(name, providers)
    kind = settings.kind or "openai"
    if kind not in ("openai", "anthropic"):
        raise ConfigError(f"provider {name!r}: kind must be 'openai' or 'anthropic', not {kind!r}")
    base_url = (settings.base_url_env and env.get(settings.base_url_env)) or settings.base_url
    if not base_url:
        raise ConfigError(f"provider {name!r} needs a base_url")
    key_env = settings.api_key_env or f"{name.upper().replace('-', '_')}_API_KEY"
    # "" tells the provider not to consult os.environ itself: `env` is the only source
    api_key = settings.api_key or env.get(key_env) or stored_key(home, name, base_url) or ""
    return Endpoint(name, settings, kind, base_url, key_env, api_key)


def create_provider(
    ref: str,
    *,
    providers: Mapping[str, ProviderSettings] | None = None,
    models: Mapping[str, ModelSettings] | None = None,
    env: Mapping[str, str] | None = None,
    home: str | os.PathLike[str] | None = None,
) -> Provider:
    """Build the provider for `provider:model`, e.g. `ollama:qwen3:8b` (split at the first colon).

    `models` is looked up by the whole ref first, then by the model name. A missing API key
    is not an error here: the first call reports it, naming the variable to set. `home`
    (CROW_HOME) is where `crow login` stored keys; None reads none.
    """
    name, sep, model = ref.partition(":")
    if not sep or not name or not model:
        raise ConfigError(f"model reference {ref!r} must look like provider:model, e.g. openai:gpt-4.1-mini")
    point = endpoint(name, providers, env, home)
    settings, kind, base_url = point.settings, point.kind, point.base_url
    model_settings = (models or {}).get(ref) or (models or {}).get(model) or ModelSettings()
    kwargs: dict[str, Any] = {
        "base_url": base_url,
        "api_key": point.api_key,
        "api_key_env": point.key_env,
        "name": name,
        "context_window": model_settings.context_window or default_context_window(model),
        "temperature": model_settings.temperature,
        "reasoning_effort": model_settings.reasoning_effort,
        "accepts_images": (
            default_accepts_images(model) if model_settings.images is None else model_settings.images
        ),
        "headers": dict(settings.headers),
    }
    for key in ("connect_timeout", "read_timeout", "max_retries"):
        if (value := getattr(settings, key)) is not None:
            kwargs[key] = value
    if model_settings.max_tokens is not None:
        kwargs["max_tokens"] = model_settings.max_tokens
    if kind == "anthropic":
        from crow.llm.anthropic import AnthropicProvider

        reasoning = model_settings.reasoning
        return AnthropicProvider(
            model,
            thinking_budget=model_settings.thinking_budget,
            level_budgets=reasoning.budgets if reasoning is not None else None,
            **kwargs,
        )
    from crow.llm.openai import OpenAIProvider

    return OpenAIProvider(model, **kwargs)
