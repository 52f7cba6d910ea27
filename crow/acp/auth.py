"""ACP authentication: the methods crow offers, `authenticate` and `logout`.

- `crow-api-key` (type `agent`): `authenticate` checks that the configured model's provider
  has a key (its variable, the config file, or one `crow login` stored for its base URL) and
  answers auth_required (-32000) naming the variable to set when it has none.
- `crow-login` (type `terminal`, offered only when the client advertised `auth.terminal`):
  the client runs `crow login` in a terminal; it is never passed to `authenticate`.

`logout` forgets the keys `crow login` stored; environment variables are not crow's to unset.
"""

from __future__ import annotations

from typing import Any

from acp import RequestError
from acp.schema import AuthMethodAgent, TerminalAuthMethod

from crow import credentials
from crow.config import NO_MODEL_MESSAGE, Config
from crow.errors import ConfigError

AGENT_METHOD = "crow-api-key"
TERMINAL_METHOD = "crow-login"
AUTH_REQUIRED = -32000  # ACP's auth_required


def methods(terminal: bool) -> list[Any]:
    offered: list[Any] = [
        AuthMethodAgent(
            id=AGENT_METHOD,
            name="API key",
            description="The configured model provider's key: its environment variable "
            "(OPENAI_API_KEY, ANTHROPIC_API_KEY, ...) or one stored by `crow login`",
        )
    ]
    if terminal:
        offered.append(
            TerminalAuthMethod(
                type="terminal",
                id=TERMINAL_METHOD,
                name="Log in with an API key",
                description="Runs `crow login`: pick a provider, paste a key; it is checked, "
                "then stored in crow's home, readable by you only",
                args=["login"],
            )
        )
    return offered


def authenticate(config: Config, method_id: str) -> None:
    """Succeeds when the configured provider has a key (or needs none); raises RequestError."""
    if method_id == TERMINAL_METHOD:
        raise RequestError.invalid_params(
            {"methodId": f"{TERMINAL_METHOD} is a terminal method: run `crow login`, not authenticate"}
        )
    if method_id != AGENT_METHOD:
        raise RequestError.invalid_params(
            {"methodId": f"unknown auth method {method_id!r}; crow offers {AGENT_METHOD!r}"}
        )
    if not config.model:
        raise RequestError(AUTH_REQUIRED, NO_MODEL_MESSAGE)
    from crow.llm.registry import endpoint

    try:
        point = endpoint(config.model.partition(":")[0], config.providers, home=config.home)
    except ConfigError as exc:
        raise RequestError(AUTH_REQUIRED, f"Cannot check the key: {exc}") from exc
    if point.needs_key and not point.api_key:
        raise RequestError(
            AUTH_REQUIRED,
            f"Authentication required: no API key for {point.name}; set {point.key_env} or run `crow login`",
            {"variable": point.key_env},
        )


def logout(config: Config) -> None:
    credentials.forget(config.home)
