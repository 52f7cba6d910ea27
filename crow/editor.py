"""`EditorClient`: what a hook may ask of the front end through `session.client`.

`session.client` is None when nothing is attached to ask (a script, `crow run` without a
terminal). The ACP adapter's client (`crow.acp.client.AcpSessionClient`) offers all of
it; hooks type against this protocol, never against a front end's class. The file and
terminal methods may be called only when the matching `can_*` flag is true.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from crow.llm.base import ToolSpec
    from crow.messages import ToolCall
    from crow.rules import Choice


@runtime_checkable
class EditorClient(Protocol):
    can_read: bool  # read_text reads the editor's buffers
    can_write: bool  # write_text writes through the editor
    can_terminal: bool  # run_in_terminal runs in an editor terminal

    async def ask_permission(
        self,
        call: ToolCall,
        *,
        options: Sequence[Choice] = ...,
        spec: ToolSpec | None = None,
        timeout: float = ...,
    ) -> str | None:
        """Ask whether `call` may run (`spec`: its tool's kind and title, for showing it);
        the chosen option's id, or None (no answer)."""
        ...

    async def ask(
        self,
        call: ToolCall,
        options: Sequence[tuple[str, str, str]],
        *,
        title: str,
        text: str,
        kind: str | None = None,
        timeout: float = ...,
    ) -> str | None:
        """A question about `call` with its own (option_id, label, permission kind) options;
        `text` is markdown. The chosen option_id, or None."""
        ...

    async def ask_choice(
        self, title: str, text: str, options: list[tuple[str, str]], *, timeout: float = ...
    ) -> str | None:
        """A question that is not about a tool call; `options` are (kind, label) pairs.
        The chosen kind, or None."""
        ...

    async def read_text(self, path: Path) -> str: ...

    async def write_text(self, path: Path, text: str) -> None: ...

    async def run_in_terminal(
        self, command: str, cwd: Path, timeout: float, env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Returns output, exit_code, timed_out, truncated and terminal_id."""
        ...
