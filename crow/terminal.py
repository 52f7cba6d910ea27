"""`crow run`'s front end on a terminal: `TerminalClient`, an `EditorClient` that asks its
questions on the terminal (permissions, a project's trust, forms: `can_elicit`) and has no
editor buffers or terminals to offer (`can_read`, `can_write`, `can_terminal` are False;
those methods refuse), and `printable`, the model's text as a terminal may show it."""

from __future__ import annotations

import contextlib
import copy
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from pathlib import Path

    from crow.editor import Elicited
    from crow.llm.base import ToolSpec
    from crow.messages import ToolCall
    from crow.rules import Choice


class TerminalClient:
    """`crow run`'s stand-in for an editor: questions on the terminal, one at a time; a
    permission question names its call and shows the command or the change. Only what is
    typed after a question appears answers it (earlier input is discarded). It has no
    buffers or terminals of its own: the file tools and `execute` run in crow. A subagent
    asks through `for_child`: the same terminal and turn, its questions naming it."""

    can_read = can_write = can_terminal = False
    can_elicit = True
    KEYS: ClassVar[dict[str, str]] = {
        "allow_once": "y",
        "allow_always": "a",
        "allow_always_folder": "f",
        "allow_always_project": "p",
        "reject_once": "n",
        "reject_always": "v",
    }

    def __init__(
        self, cwd: str, fd: int = 0, paused: Callable[[], AbstractContextManager[Any]] | None = None
    ) -> None:
        self.cwd = cwd
        self.fd = fd
        # what stops the screen's live part while a question is up (crow.tui.render.Renderer)
        self._paused = paused or contextlib.nullcontext
        self._io = _Shared()  # one question at a time, for the parent and its children
        self.asker = ""  # a subagent's name: its questions say who asks
        self.task_call = ""  # the parent's call that runs that subagent

    def for_child(self, *, session_id: str, name: str, parent_call_id: str) -> TerminalClient:
        """The client of subagent `name`'s questions (`crow.child_client`): the same terminal,
        one question at a time with the parent's and its siblings', each naming the child
        and its calls by their ids among the parent's (`crow.events.child_call_id`)."""
        child = copy.copy(self)  # shares `_io`
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
        import anyio

        from crow.acp.client import DEFAULT_CHOICES

        options = list(options or DEFAULT_CHOICES)
        keys = {self.KEYS.get(o.id, str(n)): o.id for n, o in enumerate(options, 1)}
        labels = {o.id: o.label for o in options}
        menu = printable("  ".join(f"[{k}] {labels[i]}" for k, i in keys.items()))
        name = _call_name(call, spec, self.task_call)
        async with self._io.lock():
            with self._paused(), anyio.move_on_after(timeout):
                self._discard_typed_ahead()
                print(printable(_question(call, self.cwd, spec, self.asker)), file=sys.stderr)
                prompt = f"  {menu}\n  Answer for {name}: "
                while True:
                    print(prompt, end="", file=sys.stderr, flush=True)
                    line = await self._readline()
                    if line is None:
                        return None
                    answer = line.strip().lower() or "n"
                    if answer in keys:
                        return keys[answer]
                    if answer in ("yes", "no"):
                        return keys.get(answer[0])
                    prompt = f"  Please answer one of {', '.join(keys)} for {name}: "
            return None

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
        """A question with its own options (option_id, label, kind): `text`, then the options
        numbered; the answer is a number. Anything else picks the first reject option. It
        waits its turn behind permission questions, like them."""
        import anyio

        lines = [f"\n{printable(asked_by(self.asker))}{title}\n", printable(text).rstrip(), ""]
        lines += [f"  [{n}] {label}" for n, (_, label, _) in enumerate(options, 1)]
        async with self._io.lock():
            with self._paused(), anyio.move_on_after(timeout):
                self._discard_typed_ahead()
                print("\n".join(lines), file=sys.stderr)
                print(f"Choose 1-{len(options)}: ", end="", file=sys.stderr, flush=True)
                answer = await self._readline()
                if answer is None:
                    return None  # stdin closed
                answer = answer.strip()
                if answer.isdigit() and 1 <= int(answer) <= len(options):
                    return options[int(answer) - 1][0]
                return next((i for i, _, k in options if k.startswith("reject")), None)
            return None

    async def ask_choice(
        self, title: str, text: str, options: list[tuple[str, str]], *, timeout: float = 600.0
    ) -> str | None:
        """A question that is not about a tool call (trusting a project's folder): asked like
        `ask`, with `options` as (kind, label) pairs; the chosen kind, or None."""
        triples = [(kind, label, kind) for kind, label in options]
        return await self.ask(None, triples, title=title, text=text, timeout=timeout)

    async def elicit(
        self, call: ToolCall | None, message: str, schema: Mapping[str, Any], *, timeout: float = 600.0
    ) -> Elicited:
        """A form on the terminal: `message`, then each field of `schema` in turn (a choice
        by its number, several by numbers, a yes or no, a number or a line of text). An
        empty line declines; the end of input, or no answer within `timeout`, cancels."""
        import anyio

        from crow.editor import Elicited

        fields = schema.get("properties")
        fields = fields if isinstance(fields, Mapping) else {}
        async with self._io.lock():
            with self._paused(), anyio.move_on_after(timeout):
                self._discard_typed_ahead()
                print(f"\n{printable(asked_by(self.asker) + message).rstrip()}", file=sys.stderr)
                content: dict[str, Any] = {}
                for name, field in fields.items():
                    answer = await self._field(str(name), field if isinstance(field, Mapping) else {})
                    if answer is None:
                        return Elicited("cancel")  # stdin closed
                    if answer == "":
                        return Elicited("decline")
                    content[str(name)] = answer
                return Elicited("accept", content)
            return Elicited("cancel")

    async def _field(self, name: str, field: Mapping[str, Any]) -> Any:
        """One field's value: None at the end of input, "" for an empty line."""
        many = field.get("type") == "array"
        items = field.get("items") if many else field
        choices = items.get("enum") if isinstance(items, Mapping) else None
        choices = [str(c) for c in choices] if isinstance(choices, list) else []
        for n, choice in enumerate(choices, 1):
            print(f"  [{n}] {printable(choice)}", file=sys.stderr)
        if choices:
            hint = f"numbers 1-{len(choices)}, separated by spaces" if many else f"1-{len(choices)}"
        else:
            hint = {"boolean": "y or n", "number": "a number", "integer": "a whole number"}.get(
                str(field.get("type")), "text"
            )
        title = printable(str(field.get("title") or name))
        while True:
            print(f"  {title} ({hint}; empty line to decline): ", end="", file=sys.stderr, flush=True)
            line = await self._readline()
            if line is None or not line.strip():
                return None if line is None else ""
            value = _typed(line.strip(), str(field.get("type")), choices, many)
            if value is not None:
                return value
            print(f"  Please answer with {hint}.", file=sys.stderr)

    async def read_text(self, path: Path) -> str:
        raise no_editor("read", path)

    async def write_text(self, path: Path, text: str) -> None:
        raise no_editor("write", path)

    async def run_in_terminal(
        self, command: str, cwd: Path, timeout: float, env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        raise no_editor("run a command in", cwd)

    def _discard_typed_ahead(self) -> None:
        import termios

        self._io.buffer = b""
        if os.isatty(self.fd):
            termios.tcflush(self.fd, termios.TCIFLUSH)

    async def _readline(self) -> str | None:
        import anyio

        while b"\n" not in self._io.buffer:
            await anyio.wait_readable(self.fd)
            try:
                chunk = os.read(self.fd, 4096)
            except BlockingIOError:
                continue
            if not chunk:
                return None
            self._io.buffer += chunk
        line, _, self._io.buffer = self._io.buffer.partition(b"\n")
        return line.decode(errors="replace")


class _Shared:
    """What a `TerminalClient` and its children's share: the question lock (made in the
    running loop, at the first question) and what was read of the terminal's input."""

    def __init__(self) -> None:
        self._lock: Any = None
        self.buffer = b""

    def lock(self) -> Any:
        import anyio

        if self._lock is None:
            self._lock = anyio.Lock()
        return self._lock


def asked_by(name: str) -> str:
    """What a subagent's question starts with ("" for the parent's): `reviewer (subagent)
    asks: `, on one line (the name may come from a repository's agent file)."""
    return f"{' '.join(name.split())} (subagent) asks: " if name else ""


def shown_call_id(call: ToolCall, task_call: str = "") -> str:
    """A call's id as the terminal names it: a subagent's under its task's (`t1/c1`)."""
    from crow.events import child_call_id

    return child_call_id(task_call, call.id) if task_call else call.id


def _typed(text: str, kind: str, choices: list[str], many: bool) -> Any:
    """A typed line as a form field's value, or None when it is not one."""
    if choices:
        picked = [choices[int(w) - 1] if w.isdigit() and 1 <= int(w) <= len(choices) else None
                  for w in text.replace(",", " ").split()]  # fmt: skip
        if not picked or None in picked or (len(picked) > 1 and not many):
            return None
        return list(dict.fromkeys(picked)) if many else picked[0]
    if kind == "boolean":
        return {"y": True, "yes": True, "n": False, "no": False}.get(text.lower())
    if kind in ("number", "integer"):
        try:
            return int(text) if kind == "integer" else float(text)
        except ValueError:
            return None
    return text


def no_editor(verb: str, path: Path, front: str = "crow run") -> OSError:
    """What a hook gets for calling a method whose `can_*` flag is False."""
    return OSError(
        f"cannot {verb} {path} through the terminal: {front} has no editor "
        "(can_read, can_write and can_terminal are False)"
    )


def on_sigint(callback: Callable[[], object]) -> Callable[[], None]:
    """Ctrl-C calls `callback` (cancel the running turn, which settles its history) instead
    of interrupting; returns the undo, after which Ctrl-C interrupts again."""
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, callback)
    return lambda: loop.remove_signal_handler(signal.SIGINT) and None


def drop_stdout() -> None:
    """After the reader of stdout went away (BrokenPipeError): whatever is still buffered
    goes to /dev/null instead of failing again at exit (Python's recipe, "Note on SIGPIPE"
    in the signal module)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def printable(text: str) -> str:
    """The model's text as the terminal should show it: a control character (`\\r`, an
    escape sequence) could hide part of a command or fake the options below it."""
    return "".join(c if c.isprintable() or c in "\n\t" else f"\\x{ord(c):02x}" for c in text)


def _call_name(call: ToolCall, spec: ToolSpec | None = None, task_call: str = "") -> str:
    from crow.tool_kinds import tool_title

    # the ids are the model server's, unchecked: one could hold an escape sequence
    return printable(f"{tool_title(call, spec)!r} (call {shown_call_id(call, task_call)})")


def _question(call: ToolCall, cwd: str, spec: ToolSpec | None = None, asker: str = "") -> str:
    """The call and what it would do, as `crow run` prints it."""
    return "\n".join(text for _, text in question_lines(call, cwd, spec, asker))


def question_lines(
    call: ToolCall, cwd: str, spec: ToolSpec | None = None, asker: str = ""
) -> list[tuple[str, str]]:
    """The call and what it would do: the command, a unified diff, or its arguments, as
    (part, line) pairs, `part` one of "title", "command", "diff", "more", "argument" (for
    front ends that colour them); `asker` a subagent's name, when one asks. The lines are
    the model's text: pass them through `printable` before they reach a terminal."""
    import difflib

    from crow.roots import on_this_machine
    from crow.tool_kinds import current_text, tool_title

    args = call.args
    lines = [("title", f"\n{asked_by(asker)}Allow {tool_title(call, spec)}?")]
    kind = spec.kind if spec is not None else "other"
    path = args.get("path") if isinstance(args.get("path"), str) else None
    writes = isinstance(args.get("content"), str)  # a whole file, else old_text -> new_text
    if kind == "execute":
        # Each line of the command indented: a line of it cannot pass for what crow prints.
        first, *rest = str(args.get("command", "")).split("\n")
        lines.append(("command", f"  $ {first}"))
        lines.extend(("command", f"    {line}") for line in rest)
    elif kind == "edit" and path and (writes or isinstance(args.get("new_text"), str)):
        full = on_this_machine(path, cwd)  # a docker session's /workspace/x: the file here
        if writes:
            old = current_text(full)
            new = str(args.get("content", ""))
        else:
            old, new = str(args.get("old_text", "")), str(args.get("new_text", ""))
        diff = list(
            difflib.unified_diff(
                (old or "").splitlines(), new.splitlines(), f"a/{path}", f"b/{path}", lineterm=""
            )
        )
        if old is None and writes:
            if os.path.lexists(full):
                diff[0:2] = [f"--- a/{path} (exists; binary or over 1 MB, not shown)", f"+++ b/{path}"]
            else:
                diff[0:2] = ["--- /dev/null", f"+++ b/{path} (new file)"]
        shown = diff[:60]
        lines.extend(("diff", f"  {d}") for d in shown)
        if len(diff) > len(shown):
            lines.append(("more", f"  … {len(diff) - len(shown)} more lines"))
    else:
        for key, value in args.items():
            text = value if isinstance(value, str) else repr(value)
            lines.append(("argument", f"  {key}: {text if len(text) <= 200 else text[:197] + '...'}"))
    return lines
