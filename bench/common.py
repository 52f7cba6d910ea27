"""Shared pieces of the benchmarks: figures, statistics, spawning ACP agents.

A benchmark module exposes `async def run(ctx: Ctx) -> list[Figure]`. A `Figure` is one
line of the results table: the measured value, optionally a baseline measured in the same
run (then the ratio is what the target judges), and the target.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
PY = sys.executable
CROW_CMD = [PY, "-m", "crow"]
ECHO_CMD = [PY, str(BENCH / "baselines" / "echo_agent.py")]
STREAM_CMD = [PY, str(BENCH / "baselines" / "stream_agent.py")]


@dataclass
class Figure:
    group: str
    name: str
    value: float | None  # None: not measured
    unit: str = "ms"
    baseline: float | None = None
    baseline_name: str = ""
    target: str = ""  # human text, e.g. "ratio <= 1.15"
    # how the target is judged: ("ratio", "<=", 1.15), ("value", "<", 10) or
    # ("diff", "<", 0.5) for value - baseline
    check: tuple[str, str, float] | None = None
    note: str = ""
    samples: int = 0

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.baseline:
            return None
        return self.value / self.baseline

    @property
    def verdict(self) -> str:
        if self.value is None:
            return "n/a"
        if self.check is None:
            return "info"
        what, op, limit = self.check
        x = self._judged(what)
        if x is None:
            return "n/a"
        ok = x <= limit if op == "<=" else x < limit
        return "PASS" if ok else "FAIL"

    @property
    def slack(self) -> float | None:
        """Measured / limit: above 1 fails; the worst figure has the highest slack."""
        if self.check is None or self.value is None:
            return None
        what, _, limit = self.check
        x = self._judged(what)
        return None if x is None else x / limit

    def _judged(self, what: str) -> float | None:
        if what == "ratio":
            return self.ratio
        if what == "diff":
            return None if self.value is None or self.baseline is None else self.value - self.baseline
        return self.value

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(ratio=self.ratio, verdict=self.verdict)
        return d


def describe(exc: BaseException) -> str:
    """An exception in one line, with the JSON-RPC error data when there is some."""
    data = getattr(exc, "data", None)
    return f"{type(exc).__name__}: {exc}" + (f" ({data})" if data else "")


def not_measured(group: str, name: str, reason: str, target: str = "") -> Figure:
    return Figure(group, name, None, target=target, note=f"not measured: {reason}")


@dataclass
class Ctx:
    quick: bool = False
    verbose: bool = False
    peers: bool = False
    tmp: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="crow-bench-")))

    def reps(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    def log(self, msg: str) -> None:
        print(f"  .. {msg}", file=sys.stderr, flush=True)

    def home(self, name: str) -> Path:
        """A fresh directory (a CROW_HOME, a workspace) under the run's temp dir."""
        path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.tmp))
        return path


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def ms(seconds: float) -> float:
    return seconds * 1000.0


# ---------------------------------------------------------------- ACP agents


def agent_env(home: Path, llm: Any = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CROW_", "OPENAI_", "ANTHROPIC_"))}
    env.update(CROW_HOME=str(home), PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    if llm is not None:
        env.update(CROW_MODEL="openai:scripted", OPENAI_BASE_URL=llm.base_url, OPENAI_API_KEY="x")
    env.update(extra)
    return env


class QuietClient:
    """An ACP client that counts updates and keeps the text; permissions: allow once."""

    def __init__(self) -> None:
        self.updates = 0
        self.chunks: list[str] = []

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates += 1
        if type(update).__name__ == "AgentMessageChunk":
            self.chunks.append(getattr(update.content, "text", ""))

    async def request_permission(self, session_id: str, tool_call: Any, options: list[Any], **kw: Any) -> Any:
        from acp.schema import AllowedOutcome, RequestPermissionResponse

        opt = next(o for o in options if o.kind == "allow_once")
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=opt.option_id))

    def text(self) -> str:
        out, self.chunks = "".join(self.chunks), []
        return out


@contextlib.asynccontextmanager
async def spawn(cmd: list[str], env: dict[str, str], cwd: Path,
                client: QuietClient | None = None) -> AsyncIterator[tuple[Any, Any, QuietClient]]:
    """Spawn an ACP agent with stderr in a file (a full stderr pipe would block it)."""
    import acp

    client = client or QuietClient()
    err_path = cwd / "agent-stderr.log"
    with open(err_path, "ab") as err:
        async with acp.spawn_agent_process(client, cmd[0], *cmd[1:], env=env, cwd=str(cwd),
                                           transport_kwargs={"stderr": err}) as (conn, proc):
            yield conn, proc, client


async def initialize(conn: Any) -> Any:
    import acp
    from acp.schema import ClientCapabilities

    return await conn.initialize(protocol_version=acp.PROTOCOL_VERSION,
                                 client_capabilities=ClientCapabilities())


async def prompt_text(conn: Any, session_id: str, text: str) -> Any:
    import acp

    return await conn.prompt(session_id=session_id, prompt=[acp.text_block(text)])


@dataclass
class ModelProcess:
    base_url: str


@contextlib.contextmanager
def model_process(latency: float) -> Iterator[ModelProcess]:
    """bench/llm_proc.py in its own process: an asyncio model that scales to many sessions."""
    with serving([PY, str(BENCH / "llm_proc.py"), "--latency", str(latency)]) as base_url:
        yield ModelProcess(base_url)


@contextlib.contextmanager
def serving(argv: list[str]) -> Iterator[str]:
    """A model server in its own process that prints its base URL first; killed after."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.kill()
        proc.wait()


def vm_hwm_kb(pid: int, field_name: str = "VmHWM") -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def stderr_tail(cwd: Path, n: int = 400) -> str:
    try:
        return (cwd / "agent-stderr.log").read_text(errors="replace")[-n:].strip()
    except OSError:
        return ""
