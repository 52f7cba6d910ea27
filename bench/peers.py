"""Peers (only with --peers): other Python ACP agents, each installed from PyPI into a
throwaway venv under ~/.cache/crow-bench, measured side by side with crow in the same run,
every agent pointed at the same scripted model (bench/peer_llm.py, one process: chat
completions and the Responses API, "ok" at once).

Figures, per agent: spawn -> `initialize` answered; `session/new` (that request alone);
the first prompt's round trip (alone), and spawn -> first prompt answered (the sum: agents
defer work to different requests); a later prompt's round trip (median of >= 20, agents
interleaved prompt by prompt); peak RSS (VmHWM of the agent process) after the first
prompt. Each peer figure is given against crow; spawn -> initialize also against the bare
echo agent. A peer that cannot be installed or does not answer says why ("not run: ...").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    BENCH,
    CROW_CMD,
    ECHO_CMD,
    PY,
    Ctx,
    Figure,
    agent_env,
    describe,
    initialize,
    median,
    ms,
    prompt_text,
    serving,
    spawn,
    stderr_tail,
    vm_hwm_kb,
)

G = "peers"
CACHE = Path("~/.cache/crow-bench").expanduser()
PY312 = "/root/.pyenv/versions/3.12.1/bin/python"
PY313 = "/root/.pyenv/versions/3.13.0/bin/python"
STEP_TIMEOUT = 90.0  # seconds for one ACP request (first start of a peer compiles .pyc files)


class NotRunnable(Exception):
    pass


Launch = Callable[[Path, Path, str], tuple[list[str], dict[str, str]]]  # (venv, home, base_url)


@dataclass
class Peer:
    name: str
    python: str
    requirements: list[str]
    dist: str  # distribution name, for the version
    launch: Launch
    venv_path: Path = field(init=False)
    version: str = ""

    def __post_init__(self) -> None:
        self.venv_path = CACHE / self.name

    def venv(self) -> Path:
        """The venv, installed on first use; a venv whose pip install finished is reused."""
        venv = self.venv_path
        marker = venv / ".installed"
        if not marker.exists():
            CACHE.mkdir(parents=True, exist_ok=True)
            if not (venv / "bin" / "python").exists():
                subprocess.run([self.python, "-m", "venv", str(venv)], check=True)
            log = CACHE / f"{self.name}.log"
            try:
                with open(log, "a") as out:
                    rc = subprocess.run(
                        [str(venv / "bin" / "pip"), "install", "--quiet", *self.requirements],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        timeout=1200,
                    ).returncode
            except subprocess.TimeoutExpired as exc:
                raise NotRunnable(f"pip install {' '.join(self.requirements)} took over 20 min") from exc
            if rc:
                tail = [
                    ln
                    for ln in log.read_text(errors="replace").splitlines()
                    if ln.strip() and not ln.startswith("WARNING: Location")
                ][-2:]
                why = " / ".join(tail)[:300]
                raise NotRunnable(f"pip install {' '.join(self.requirements)} failed: {why}")
            marker.touch()
        if not self.version:
            got = subprocess.run(
                [
                    str(venv / "bin" / "python"),
                    "-c",
                    f"import importlib.metadata as m; print(m.version({self.dist!r}))",
                ],
                capture_output=True,
                text=True,
            )
            self.version = got.stdout.strip() or "?"
        return venv


def _peer_env(home: Path, base_url: str, **extra: str) -> dict[str, str]:
    """A peer's environment: HOME is the throwaway home (peers keep config and sessions
    there), the OpenAI variables point at the scripted model, no proxy for 127.0.0.1."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CROW_", "OPENAI_", "ANTHROPIC_", "PYTHON", "VIRTUAL_ENV"))
    }
    env.update(
        HOME=str(home),
        PYTHONUNBUFFERED="1",
        OPENAI_BASE_URL=base_url,
        OPENAI_API_KEY="x",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        NO_COLOR="1",
    )
    env.update(extra)
    return env


def _fast_agent(venv: Path, home: Path, base_url: str) -> tuple[list[str], dict[str, str]]:
    # fast-agent reads fastagent.config.yaml from its cwd; `generic` is its OpenAI-compatible
    # provider (meant for Ollama), models are "generic.<name>".
    (home / "fastagent.config.yaml").write_text(
        f"default_model: generic.scripted\ngeneric:\n  api_key: x\n  base_url: {base_url}\n"
        "logger:\n  type: none\n  level: error\n  progress_display: false\n  show_chat: false\n"
        "  show_tools: false\n"
    )
    env = _peer_env(home, base_url, GENERIC_BASE_URL=base_url, GENERIC_API_KEY="x")
    return [str(venv / "bin" / "fast-agent-acp"), "--model", "generic.scripted"], env


def _kimi(venv: Path, home: Path, base_url: str) -> tuple[list[str], dict[str, str]]:
    kimi_home = home / ".kimi"
    kimi_home.mkdir(exist_ok=True)
    (kimi_home / "config.toml").write_text(
        'default_model = "scripted"\n\n[providers.scripted]\ntype = "openai_legacy"\n'
        f'base_url = "{base_url}"\napi_key = "x"\n\n[models.scripted]\nprovider = "scripted"\n'
        'model = "scripted"\nmax_context_size = 128000\n'
    )
    (kimi_home / "credentials").mkdir(exist_ok=True)
    (kimi_home / "credentials" / "kimi-code.json").write_text('{"access_token": "dummy"}')
    return [str(venv / "bin" / "kimi"), "acp"], _peer_env(home, base_url)


def _deepagents(venv: Path, home: Path, base_url: str) -> tuple[list[str], dict[str, str]]:
    # `openai:` models go through langchain-openai's Responses API (/v1/responses),
    # which bench/peer_llm.py serves.
    env = _peer_env(home, base_url, OPENAI_API_BASE=base_url)
    return [str(venv / "bin" / "python"), "-m", "deepagents_acp"], env


PEERS = [
    Peer("fast-agent", PY312, ["fast-agent-mcp==0.10.46"], "fast-agent-mcp", _fast_agent),
    Peer("kimi", PY313, ["kimi-cli==1.50.0"], "kimi-cli", _kimi),
    # deepagents-acp does not depend on langchain-openai, which its `openai:` model needs
    Peer("deepagents", PY313, ["deepagents-acp", "langchain-openai"], "deepagents-acp", _deepagents),
]


# ---------------------------------------------------------------- agents


@dataclass
class Agent:
    name: str
    make: Callable[[Path], tuple[list[str], dict[str, str]]]  # home -> (cmd, env)
    cold: list[dict[str, float]] = field(default_factory=list)
    steady: list[float] = field(default_factory=list)
    failed: str = ""


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                kids = Path(f"/proc/{p}/task/{task}/children").read_text().split()
                out += map(int, kids)
                todo += map(int, kids)
        except OSError:
            pass
    return out


def _kill(pids: list[int]) -> None:
    for pid in pids:  # only the agent's own children, by id, if they outlived it
        with contextlib.suppress(OSError):
            os.kill(pid, 9)


async def _step(what: str, aw: Any, home: Path, proc: Any) -> Any:
    try:
        return await asyncio.wait_for(aw, STEP_TIMEOUT)
    except TimeoutError as exc:
        why = f"{what}: no answer in {STEP_TIMEOUT:.0f} s; stderr: {stderr_tail(home, 300)}"
        raise RuntimeError(why) from exc
    except Exception as exc:
        await asyncio.sleep(0.1)  # let an exit be reaped
        code = "" if proc.returncode is None else f" (agent exited with code {proc.returncode})"
        raise RuntimeError(f"{what}: {describe(exc)[:200]}{code}; stderr: {stderr_tail(home, 300)}") from exc


def _check(reply: Any, client: Any, home: Path, what: str) -> None:
    text = client.text()
    if reply.stop_reason != "end_turn" or "ok" not in text:
        raise RuntimeError(
            f"{what} ended {reply.stop_reason} with text {text[:80]!r}; stderr: {stderr_tail(home, 300)}"
        )


async def _cold(ctx: Ctx, agent: Agent, *, full: bool = True) -> dict[str, float]:
    """One fresh process: spawn -> initialize, session/new alone, first prompt alone, VmHWM."""
    home = ctx.home(agent.name)
    cmd, env = agent.make(home)
    out: dict[str, float] = {}
    kids: list[int] = []
    try:
        t0 = time.perf_counter()
        async with spawn(cmd, env, home) as (conn, proc, client):
            try:
                await _step("initialize", initialize(conn), home, proc)
                out["init"] = time.perf_counter() - t0
                if full:
                    t1 = time.perf_counter()
                    session = await _step(
                        "session/new", conn.new_session(cwd=str(home), mcp_servers=[]), home, proc
                    )
                    t2 = time.perf_counter()
                    reply = await _step(
                        "first prompt", prompt_text(conn, session.session_id, "hello"), home, proc
                    )
                    t3 = time.perf_counter()
                    _check(reply, client, home, "first prompt")
                    out.update(new=t2 - t1, first=t3 - t2, total=t3 - t0)
                    kids = _descendants(proc.pid)
                    out["hwm"] = (vm_hwm_kb(proc.pid) or 0) / 1024
                    out["kids_hwm"] = sum(vm_hwm_kb(k) or 0 for k in kids) / 1024
                    out["kids"] = len(kids)
            finally:
                kids = kids or _descendants(proc.pid)
    finally:
        _kill(kids)
    return out


async def _steady(ctx: Ctx, agents: list[Agent], warm: int, n: int) -> None:
    """All agents alive at once; prompt i goes to each in a rotating order."""
    pids: list[int] = []
    try:
        await _steady_in(ctx, agents, warm, n, pids)
    finally:
        _kill(pids)


async def _steady_in(ctx: Ctx, agents: list[Agent], warm: int, n: int, pids: list[int]) -> None:
    async with contextlib.AsyncExitStack() as stack:
        live = []
        for agent in agents:
            home = ctx.home(agent.name)
            cmd, env = agent.make(home)
            try:
                conn, proc, client = await stack.enter_async_context(spawn(cmd, env, home))
                await _step("initialize", initialize(conn), home, proc)
                session = await _step(
                    "session/new", conn.new_session(cwd=str(home), mcp_servers=[]), home, proc
                )
                live.append((agent, conn, session.session_id, client, home, proc))
            except Exception as exc:
                agent.failed = agent.failed or f"steady run: {describe(exc)[:300]}"
        for i in range(warm + n):
            k = i % len(live) if live else 0
            for agent, conn, sid, client, home, proc in live[k:] + live[:k]:
                if agent.failed:
                    continue
                try:
                    t0 = time.perf_counter()
                    reply = await _step(f"prompt {i}", prompt_text(conn, sid, f"prompt {i}"), home, proc)
                    dt = time.perf_counter() - t0
                    _check(reply, client, home, f"prompt {i}")
                except Exception as exc:
                    agent.failed = f"steady run: {describe(exc)[:300]}"
                    continue
                if i >= warm:
                    agent.steady.append(dt)
        for *_rest, proc in live:  # killed (if still alive) after the agents are closed
            pids += _descendants(proc.pid)


# ---------------------------------------------------------------- figures


def _not_run(name: str, reason: str, what: str = "all figures") -> Figure:
    return Figure(G, f"{name}: {what}", None, note=f"not run: {reason}")


def _figures(agent: Agent, crow: Agent, echo_init: float, label: str) -> list[Figure]:
    is_crow = agent is crow
    vs = {} if is_crow else {"baseline_name": "crow"}

    def fig(name: str, key: str, unit: str = "ms", **kw: Any) -> Figure:
        mine = [r[key] for r in agent.cold]
        theirs = [r[key] for r in crow.cold]
        conv = ms if unit == "ms" else float
        base = {} if is_crow else {"baseline": conv(median(theirs))}
        return Figure(
            G, f"{label}: {name}", conv(median(mine)), unit, samples=len(mine), **{**vs, **base, **kw}
        )

    init = fig("spawn -> initialize", "init")
    out = [
        init,
        Figure(
            G,
            f"{label}: spawn -> initialize",
            init.value,
            baseline=ms(echo_init),
            baseline_name="echo agent",
            samples=init.samples,
        ),
    ]
    if is_crow:
        out = out[1:]
    out += [
        fig("session/new", "new"),
        fig("first prompt round trip", "first"),
        fig("spawn -> first prompt answered", "total"),
    ]
    if agent.steady and crow.steady:
        out.append(
            Figure(
                G,
                f"{label}: later prompt round trip",
                ms(median(agent.steady)),
                samples=len(agent.steady),
                **({} if is_crow else {"baseline": ms(median(crow.steady)), "baseline_name": "crow"}),
            )
        )
    else:
        out.append(_not_run(label, agent.failed or "no samples", "later prompt round trip"))
    kids = max(r["kids"] for r in agent.cold)
    note = (
        f"plus {kids:.0f} child process(es), {median([r['kids_hwm'] for r in agent.cold]):.0f} MB "
        "VmHWM together"
        if kids
        else ""
    )
    out.append(fig("peak RSS after first prompt", "hwm", "MB", note=note))
    return out


async def run(ctx: Ctx) -> list[Figure]:
    reps = ctx.reps(6, 3)
    warm, n = 5, ctx.reps(60, 20)
    figures: list[Figure] = []
    ready: list[tuple[Peer, Agent]] = []
    for peer in PEERS:  # install (or reuse) every venv first
        try:
            venv = peer.venv()
            ready.append((peer, Agent(peer.name, lambda home, p=peer, v=venv: p.launch(v, home, ""))))
        except NotRunnable as exc:
            figures.append(_not_run(peer.name, str(exc)))
        except Exception as exc:
            figures.append(_not_run(peer.name, f"install: {describe(exc)[:300]}"))

    with _model() as base_url:
        for peer, agent in ready:
            agent.make = lambda home, p=peer: p.launch(p.venv_path, home, base_url)
        crow = Agent("crow", lambda home: (CROW_CMD, agent_env(home, _URL(base_url))))
        echo = Agent("echo", lambda home: (ECHO_CMD, agent_env(home)))
        await _cold(ctx, echo, full=False)  # page cache, .pyc files
        await _cold(ctx, crow)
        peers: list[Agent] = []
        for peer, agent in ready:  # does it work at all (and compile its .pyc files)
            ctx.log(f"{peer.name} {peer.version}: first start")
            try:
                await _cold(ctx, agent)
                peers.append(agent)
            except Exception as exc:
                figures.append(_not_run(f"{peer.name} {peer.version}", describe(exc)[:400]))
        everyone = [echo, crow, *peers]
        for i in range(reps):  # interleaved, rotating who goes first
            k = i % len(everyone)
            for agent in everyone[k:] + everyone[:k]:
                if agent.failed:
                    continue
                try:
                    agent.cold.append(await _cold(ctx, agent, full=agent is not echo))
                except Exception as exc:
                    agent.failed = describe(exc)[:400]
        ctx.log(f"steady: {warm} + {n} prompts each")
        await _steady(ctx, [a for a in (crow, *peers) if not a.failed or a.cold], warm, n)

    if not crow.cold:
        return [*figures, _not_run("crow", crow.failed or "no samples")]
    echo_init = median([r["init"] for r in echo.cold])
    out = _figures(crow, crow, echo_init, "crow")
    versions = {p.name: p.version for p, _ in ready}
    for agent in peers:
        label = f"{agent.name} {versions[agent.name]}"
        if not agent.cold:
            out.append(_not_run(label, agent.failed))
            continue
        out += _figures(agent, crow, echo_init, label)
        if agent.failed:
            out[-1].note = (out[-1].note + "; " if out[-1].note else "") + f"failed later: {agent.failed}"
    return out + figures


def _model() -> contextlib.AbstractContextManager[str]:
    """bench/peer_llm.py in its own process; yields its base URL."""
    return serving([PY, str(BENCH / "peer_llm.py")])


@dataclass
class _URL:
    base_url: str


if __name__ == "__main__":  # python -m bench.peers: this group alone, quick
    sys.exit("run it through bench/run.py --peers --only peers")
