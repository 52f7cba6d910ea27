"""Rendering in a terminal: does `crow chat` keep up with a fast 5,000-chunk answer?

A model server (in this process, on asyncio) streams one answer of mixed Markdown
(paragraphs, lists, headings, code fences) as 5,000 OpenAI chunks, paced so that the raw
stream takes ~2.5 s; the last chunk carries a marker. Measured in the same run:
- raw: a bare HTTP client (httpx) posts the request and reads the stream: request sent ->
  the marker read;
- crow: `crow chat` in a pseudo-terminal (120x40); the prompt typed -> the marker written
  to the terminal (Markdown rendered, the live part redrawn on the way).
Target: crow's time <= 1.2x the raw stream's. Also: the CPU seconds the crow process used
during the turn, and the Renderer's own CPU for the same chunks fed in-process at the same
pace (a console writing to /dev/null), which is what rendering costs apart from the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import json
import os
import pty
import struct
import subprocess
import termios
import time
from typing import Any

from bench.common import CROW_CMD, Ctx, Figure, agent_env, median, ms, not_measured

G = "render"
CHUNKS = 5000
STREAM_SECONDS = 2.5
MARKER = "ZZEND"


def answer_chunks(n: int = CHUNKS) -> list[str]:
    """A Markdown answer cut into `n` chunks; the last one is " ZZEND.\\n"."""
    words = "the renderer prints each finished block once and keeps only the tail live".split()
    parts: list[str] = []
    k = 0
    while sum(map(len, parts)) < n * 9:
        k += 1
        parts.append(f"## Section {k}\n\n" if k % 7 == 1 else "")
        parts.append(" ".join(words[(k + i) % len(words)] for i in range(40)) + ".\n\n")
        if k % 3 == 0:
            parts.append("".join(f"- item {k}.{i} with `code` and **bold**\n" for i in range(4)) + "\n")
        if k % 4 == 0:
            body = "".join(f"    value_{i} = compute({i}, {k})\n" for i in range(5))
            parts.append(f"```python\ndef block_{k}():\n{body}    return value_0\n```\n\n")
    text = "".join(parts) + "Last paragraph before the end"
    cuts = [len(text) * i // (n - 1) for i in range(n)]
    chunks = [text[a:b] for a, b in itertools.pairwise(cuts)]
    return [*chunks, f" {MARKER}.\n"]


class _Server:
    """OpenAI `/chat/completions` streaming `chunks` paced over `seconds`; a prompt that
    says "warm up" gets a one-chunk answer."""

    def __init__(self, chunks: list[str], seconds: float) -> None:
        self.chunks, self.seconds = chunks, seconds

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}

        def event(obj: Any) -> bytes:
            data = b"data: " + json.dumps(obj).encode() + b"\n\n"
            return b"%x\r\n%s\r\n" % (len(data), data)

        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(v)
                        for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n"))
                        if k.lower() == b"content-length"
                    ),
                    0,
                )
                messages = json.loads(await reader.readexactly(length)).get("messages") or [{}]
                warm_up = "warm up" in str(messages[-1].get("content"))
                chunks = ["ok"] if warm_up else self.chunks
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                )
                pace = self.seconds / len(self.chunks)
                began = time.monotonic()
                for n, text in enumerate(chunks):
                    ahead = began + n * pace - time.monotonic()
                    if ahead > 0:
                        await asyncio.sleep(ahead)
                    writer.write(event({**base, "choices": [{"index": 0, "delta": {"content": text}}]}))
                    await writer.drain()
                writer.write(event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
                usage = {"prompt_tokens": 50, "completion_tokens": len(chunks), "total_tokens": 5050}
                writer.write(event({**base, "choices": [], "usage": usage}))
                writer.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
                await writer.drain()


async def _raw(base_url: str) -> float:
    """Request sent -> the marker read, by a bare streaming HTTP client."""
    import httpx

    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}]}
    async with httpx.AsyncClient(timeout=60) as client:
        began = time.monotonic()
        async with client.stream("POST", f"{base_url}/chat/completions", json=body) as reply:
            async for data in reply.aiter_bytes():
                if MARKER.encode() in data:
                    return time.monotonic() - began
    raise RuntimeError("the stream ended without its marker")


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class _Pty:
    """`crow chat` on a pseudo-terminal; its output read on the event loop."""

    def __init__(self, env: dict[str, str], cwd: str) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.proc = subprocess.Popen(
            [*CROW_CMD, "chat"],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        os.close(slave)
        self.output = bytearray()
        self._changed = asyncio.Event()
        asyncio.get_running_loop().add_reader(self.master, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self.master, 65536)
        except OSError:
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(self.master)
        self.output += data
        self._changed.set()

    async def wait_for(self, text: bytes, start: int = 0, timeout: float = 60) -> float:
        """When `text` appeared in the output after `start`."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while text not in self.output[start:]:
                    self._changed.clear()
                    await self._changed.wait()
                return time.monotonic()
        tail = bytes(self.output[-600:]).decode(errors="replace")
        raise RuntimeError(f"waited {timeout}s for {text!r}; the terminal's last output: {tail!r}")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(self.master)
        if self.proc.poll() is None:
            os.write(self.master, b"\x04")  # Ctrl-D at the prompt: exit
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.close(self.master)


async def _crow(ctx: Ctx, base_url: str) -> tuple[float, float]:
    """(prompt typed -> marker on the terminal, CPU seconds crow used meanwhile)."""
    home = ctx.home("render")
    env = agent_env(home, None, OPENAI_BASE_URL=base_url, OPENAI_API_KEY="x", CROW_MODEL="openai:m")
    # No terminal answers the cursor position requests here: prompt_toolkit must not wait for one.
    env.update(TERM="xterm-256color", COLUMNS="120", LINES="40", PROMPT_TOOLKIT_NO_CPR="1")
    term = _Pty(env, str(home))
    try:
        await term.wait_for("›".encode())
        # A first prompt starts the session's tool servers: a warm-up turn takes that cost,
        # which is the session's, not the rendering's.
        mark = len(term.output)
        os.write(term.master, b"warm up\r")
        await term.wait_for("✓".encode(), mark)  # the turn's summary line
        await term.wait_for("›".encode(), term.output.index("✓".encode(), mark))
        start = len(term.output)
        cpu = _cpu_seconds(term.proc.pid)
        os.write(term.master, b"go\r")
        began = time.monotonic()
        shown = await term.wait_for(MARKER.encode(), start)
        cpu = _cpu_seconds(term.proc.pid) - cpu
        return shown - began, cpu
    finally:
        term.close()


async def _renderer_cpu(chunks: list[str], seconds: float) -> float:
    """CPU seconds the Renderer alone spends on `chunks` fed at the stream's pace."""
    from rich.console import Console

    from crow.events import TextDelta
    from crow.loop import TurnResult
    from crow.tui.render import Renderer

    with open(os.devnull, "w") as sink:
        renderer = Renderer(Console(file=sink, force_terminal=True, width=120, height=40))
        pace = seconds / len(chunks)
        began_cpu, began = time.process_time(), time.monotonic()
        renderer.start_turn()
        for n, text in enumerate(chunks):
            ahead = began + n * pace - time.monotonic()
            if ahead > 0.001:
                await asyncio.sleep(ahead)
            await renderer.emit(TextDelta(text, "m"))
        renderer.end_turn(TurnResult("end_turn"))
        return time.process_time() - began_cpu


async def run(ctx: Ctx) -> list[Figure]:
    chunks = answer_chunks()
    server = _Server(chunks, STREAM_SECONDS)
    base_url = await server.start()
    reps = ctx.reps(3, 1)
    raw: list[float] = []
    crow: list[float] = []
    cpu: list[float] = []
    try:
        for rep in range(reps):
            order = ("raw", "crow") if rep % 2 == 0 else ("crow", "raw")
            for who in order:
                if who == "raw":
                    raw.append(await _raw(base_url))
                    continue
                try:
                    took, used = await _crow(ctx, base_url)
                except RuntimeError as exc:
                    return [not_measured(G, "crow chat: 5,000-chunk answer rendered", str(exc))]
                crow.append(took)
                cpu.append(used)
            ctx.log(f"rep {rep}: raw {raw[-1]:.2f} s, crow {crow[-1]:.2f} s, crow CPU {cpu[-1]:.2f} s")
    finally:
        server.server.close()
    renderer_cpu = median([await _renderer_cpu(chunks, STREAM_SECONDS) for _ in range(reps)])
    return [
        Figure(
            G,
            f"crow chat: a {CHUNKS}-chunk Markdown answer on a terminal, prompt -> last chunk shown",
            ms(median(crow)),
            baseline=ms(median(raw)),
            baseline_name="raw stream read by a bare HTTP client",
            target="ratio <= 1.2",
            check=("ratio", "<=", 1.2),
            samples=reps,
            note=f"the stream paced to ~{STREAM_SECONDS} s; median of {reps} runs each",
        ),
        Figure(
            G,
            "crow chat: CPU seconds of the crow process during that turn",
            median(cpu),
            unit="s",
            samples=reps,
            note="loop, HTTP client and rendering together (/proc/PID/stat utime+stime)",
        ),
        Figure(
            G,
            f"Renderer alone: CPU seconds for the {CHUNKS} chunks at the stream's pace",
            renderer_cpu,
            unit="s",
            samples=reps,
            note="in-process, console to /dev/null, the live part redrawn at 12 fps",
        ),
    ]
