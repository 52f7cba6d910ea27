"""The tool calls of one model reply: which may run side by side, and running them so.

A model lists its calls in an order and expects their effects in that order (five edits
of one file, or write, run, read). A call waits for every earlier call it conflicts
with; all others run concurrently. Two calls conflict unless

- both are read-only, or
- both name a ``path`` argument and neither path lies inside the other.

Only tools that `paths_of` names (crow's file tools) are taken at their ``path``: another
server's ``build(path="src")`` may write anywhere, so it counts as naming no path.

A call that may change something and names no path (``execute``, most MCP tools)
conflicts with every call; a read-only call without a path conflicts with every writer.
A folder path (``grep``/``glob``/``ls`` over ``src``) covers everything under it.
Paths are normalised against the session's folder with symlinks resolved, as the file
tools resolve them.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping, Sequence

import anyio

from crow.messages import ToolCall
from crow.roots import on_this_machine


def scope(call: ToolCall, cwd: str | os.PathLike[str]) -> str | None:
    """The absolute path a call touches, or None when it may touch anything (`cwd` an
    `editor_cwd`: a docker session's /workspace/a.txt and a.txt are one file)."""
    path = call.args.get("path") if isinstance(call.args, Mapping) else None
    if not isinstance(path, str) or not path:
        return None
    try:
        return os.path.realpath(on_this_machine(path, cwd))
    except (OSError, ValueError):  # a NUL byte and the like: the tool will refuse it
        return None


def _overlap(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return True
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def waits_for(
    calls: Sequence[ToolCall],
    read_only: Callable[[str], bool],
    cwd: str | os.PathLike[str],
    paths_of: Callable[[str], bool] = lambda name: True,
) -> list[list[int]]:
    """For each call, the indexes of the earlier calls it must wait for; `paths_of(name)`:
    the tool touches only its ``path`` argument."""
    scopes = [scope(c, cwd) if paths_of(c.name) else None for c in calls]
    ro = [read_only(c.name) for c in calls]
    return [
        [j for j in range(i) if not (ro[i] and ro[j]) and _overlap(scopes[i], scopes[j])]
        for i in range(len(calls))
    ]


async def run_batch(
    calls: Sequence[ToolCall], waits: Sequence[Sequence[int]], one: Callable[[ToolCall], Awaitable[None]]
) -> None:
    """Run ``one(call)`` for every call, each after the calls it waits for have finished."""
    done = [anyio.Event() for _ in calls]

    async def run(i: int) -> None:
        try:
            for j in waits[i]:
                await done[j].wait()
            await one(calls[i])
        finally:
            done[i].set()

    async with anyio.create_task_group() as tg:
        for i in range(len(calls)):
            tg.start_soon(run, i)
