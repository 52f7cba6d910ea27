"""`crow login` and `crow logout`: a provider API key kept in CROW_HOME (`crow.credentials`).

    crow login                       pick a provider, paste the key (not echoed)
    crow login --provider openai --key-stdin < key.txt      for scripts
    crow login --provider openai --base-url http://host:8000/v1   an OpenAI-compatible server
    crow logout                      forget every stored key

The key is checked with one cheap request (the provider's model list) before it is stored;
a key the provider refuses (401/403) is not stored. It is stored for that base URL only, and
the provider's environment variable still wins over it. Prompts and messages go to stderr;
the key is never printed.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from crow import credentials
from crow.errors import ConfigError

if TYPE_CHECKING:
    from crow.config import Config
    from crow.llm.registry import Endpoint

VERIFY_TIMEOUT = 15.0
COMPATIBLE = "an OpenAI-compatible server (its base URL)"


def main(args: argparse.Namespace) -> int:
    from crow.config import load_config

    config = load_config(args.config)
    if args.command == "logout":
        forgot = credentials.forget(config.home)
        print("forgot the stored API keys" if forgot else "no API keys were stored", file=sys.stderr)
        return 0
    return login(config, args.provider, args.base_url, args.key_stdin, args.no_verify)


def login(
    config: Config, provider: str | None, base_url: str | None, key_stdin: bool, no_verify: bool
) -> int:
    from crow.llm.registry import endpoint, list_known_providers

    if provider is None:
        if key_stdin:
            raise ConfigError("--key-stdin needs --provider")
        provider, base_url = _ask_provider(config, list_known_providers(config.providers), base_url)
    point = endpoint(provider, config.providers)
    if base_url:
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"--base-url must start with http:// or https://, not {base_url!r}")
        point = _at(point, base_url)
    key = credentials.check_key(sys.stdin.readline() if key_stdin else _ask_key(point))
    if not no_verify:
        problem = verify(point, key)
        if problem:
            print(f"crow: {problem}; nothing stored", file=sys.stderr)
            return 1
    path = credentials.store(config.home, point.name, point.base_url, key)
    print(
        f"stored the {point.name} key for {point.base_url} in {path} (readable by you only)", file=sys.stderr
    )
    if os.environ.get(point.key_env):
        print(f"note: {point.key_env} is set here, and wins over the stored key", file=sys.stderr)
    return 0


def _at(point: Endpoint, base_url: str) -> Endpoint:
    from dataclasses import replace

    return replace(point, base_url=base_url.rstrip("/"))


def _ask_provider(config: Config, known: list[str], base_url: str | None) -> tuple[str, str | None]:
    default = (config.model or "openai:").partition(":")[0]
    choices = [
        "openai",
        "anthropic",
        *(n for n in known if n in config.providers and n not in ("openai", "anthropic")),
    ]
    print("Which provider is the key for?", file=sys.stderr)
    for i, name in enumerate([*choices, COMPATIBLE], 1):
        print(f"  {i}) {name}", file=sys.stderr)
    answer = _input(f"Provider [{default}]: ").strip() or default
    if answer.isdigit() and 1 <= int(answer) <= len(choices) + 1:
        answer = ([*choices, "compatible"])[int(answer) - 1]
    if answer == "compatible":
        url = base_url or _input("Base URL (e.g. http://localhost:8000/v1): ").strip()
        return "openai", url
    if answer not in known:
        raise ConfigError(f"unknown provider {answer!r}; known providers: {', '.join(known)}")
    return answer, base_url


def _input(prompt: str) -> str:
    print(prompt, end="", file=sys.stderr, flush=True)
    line = sys.stdin.readline()
    if not line:
        raise ConfigError("no answer (end of input)")
    return line


def _ask_key(point: Endpoint) -> str:
    import getpass

    return getpass.getpass(f"API key for {point.name} ({point.base_url}), not shown: ", stream=sys.stderr)


def verify(point: Endpoint, key: str) -> str | None:
    """One request listing the models with `key`: None when the server accepts it, else why not."""
    import httpx

    from crow.llm.http import tls_context

    headers = dict(point.settings.headers)
    if point.kind == "anthropic":
        from crow.llm.anthropic import API_VERSION

        url = f"{point.base_url}/v1/models"
        headers.update({"x-api-key": key, "anthropic-version": API_VERSION})
    else:
        url = f"{point.base_url}/models"
        headers["Authorization"] = f"Bearer {key}"
    try:
        with httpx.Client(timeout=VERIFY_TIMEOUT, verify=tls_context(point.base_url)) as client:
            status = client.get(url, headers=headers).status_code
    except httpx.HTTPError as exc:
        return (
            f"could not reach {url} to check the key ({type(exc).__name__}); --no-verify stores it unchecked"
        )
    if status in (401, 403):
        return f"{point.name} refused the key (HTTP {status} from {url})"
    if not 200 <= status < 300:
        return f"could not check the key: HTTP {status} from {url}; --no-verify stores it unchecked"
    return None
