"""Slash-command discovery: gathering a session's commands from 200 prompt files (half in
subfolders, every one with frontmatter), as a session's start does (cold: every file read
and parsed) and as each prompt does (warm: a listing and a stat per file). Target: command
discovery < 20 ms for 200 prompt files (off the `initialize`/`session/new` path: a test,
tests/test_commands.py, guards that)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from bench.common import Ctx, Figure, median, ms

G = "commands"
FILES = 200


async def run(ctx: Ctx) -> list[Figure]:
    from crow import command_catalog, prompt_files
    from crow.config import Config
    from crow.hooks import HookRegistry
    from crow.session import Session

    ws, home = ctx.home("ws"), ctx.home("home")
    for i in range(FILES):
        folder = ws / ".crow" / "commands" / (f"group{i % 10}" if i % 2 else "")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"cmd{i}.md").write_text(
            f"---\ndescription: Command number {i}, which does a thing\nargument-hint: <file> [focus]\n---\n"
            f"Do thing {i} to $1, looking hardest at $2.\n" + "More instructions.\n" * 20
        )
    agent = SimpleNamespace(config=Config(home=str(home)), hooks=HookRegistry())
    session = Session("bench", ws)
    n = ctx.reps(60, 15)
    cold: list[float] = []
    warm: list[float] = []
    for i in range(n + 3):
        prompt_files._cache.clear()
        t0 = time.perf_counter()
        found, _ = await command_catalog.gather(agent, session)  # type: ignore[arg-type]
        t1 = time.perf_counter()
        await command_catalog.gather(agent, session)  # type: ignore[arg-type]
        t2 = time.perf_counter()
        assert len(found) == FILES + 1, len(found)  # and /init
        if i >= 3:
            cold.append(t1 - t0)
            warm.append(t2 - t1)
    return [
        Figure(G, f"command discovery, {FILES} prompt files (cold: all read)", ms(median(cold)),
               target="< 20 ms", check=("value", "<", 20), samples=n),
        Figure(G, f"command refresh before a prompt, {FILES} unchanged files", ms(median(warm)),
               target="< 20 ms", check=("value", "<", 20), samples=n),
    ]  # fmt: skip
