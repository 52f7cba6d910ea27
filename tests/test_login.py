"""`crow login` / `crow logout` and the keys they keep: checked against a real server before
they are stored, stored 0600 from the first instant, bound to the base URL they were checked
against, beaten by the environment, and never shown, logged or handed to a tool."""

from __future__ import annotations

import json
import os
import select
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path

import acp
import pytest

from crow import credentials
from crow.config import Config
from crow.environment import child_environment
from crow.errors import ConfigError
from tests.conftest import crow_env, spawn_crow
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec

GOOD = "sk-good-0123456789"
BAD = "sk-bad-9876543210"


def login_env(llm: ScriptedLLM, home: Path, **extra: str) -> dict[str, str]:
    """crow's environment with the scripted server as OpenAI's base URL and no key variable."""
    env = crow_env(llm, home, **extra)
    del env["OPENAI_API_KEY"]
    return env


def crow(
    *args: str, env: dict[str, str], stdin: str = "", umask: int | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crow", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=(lambda: os.umask(umask)) if umask is not None else None,
    )


def stored(home: Path) -> list[dict[str, str]]:
    return json.loads((home / "credentials.json").read_text())["keys"]


def test_login_checks_the_key_then_stores_it_private(llm: ScriptedLLM, home: Path) -> None:
    llm.keys = {GOOD}
    env = login_env(llm, home)
    done = crow("login", "--provider", "openai", "--key-stdin", env=env, stdin=f"  {GOOD}\n", umask=0)
    assert done.returncode == 0, done.stderr
    path = home / "credentials.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600, "0600 even under umask 0"
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stored(home) == [{"provider": "openai", "base_url": llm.base_url, "api_key": GOOD}]
    check = llm.requests[-1]
    assert (check.method, check.path, check.headers["authorization"]) == (
        "GET",
        "/v1/models",
        f"Bearer {GOOD}",
    )
    assert GOOD not in done.stdout + done.stderr and "stored the openai key" in done.stderr
    assert [p.name for p in home.iterdir() if p.name.startswith(".credentials.json-")] == []  # no temp left


def test_a_refused_key_is_not_stored(llm: ScriptedLLM, home: Path) -> None:
    llm.keys = {GOOD}
    done = crow("login", "--provider", "openai", "--key-stdin", env=login_env(llm, home), stdin=BAD + "\n")
    assert done.returncode == 1
    assert "refused the key (HTTP 401" in done.stderr and "nothing stored" in done.stderr
    assert BAD not in done.stdout + done.stderr
    assert not (home / "credentials.json").exists()


def test_a_key_that_cannot_be_checked_is_stored_only_when_asked(llm: ScriptedLLM, home: Path) -> None:
    env = login_env(llm, home, OPENAI_BASE_URL=llm.root_url + "/nothing-here")  # 404 for /models
    done = crow("login", "--provider", "openai", "--key-stdin", env=env, stdin=GOOD + "\n")
    assert done.returncode == 1 and "HTTP 404" in done.stderr and "--no-verify" in done.stderr
    assert not (home / "credentials.json").exists()
    done = crow("login", "--provider", "openai", "--key-stdin", "--no-verify", env=env, stdin=GOOD + "\n")
    assert done.returncode == 0 and stored(home)[0]["base_url"] == llm.root_url + "/nothing-here"


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["--provider", "openai", "--key-stdin"], "\n", "no key given"),
        (["--provider", "openai", "--key-stdin"], "sk-a b\n", "not an API key"),
        (["--provider", "openai", "--key-stdin"], "sk-\x1b[8mx\n", "not an API key"),
        (["--provider", "nope", "--key-stdin"], GOOD, "unknown provider 'nope'"),
        (["--key-stdin"], GOOD, "--key-stdin needs --provider"),
        (["--provider", "openai", "--base-url", "file:///etc", "--key-stdin"], GOOD, "must start with http"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_stored(
    llm: ScriptedLLM, home: Path, args: list[str], stdin: str, message: str
) -> None:
    llm.keys = {GOOD}
    done = crow("login", *args, env=login_env(llm, home), stdin=stdin)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (home / "credentials.json").exists()


def test_login_never_writes_through_a_symlink(llm: ScriptedLLM, home: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text("untouched")
    (home / "credentials.json").symlink_to(target)
    llm.keys = {GOOD}
    done = crow("login", "--provider", "openai", "--key-stdin", env=login_env(llm, home), stdin=GOOD)
    assert done.returncode == 2 and "symbolic link" in done.stderr
    assert target.read_text() == "untouched" and (home / "credentials.json").is_symlink()
    assert credentials.stored_key(home, "openai", llm.base_url) is None  # never read through it either


def test_a_file_others_could_change_is_ignored(home: Path) -> None:
    credentials.store(home, "openai", "http://h/v1", GOOD)
    assert credentials.stored_key(home, "openai", "http://h/v1/") == GOOD
    os.chmod(home / "credentials.json", 0o666)
    assert credentials.stored_key(home, "openai", "http://h/v1") is None
    (home / "credentials.json").write_text("{not json")
    os.chmod(home / "credentials.json", 0o600)
    assert credentials.stored_key(home, "openai", "http://h/v1") is None
    with pytest.raises(ConfigError):
        credentials.check_key("sk-\nHost: evil")


def test_login_replaces_only_the_same_provider_and_url_and_logout_forgets_all(home: Path) -> None:
    credentials.store(home, "openai", "http://a/v1", "k1")
    credentials.store(home, "openai", "http://b/v1", "k2")
    credentials.store(home, "openai", "http://a/v1/", "k3")
    assert credentials.stored_key(home, "openai", "http://a/v1") == "k3"
    assert credentials.stored_key(home, "openai", "http://b/v1") == "k2"
    assert credentials.stored_key(home, "anthropic", "http://a/v1") is None
    env = {"CROW_HOME": str(home), "PATH": os.environ["PATH"]}
    done = crow("logout", env=env)
    assert done.returncode == 0 and "forgot" in done.stderr and not (home / "credentials.json").exists()
    again = crow("logout", env=env)
    assert again.returncode == 0 and "no API keys were stored" in again.stderr


def test_interactive_login_does_not_echo_the_key(llm: ScriptedLLM, home: Path) -> None:
    """On a terminal (what ACP's terminal auth gives `crow login`): pick a provider by number,
    paste the key; the terminal never shows it."""
    llm.keys = {GOOD}
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "crow", "login"],
        env=login_env(llm, home),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    seen = b""

    def read_until(text: bytes) -> None:
        nonlocal seen
        deadline = time.monotonic() + 30
        while text not in seen and time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    seen += os.read(master, 4096)
                except OSError:
                    break

    read_until(b"Provider [openai]: ")
    assert b"1) openai" in seen and b"3) an OpenAI-compatible server" in seen
    os.write(master, b"1\n")
    read_until(b"not shown: ")
    os.write(master, GOOD.encode() + b"\n")
    read_until(b"readable by you only")
    assert proc.wait(30) == 0, seen.decode(errors="replace")
    os.close(master)
    assert GOOD.encode() not in seen, "the key was echoed"
    assert stored(home) == [{"provider": "openai", "base_url": llm.base_url, "api_key": GOOD}]


def test_interactive_login_for_an_openai_compatible_server(llm: ScriptedLLM, home: Path) -> None:
    llm.keys = {GOOD}
    env = {**login_env(llm, home)}
    del env["OPENAI_BASE_URL"]  # the server is named at the prompt
    done = crow("login", env=env, stdin=f"3\n{llm.base_url}/\n{GOOD}\n")  # getpass reads stdin here
    assert done.returncode == 0, done.stderr
    assert stored(home) == [{"provider": "openai", "base_url": llm.base_url, "api_key": GOOD}]


# ------------------------------------------------------------------ the stored key in use


@pytest.mark.anyio
async def test_a_stored_key_is_used_for_its_base_url_only_and_the_environment_wins(
    home: Path, workspace: Path
) -> None:
    with ScriptedLLM() as right, ScriptedLLM() as other:
        credentials.store(home, "openai", right.base_url, GOOD)
        right.keys, other.keys = {GOOD, "env-key"}, {GOOD}
        # stored for this URL: used
        async with spawn_crow(login_env(right, home)) as (conn, _p, _c):
            await conn.initialize(protocol_version=1)
            sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            assert (
                await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
            ).stop_reason == "end_turn"
        assert right.requests[-1].headers["authorization"] == f"Bearer {GOOD}"
        # OPENAI_BASE_URL now points elsewhere: the key stays home, the prompt needs auth
        async with spawn_crow(login_env(other, home)) as (conn, _p, _c):
            await conn.initialize(protocol_version=1)
            sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            with pytest.raises(acp.RequestError) as info:
                await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
        assert info.value.code == -32000
        assert other.requests and all("authorization" not in r.headers for r in other.requests)
        # the variable wins over the stored key
        async with spawn_crow(crow_env(right, home, OPENAI_API_KEY="env-key")) as (conn, _p, _c):
            await conn.initialize(protocol_version=1)
            sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            await conn.prompt(session_id=sid, prompt=[acp.text_block("hi")])
        assert right.requests[-1].headers["authorization"] == "Bearer env-key"
    assert GOOD not in "".join(p.read_text() for p in home.glob("*.log"))


@pytest.mark.anyio
async def test_a_stored_key_never_reaches_a_tool(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    credentials.store(home, "openai", llm.base_url, GOOD)
    llm.keys = {GOOD}
    env_dump = [sys.executable, "-c", "import os, json; print(json.dumps(dict(os.environ)))"]
    llm.push(
        Reply(tool_calls=[ToolCallSpec("execute", {"command": shlex.join(env_dump)})]),
        Reply(text="done"),
    )
    async with spawn_crow(login_env(llm, home, CROW_MODE="yolo", CROW_SANDBOX="off")) as (conn, _p, _c):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        await conn.prompt(session_id=sid, prompt=[acp.text_block("show the environment")])
    result = json.dumps(llm.requests[-1].messages)
    assert "PATH" in result, "the command ran"
    assert GOOD not in result
    assert GOOD not in json.dumps(dict(child_environment(Config(home=home))))
