"""Peers (only with --peers): other Python ACP agents, each in a throwaway venv under
~/.cache/crow-bench, pointed at the same scripted model as crow. Figures: spawn ->
initialize, and spawn -> initialize + session/new + first prompt answered, with crow
measured in the same run as the baseline. A peer that cannot run says why.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    CROW_CMD,
    Ctx,
    Figure,
    agent_env,
    describe,
    initialize,
    median,
    ms,
    not_measured,
    prompt_text,
    spawn,
    stderr_tail,
)

G = "peers"
CACHE = Path("~/.cache/crow-bench").expanduser()
PY312 = "/root/.pyenv/versions/3.12.1/bin/python"
PY313 = "/root/.pyenv/versions/3.13.0/bin/python"


class NotRunnable(Exception):
    pass


@dataclass
class Peer:
    name: str
    python: str
    requirement: str
    launch: Callable[[Path, Path, Any], tuple[list[str], dict[str, str]]]  # (venv, home, llm)

    def venv(self) -> Path:
        venv = CACHE / self.name
        if not (venv / ".installed").exists():
            CACHE.mkdir(parents=True, exist_ok=True)
            subprocess.run([self.python, "-m", "venv", str(venv)], check=True)
            log = CACHE / f"{self.name}.log"
            try:
                with open(log, "w") as out:
                    rc = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", self.requirement],
                                        stdout=out, stderr=subprocess.STDOUT, timeout=1200).returncode
            except subprocess.TimeoutExpired as exc:
                raise NotRunnable(f"pip install {self.requirement} took over 20 min") from exc
            if rc:
                raise NotRunnable(f"pip install {self.requirement} failed (see {log})")
            (venv / ".installed").touch()
        return venv


def _fast_agent(venv: Path, home: Path, llm: Any) -> tuple[list[str], dict[str, str]]:
    # fast-agent reads fastagent.config.yaml from its cwd; `generic` is its
    # OpenAI-compatible provider (meant for Ollama), model "generic.<name>".
    (home / "fastagent.config.yaml").write_text(
        f"default_model: generic.scripted\ngeneric:\n  api_key: x\n  base_url: {llm.base_url}\n"
        "logger:\n  type: none\n  progress_display: false\n")
    return [str(venv / "bin" / "fast-agent-acp"), "--model", "generic.scripted"], agent_env(home, llm)


def _kimi(venv: Path, home: Path, llm: Any) -> tuple[list[str], dict[str, str]]:
    kimi_home = home / ".kimi"
    kimi_home.mkdir(exist_ok=True)
    (kimi_home / "config.toml").write_text(
        'default_model = "scripted"\n\n[providers.scripted]\ntype = "openai_legacy"\n'
        f'base_url = "{llm.base_url}"\napi_key = "x"\n\n[models.scripted]\nprovider = "scripted"\n'
        'model = "scripted"\nmax_context_size = 128000\n')
    (kimi_home / "credentials").mkdir(exist_ok=True)
    (kimi_home / "credentials" / "kimi-code.json").write_text('{"access_token": "dummy"}')
    return [str(venv / "bin" / "kimi"), "acp"], agent_env(home, llm, HOME=str(home))


def _deepagents(venv: Path, home: Path, llm: Any) -> tuple[list[str], dict[str, str]]:
    raise NotRunnable("deepagents-acp talks to `openai:` models through the Responses API "
                      "(/v1/responses); the scripted server implements only /chat/completions "
                      "and /messages")


PEERS = [
    Peer("fast-agent", PY312, "fast-agent-mcp==0.10.46", _fast_agent),
    Peer("kimi", PY313, "kimi-cli==1.50.0", _kimi),
    Peer("deepagents", PY312, "deepagents-acp", _deepagents),
]


async def _first_prompt(ctx: Ctx, cmd: list[str], env: dict[str, str], home: Path) -> tuple[float, float]:
    t0 = time.perf_counter()
    async with spawn(cmd, env, home) as (conn, _proc, client):
        await initialize(conn)
        init = time.perf_counter() - t0
        session = await conn.new_session(cwd=str(home), mcp_servers=[])
        reply = await prompt_text(conn, session.session_id, "hello")
        total = time.perf_counter() - t0
        if reply.stop_reason != "end_turn" or "ok" not in client.text():
            raise RuntimeError(f"first prompt ended {reply.stop_reason}: {stderr_tail(home)}")
    return init, total


async def run(ctx: Ctx) -> list[Figure]:
    from tests.llm_server import Reply, ScriptedLLM

    n = ctx.reps(5, 2)
    figures: list[Figure] = []
    with ScriptedLLM(default=Reply(text="ok")) as llm:
        for peer in PEERS:
            label = f"{peer.name}: spawn -> first prompt"
            try:
                venv = peer.venv()
                home = ctx.home(peer.name)
                cmd, env = peer.launch(venv, home, llm)
                await _first_prompt(ctx, cmd, env, home)  # warm-up, and does it work at all
                theirs, ours = [], []
                for _ in range(n):
                    crow_home = ctx.home("crow")
                    ours.append(await _first_prompt(ctx, CROW_CMD, agent_env(crow_home, llm), crow_home))
                    theirs.append(await _first_prompt(ctx, cmd, env, home))
            except NotRunnable as exc:
                figures.append(not_measured(G, label, str(exc)))
                continue
            except Exception as exc:
                figures.append(not_measured(G, label, describe(exc)[:400]))
                continue
            figures += [
                Figure(G, f"{peer.name}: spawn -> initialize", ms(median([t[0] for t in theirs])),
                       baseline=ms(median([t[0] for t in ours])), baseline_name="crow", samples=n),
                Figure(G, label, ms(median([t[1] for t in theirs])),
                       baseline=ms(median([t[1] for t in ours])), baseline_name="crow", samples=n),
            ]
    return figures
