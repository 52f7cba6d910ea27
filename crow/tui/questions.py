"""`ChatClient`: the `EditorClient` of `crow chat`. It asks its questions with pickers
(`crow.tui.picker`): permissions (the call named, its command or its diff shown, then the
scoped choices crow offers), a project's trust, a plan's approval and `ask_user` forms.

One question at a time: a second waits until the first is answered, also when subagents
ask (`for_child`: their questions name them). What the model wrote
(the question, the options, the command, the diff) is shown as plain text through
`crow.terminal.printable`. Esc leaves a question unanswered (a form: declined); Ctrl-C
also cancels the turn (`on_interrupt`). Like `crow run`, chat has no editor buffers or
terminals: the file tools and `execute` run in crow."""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from crow.editor import Elicited
from crow.terminal import TerminalClient, asked_by, no_editor, question_lines, shown_call_id
from crow.tui.picker import HINT, Option, Picked, line, one_line, pick, show

if TYPE_CHECKING:
    from pathlib import Path

    from crow.llm.base import ToolSpec
    from crow.messages import ToolCall
    from crow.rules import Choice
    from crow.tui.render import Renderer

_STYLES = {"title": "bold", "command": "bold", "more": HINT, "argument": ""}
_DIFF_STYLES = (("  +++", "bold"), ("  ---", "bold"), ("  +", "fg:ansigreen"), ("  -", "fg:ansired"),
                ("  @@", "fg:ansicyan"))  # fmt: skip


class ChatClient:
    can_read = can_write = can_terminal = False
    can_elicit = True

    def __init__(self, cwd: str, renderer: Renderer, on_interrupt: Callable[[], None]) -> None:
        self.cwd = cwd
        self.renderer = renderer
        self.on_interrupt = on_interrupt  # cancels the running turn
        self._lock = anyio.Lock()
        self.asker = ""  # a subagent's name: its questions say who asks
        self.task_call = ""  # the parent's call that runs that subagent

    def for_child(self, *, session_id: str, name: str, parent_call_id: str) -> ChatClient:
        """The client of subagent `name`'s questions (`crow.child_client`): the same screen
        and lock (one question at a time with the parent's and its siblings'), each
        question naming the child and its calls by their ids among the parent's."""
        child = copy.copy(self)  # shares the lock, the renderer and on_interrupt
        child.asker, child.task_call = name, parent_call_id
        return child

    async def ask_permission(
        self,
        call: ToolCall,
        *,
        options: Sequence[Choice] = (),
        spec: ToolSpec | None = None,
        timeout: float = 600.0,
    ) -> str | None:
        from crow.acp.client import DEFAULT_CHOICES
        from crow.tool_kinds import tool_title

        choices = list(options or DEFAULT_CHOICES)
        shown = [Option(c.id, c.label, TerminalClient.KEYS.get(c.id)) for c in choices]
        lines = [(_style(part, text), _title(text) if part == "title" else text)
                 for part, text in question_lines(call, self.cwd, spec, self.asker)]  # fmt: skip
        name = tool_title(call, spec)  # in full above: here short, to leave the options room
        name = name if len(name) <= 60 else name[:59] + "…"
        who = f"{' '.join(self.asker.split())[:30]}: " if self.asker else ""
        title = f"Answer for {who}{name} (call {shown_call_id(call, self.task_call)})"
        picked = await self._asking(lines, lambda: pick(title, shown), timeout)
        if picked is None or picked.action != "accept":
            if picked is not None and picked.action == "escape":
                show([(HINT, "  No answer: not run.")])
            return None
        choice = next(c for c in choices if c.id == picked.value)
        mark = ("fg:ansigreen", "✓") if choice.kind.startswith("allow") else ("fg:ansired", "✗")
        show([(mark[0], f"  {mark[1]} {one_line(choice.label)}")])
        return choice.id

    async def ask(
        self,
        call: ToolCall | None,
        options: Sequence[tuple[str, str, str]],
        *,
        title: str,
        text: str,
        kind: str | None = None,
        timeout: float = 600.0,
    ) -> str | None:
        """`text`, then its options to pick one from; Esc: no answer (None)."""
        lines = [("bold", _title(asked_by(self.asker) + title))]
        lines += [("", f"  {t}") for t in text.rstrip().split("\n")]
        shown = [Option(option_id, label) for option_id, label, _ in options]
        picked = await self._asking(lines, lambda: pick("", shown), timeout)
        if picked is None or picked.action != "accept":
            if picked is not None and picked.action == "escape":
                show([(HINT, "  No answer.")])
            return None
        show([("bold", f"  › {one_line(next(label for i, label, _ in options if i == picked.value))}")])
        return str(picked.value)

    async def ask_choice(
        self, title: str, text: str, options: list[tuple[str, str]], *, timeout: float = 600.0
    ) -> str | None:
        """Asked like `ask` (trusting a project's folder); the chosen kind, or None."""
        triples = [(kind, label, kind) for kind, label in options]
        return await self.ask(None, triples, title=title, text=text, timeout=timeout)

    async def elicit(
        self, call: ToolCall | None, message: str, schema: Mapping[str, Any], *, timeout: float = 600.0
    ) -> Elicited:
        """`message`, then each field of `schema` in turn: a choice, several, yes or no, a
        number, a line of text. Esc declines; Ctrl-C or no answer in time cancels."""
        fields = schema.get("properties")
        fields = fields if isinstance(fields, Mapping) else {}
        content: dict[str, Any] = {}

        async def fill() -> Picked:
            for name, field in fields.items():
                picked = await _field(str(name), field if isinstance(field, Mapping) else {})
                if picked.action != "accept":
                    return picked
                content[str(name)] = picked.value
                show([("bold", f"  › {_shown(picked.value)}")])
            return Picked("accept", content)

        lines = [("bold", t) for t in f"\n{asked_by(self.asker)}{message.rstrip()}".split("\n")]
        picked = await self._asking(lines, fill, timeout)
        if picked is None or picked.action == "interrupt":
            return Elicited("cancel")
        if picked.action == "escape":
            show([(HINT, "  Declined.")])
            return Elicited("decline")
        return Elicited("accept", content)

    async def read_text(self, path: Path) -> str:
        raise no_editor("read", path, "crow chat")

    async def write_text(self, path: Path, text: str) -> None:
        raise no_editor("write", path, "crow chat")

    async def run_in_terminal(
        self, command: str, cwd: Path, timeout: float, env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        raise no_editor("run a command in", cwd, "crow chat")

    async def _asking(
        self, lines: list[tuple[str, str]], run: Callable[[], Awaitable[Picked]], timeout: float
    ) -> Picked | None:
        """Show `lines`, then `run` the picker(s): its answer, or None when no answer came
        within `timeout` (the screen says so). Ctrl-C cancels the turn too."""
        async with self._lock:
            with self.renderer.paused():
                show(lines)
                with anyio.move_on_after(timeout) as waited:
                    picked = await run()
            if waited.cancelled_caught:
                self.renderer.info(f"No answer within {timeout:g} s: the question was withdrawn.")
                return None
            if picked.action == "interrupt":
                self.on_interrupt()
            return picked


async def _field(name: str, field: Mapping[str, Any]) -> Picked:
    """One form field's value, picked or typed."""
    title = str(field.get("title") or name)
    kind = str(field.get("type"))
    items = field.get("items") if kind == "array" else field
    choices = items.get("enum") if isinstance(items, Mapping) else None
    if isinstance(choices, list) and choices:
        options = [Option(str(n), str(c)) for n, c in enumerate(choices)]
        picked = await pick(title, options, many=kind == "array")
        if picked.action != "accept":
            return picked
        chosen = picked.value if isinstance(picked.value, list) else [picked.value]
        values = [choices[int(n)] for n in chosen]
        return Picked("accept", values if kind == "array" else values[0])
    if kind == "boolean":
        picked = await pick(title, [Option("yes", "Yes", "y"), Option("no", "No", "n")])
        return Picked("accept", picked.value == "yes") if picked.action == "accept" else picked
    if kind in ("number", "integer"):
        number = int if kind == "integer" else float
        picked = await line(title, check=lambda text: _not_a(number, text))
        return Picked("accept", number(picked.value.strip())) if picked.action == "accept" else picked
    return await line(title, check=lambda text: None if text.strip() else "Type an answer, or Esc to decline")


def _not_a(number: type, text: str) -> str | None:
    try:
        number(text.strip())
    except ValueError:
        return f"Type {'a whole number' if number is int else 'a number'}, or Esc to decline"
    return None


def _shown(value: Any) -> str:
    """A field's answer, as the line under the question shows it."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(map(one_line, map(str, value))) or "(none)"
    return one_line(str(value))


def _title(text: str) -> str:
    """A question's title after a blank line, on one line: a newline in the call's (the
    model's) title would start a line crow did not write."""
    return "\n" + one_line(text.removeprefix("\n"))


def _style(part: str, text: str) -> str:
    if part == "diff":
        return next((style for prefix, style in _DIFF_STYLES if text.startswith(prefix)), "")
    return _STYLES.get(part, "")
