"""MemoryHook: AGENTS.md files as the agent's memory, in the system prompt.

Files, in this order (missing ones skipped, each path once):

1. `$CROW_HOME/AGENTS.md`                       global memory
2. `AGENTS.md` in every folder from the repository root down to the session's cwd
   (the root is the nearest parent holding `.git`; with none, only the cwd)
3. `hooks.settings.memory.paths`                 extra files (relative to the cwd)

They are joined with a `---` rule and injected as `<agent_memory>...</agent_memory>`
followed by short guidelines telling the model it may edit the files. Files are re-read
at the start of each prompt only when their modification time or size changed.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from crow import Hook, HookContext, ModelRequest, read_text_file

if TYPE_CHECKING:
    from crow import Agent

log = logging.getLogger("crow.hooks.memory")

FILENAME = "AGENTS.md"
SEPARATOR = "\n\n---\n\n"  # blank lines around the rule: `text\n---` would make `text` a heading
GUIDELINES = """Guidelines for agent memory:
- This memory persists across conversations; it is read from: {files}
- You can update it by editing the AGENTS.md file (use edit_file, or write_file to create one)
- Use it to record important context, decisions, conventions and patterns worth keeping
- Keep entries concise and organized; do not store secrets or one-off details"""
_BLOCK = "memory.block"  # ctx.turn_state: this prompt's <agent_memory> block
_LAST = "memory.last"  # session.state: the block of the session's latest prompt


def repo_root(cwd: Path) -> Path | None:
    """The nearest folder at or above cwd holding `.git` (a folder or a worktree file)."""
    folder = os.fspath(cwd)  # strings, not Paths: this runs every prompt
    while True:
        if os.path.exists(os.path.join(folder, ".git")):
            return Path(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def memory_files(cwd: Path, home: Path, extra: list[str]) -> list[Path]:
    """The files looked for, in order (one reached twice is read once: `MemoryHook.load`)."""
    root = repo_root(cwd)
    chain = [cwd] if root is None else [*reversed(cwd.relative_to(root).parents), cwd.relative_to(root)]
    local = [cwd / FILENAME] if root is None else [root / part / FILENAME for part in chain]
    return [home / FILENAME, *local, *(cwd / Path(p).expanduser() for p in extra)]


class MemoryHook(Hook):
    """Loads AGENTS.md memory each prompt (mtime-cached) and adds it to the system prompt."""

    name = "memory"
    order = -40

    def __init__(self, paths: list[str] | tuple[str, ...] = (), *, home: Path | str | None = None) -> None:
        self.paths = [str(p) for p in paths]
        self.home = Path(home).expanduser() if home is not None else Path("~/.crow").expanduser()
        self._cache: dict[Path, tuple[int, int, str]] = {}  # path -> (mtime_ns, size, text)

    def _read(self, path: Path) -> tuple[tuple[int, int], str] | None:
        """The file's identity (device, inode) and text, or None when it cannot be read."""
        try:
            st = path.stat()
        except (OSError, ValueError):  # missing, a symlink loop, ...
            self._cache.pop(path, None)
            return None
        cached = self._cache.get(path)
        if cached is None or cached[:2] != (st.st_mtime_ns, st.st_size):
            try:
                text = read_text_file(path, errors="replace").strip()
            except (OSError, ValueError) as exc:  # a folder or a FIFO named AGENTS.md, too big, ...
                log.warning("memory file %s skipped: %s", path, exc)
                text = ""  # said once: until the file changes, skipped without a word
            cached = self._cache[path] = (st.st_mtime_ns, st.st_size, text)
        return (st.st_dev, st.st_ino), cached[2]

    def load(self, cwd: Path) -> str:
        """The `<agent_memory>` block for a session in `cwd`, or "" when there is no memory.
        A file reached by two paths (a symlink, a configured path) is read once: by its
        identity from the stat made anyway, not by resolving each path (an lstat per part)."""
        found: list[tuple[Path, str]] = []
        seen: set[tuple[int, int]] = set()
        for path in memory_files(cwd, self.home, self.paths):
            if (got := self._read(path)) is not None and got[0] not in seen:
                seen.add(got[0])
                if got[1]:
                    found.append((path, got[1]))
        if not found:
            return ""
        body = SEPARATOR.join(text for _, text in found)
        files = ", ".join(str(p.absolute()) for p, _ in found)
        return f"<agent_memory>\n{body}\n</agent_memory>\n\n{GUIDELINES.format(files=files)}"

    async def before_agent(self, ctx: HookContext) -> None:
        session = ctx.session
        parent = session.parent
        if parent is not None and parent.cwd == session.cwd and _LAST in parent.state:
            # A subagent runs inside its parent's prompt: that prompt's memory, not read again.
            block = parent.state[_LAST]
        else:
            # On the loop: a few stats, and a read (bounded, regular files only) when a file
            # changed. In a worker thread it was a GIL hand-off per prompt, which at 50 busy
            # sessions cost more CPU than the work (the whole turn: -12%).
            block = self.load(Path(ctx.cwd))
        ctx.turn_state[_BLOCK] = session.state[_LAST] = block

    async def modify_request(self, ctx: HookContext, request: ModelRequest) -> ModelRequest | None:
        block = ctx.turn_state.get(_BLOCK)
        return request.with_system(block) if block else None


def factory(agent: Agent) -> MemoryHook:
    """The `crow.hooks` entry point: extra files from `hooks.settings.memory.paths`."""
    settings = agent.config.hooks.settings.get("memory", {})
    return MemoryHook(settings.get("paths", []), home=agent.config.home)
