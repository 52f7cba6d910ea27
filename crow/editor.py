"""`EditorClient`: what a hook may ask of the front end through `session.client`.

`session.client` is None when nothing is attached to ask (a script, `crow run` without a
terminal). The ACP adapter's client (`crow.acp.client.AcpSessionClient`) offers all of
it; hooks type against this protocol, never against a front end's class. The file,
terminal and form methods may be called only when the matching `can_*` flag is true (a
front end written before `elicit` lacks the flag: read it with `getattr(..., False)`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from crow.llm.base import ToolSpec
    from crow.messages import ToolCall
    from crow.rules import Choice


@dataclass(frozen=True, slots=True)
class Elicited:
    """The user's answer to `EditorClient.elicit`: `action` is "accept" (`content` holds the
    form's values as the front end sent them: check them against the schema you asked
    with), "decline", or "cancel" (dismissed, unanswered in time, or the request failed);
    an action the protocol adds later passes through as it came."""

    action: str
    content: Mapping[str, Any] | None = None


@runtime_checkable
class EditorClient(Protocol):
    can_read: bool  # read_text reads the editor's buffers
    can_write: bool  # write_text writes through the editor
    can_terminal: bool  # run_in_terminal runs in an editor terminal
    can_elicit: bool  # elicit shows the user a form

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

    async def elicit(
        self, call: ToolCall | None, message: str, schema: Mapping[str, Any], *, timeout: float = ...
    ) -> Elicited:
        """Ask the user to fill in a form: `message` says what is asked, `schema` is an
        elicitation schema (an object whose properties are strings, numbers, booleans, a
        string enum or an array of one); `call` is the tool call it belongs to, if any."""
        ...

    async def read_text(self, path: Path) -> str: ...

    async def write_text(self, path: Path, text: str) -> None: ...

    async def run_in_terminal(
        self, command: str, cwd: Path, timeout: float, env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Returns output, exit_code, timed_out, truncated and terminal_id."""
        ...


def child_client(
    client: EditorClient | None, *, session_id: str, name: str, parent_call_id: str
) -> EditorClient | None:
    """What a subagent's session (`session_id`, run by the parent's call `parent_call_id`)
    asks through: the parent's front end, its questions naming the child (`name`). A front
    end offers that as `for_child(session_id=, name=, parent_call_id=)` (crow's three do: the
    ACP client asks on the child's session when the editor shows subagents, else on the
    parent's with the child's call ids); one without it is asked as it is."""
    if client is None:
        return None
    for_child = getattr(client, "for_child", None)
    if for_child is None:
        return client
    made: EditorClient = for_child(session_id=session_id, name=name, parent_call_id=parent_call_id)
    return made
