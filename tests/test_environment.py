"""The environment policy (crow/environment.py): what processes started for the model inherit."""

from __future__ import annotations

import pytest

from crow.config import Config, EnvironmentPolicy, ProviderSettings
from crow.environment import (
    child_environment,
    compute_environment,
    is_secret,
    provider_key_variables,
)

PARENT = {
    "PATH": "/usr/bin",
    "HOME": "/home/u",
    "LANG": "C.UTF-8",
    "LC_ALL": "C",
    "EDITOR": "vi",
    "AWS_REGION": "eu-west-1",
    "OPENAI_API_KEY": "sk-1",
    "GITHUB_TOKEN": "ghp",
    "db_password": "hunter2",
    "SSH_AUTH_SOCK": "/tmp/agent",
    "MY_PRIVATE_THING": "p",
    "CLIENT_SECRET": "s",
    "NPM_CONFIG_PASSWD": "x",
    "GOOGLE_APPLICATION_CREDENTIALS": "/k.json",
    "MYLLM": "custom-key-value",  # no marker: a secret only because a provider names it
}
SECRETS = {
    "OPENAI_API_KEY",
    "GITHUB_TOKEN",
    "db_password",
    "SSH_AUTH_SOCK",
    "MY_PRIVATE_THING",
    "CLIENT_SECRET",
    "NPM_CONFIG_PASSWD",
    "GOOGLE_APPLICATION_CREDENTIALS",
}


def policy(**kw: object) -> EnvironmentPolicy:
    return EnvironmentPolicy.model_validate(kw)


def test_default_drops_every_secret_looking_name_and_keeps_the_rest() -> None:
    env = compute_environment(policy(), PARENT)
    assert not SECRETS & env.keys()
    assert env == {k: v for k, v in PARENT.items() if k not in SECRETS}


def test_provider_key_variables_are_secrets_even_without_a_marker() -> None:
    config = Config(providers={"mine": ProviderSettings(kind="openai", api_key_env="MYLLM")})
    names = provider_key_variables(config)
    assert {"MYLLM", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY"} <= names
    assert "MYLLM" not in compute_environment(config.environment, PARENT, names)
    assert "MYLLM" in compute_environment(config.environment, PARENT, provider_key_variables(None))
    # a configured provider without api_key_env: the NAME_API_KEY crow would read
    assert "MY_CORP_API_KEY" in provider_key_variables(Config(providers={"my-corp": ProviderSettings()}))


def test_inherit_core_keeps_the_documented_list_only() -> None:
    env = compute_environment(policy(inherit="core"), PARENT)
    assert env == {"PATH": "/usr/bin", "HOME": "/home/u", "LANG": "C.UTF-8", "LC_ALL": "C"}


def test_inherit_none_keeps_only_set() -> None:
    assert compute_environment(policy(inherit="none", set={"PATH": "/bin"}), PARENT) == {"PATH": "/bin"}


def test_exclude_and_include_only_are_globs_over_names() -> None:
    env = compute_environment(policy(exclude=["AWS_*", "LC_?LL"]), PARENT)
    assert "AWS_REGION" not in env and "LC_ALL" not in env and "EDITOR" in env
    env = compute_environment(policy(include_only=["PATH", "L*"]), PARENT)
    assert env == {"PATH": "/usr/bin", "LANG": "C.UTF-8", "LC_ALL": "C"}
    # case matters: environment names are case-sensitive
    assert compute_environment(policy(include_only=["path"]), PARENT) == {}


def test_include_only_cannot_readmit_a_secret_but_set_can_set_anything() -> None:
    env = compute_environment(policy(include_only=["*"]), PARENT, {"MYLLM"})
    assert not (SECRETS | {"MYLLM"}) & env.keys()
    env = compute_environment(policy(include_only=["OPENAI_API_KEY"], set={"DEPLOY_TOKEN": "t"}), PARENT)
    assert env == {"DEPLOY_TOKEN": "t"}


def test_set_wins_over_exclude_and_inherit() -> None:
    env = compute_environment(policy(inherit="core", exclude=["PATH"], set={"PATH": "/opt/bin"}), PARENT)
    assert env["PATH"] == "/opt/bin"


@pytest.mark.parametrize(
    "name",
    ["api_key", "X_AUTH", "OAUTH_STUFF", "SessionToken", "PRIVATE", "MY_CREDENTIALS", "PGPASSWORD"],
)
def test_secret_markers_match_anywhere_and_in_any_case(name: str) -> None:
    assert is_secret(name)


@pytest.mark.parametrize("name", ["PATH", "HOME", "EDITOR", "PYTHONPATH", "TERM"])
def test_ordinary_names_are_not_secrets(name: str) -> None:
    assert not is_secret(name)


def test_child_environment_is_cached_per_config_and_read_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CROW_TEST_SECRET_TOKEN", "x")
    monkeypatch.setenv("CROW_TEST_VISIBLE", "y")
    config = Config(environment=EnvironmentPolicy(set={"A": "1"}))
    env = child_environment(config)
    assert child_environment(config) is env
    assert env["A"] == "1" and env["CROW_TEST_VISIBLE"] == "y" and "CROW_TEST_SECRET_TOKEN" not in env
    with pytest.raises(TypeError):
        env["B"] = "2"  # type: ignore[index]
    other = Config()
    assert child_environment(other) is not env and "A" not in child_environment(other)
    assert "CROW_TEST_SECRET_TOKEN" not in child_environment()


def test_config_file_environment_section_reaches_the_policy(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from crow.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text("environment:\n  inherit: core\n  exclude: ['LC_*']\n  set: {PAGER: cat}\n")
    config = load_config(str(path), env={"CROW_HOME": str(tmp_path)})
    env = compute_environment(config.environment, PARENT)
    assert env == {"PATH": "/usr/bin", "HOME": "/home/u", "LANG": "C.UTF-8", "PAGER": "cat"}


def test_an_editor_terminal_command_starts_from_exactly_the_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The editor's terminal adds variables to the editor's environment and cannot drop
    any: the command itself unsets what the policy leaves out."""
    import os
    import subprocess

    from builtin_hooks.filesystem import terminal_command

    monkeypatch.setenv("EDITOR_SIDE_API_KEY", "sk-editor")
    monkeypatch.setenv("KEEP_ME", "kept")
    config = Config(environment=EnvironmentPolicy(inherit="core", set={"EXTRA": "x y"}))
    env = compute_environment(config.environment, dict(os.environ))
    command, passed = terminal_command("env", env)
    # what an editor does: its own environment plus the variables it is given
    out = subprocess.run(
        ["/bin/sh", "-c", command], env={**os.environ, **passed}, capture_output=True, text=True
    ).stdout
    names = {line.split("=", 1)[0] for line in out.splitlines() if "=" in line}
    assert "EXTRA=x y" in out and "PATH" in names
    assert "EDITOR_SIDE_API_KEY" not in names and "KEEP_ME" not in names
    assert names <= set(env) | {"PWD", "SHLVL", "_", "OLDPWD"}, names - set(env)
    assert terminal_command("ls", None) == ("ls", {})


@pytest.mark.parametrize("bad", [{"A=B": "x"}, {"": "x"}, {"A": "x\0y"}])
def test_an_invalid_set_is_a_clear_configuration_error(tmp_path, bad: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    import yaml

    from crow.config import load_config
    from crow.errors import ConfigError

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"environment": {"set": bad}}))
    with pytest.raises(ConfigError, match=r"environment\.set"):
        load_config(str(path), env={"CROW_HOME": str(tmp_path)})


def test_the_store_url_is_a_secret_it_may_hold_a_database_password() -> None:
    assert is_secret("CROW_STORE")
    parent = {**PARENT, "CROW_STORE": "postgresql://crow:hunter2@db/crow", "CROW_HOME": "/h"}
    env = compute_environment(policy(include_only=["CROW_*"]), parent)
    assert env == {"CROW_HOME": "/h"}
