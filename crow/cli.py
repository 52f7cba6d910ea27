"""The `crow` command.

    crow                      serve ACP over stdio (what an editor launches)
    crow run "PROMPT"         one prompt in the terminal: text to stdout, tools to stderr
    crow mcp filesystem|todos run a builtin MCP server over stdio
    crow sessions ...         list / show / delete / export stored sessions
    crow compact SESSION_ID   compact a stored session
    crow trust [DIR]          apply DIR's crow.yaml (as it is now) to sessions there
    crow untrust [DIR]        stop applying it; `crow trust --list` shows what is trusted

Only argparse and logging are imported before the command is known: the ACP path must
answer `initialize` fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, ClassVar


def _setup_logging(level: str | None, log_file: str | None) -> None:
    # stdout belongs to the protocol: logs go to stderr or a file, configured before
    # anything (MCPServer calls logging.basicConfig) can claim the root logger.
    handler: logging.Handler = (
        logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel((level or os.environ.get("CROW_LOG_LEVEL") or "WARNING").upper())


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="crow", description="ACP coding-agent server")
    p.add_argument("--config", help="your YAML config file (default: $CROW_HOME/config.yaml)")
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING (default; or CROW_LOG_LEVEL)")
    p.add_argument("--log-file", help="write logs here instead of stderr")
    sub = p.add_subparsers(dest="command")
    sub.add_parser("serve", help="serve ACP over stdio (the default)")
    run = sub.add_parser("run", help="run one prompt in the terminal")
    run.add_argument("prompt", nargs="+")
    run.add_argument("--cwd", default=os.getcwd(), help="workspace (default: current directory)")
    run.add_argument("--model", help="provider:model, overrides CROW_MODEL")
    run.add_argument("--yolo", action="store_true", help="allow edits and commands without asking")
    mcp = sub.add_parser("mcp", help="run a builtin MCP server over stdio")
    mcp.add_argument("server", choices=["filesystem", "todos"])
    mcp.add_argument("rest", nargs=argparse.REMAINDER)
    sessions = sub.add_parser("sessions", help="manage stored sessions")
    sessions.add_argument("action", choices=["list", "show", "delete", "export"])
    sessions.add_argument("session_id", nargs="?")
    sessions.add_argument("--cwd", help="only sessions of this workspace (list)")
    compact = sub.add_parser("compact", help="compact a stored session")
    compact.add_argument("session_id")
    compact.add_argument("instructions", nargs="*")
    trust = sub.add_parser("trust", help="trust a project's crow.yaml (found from DIR up to the repo root)")
    trust.add_argument("dir", nargs="?", default=os.getcwd())
    trust.add_argument("--list", action="store_true", help="list the trusted project folders")
    untrust = sub.add_parser("untrust", help="stop trusting a project's crow.yaml")
    untrust.add_argument("dir", nargs="?", default=os.getcwd())
    return p


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    _setup_logging(args.log_level, args.log_file)
    command = args.command or "serve"
    if command == "mcp":
        _run_mcp(args.server, args.rest)
        return
    if command in ("serve", "run"):
        import asyncio

        from crow.startup import configure_process

        configure_process()
    from crow.errors import CrowError

    try:
        if command == "serve":
            asyncio.run(_serve(args.config))
        elif command == "run":
            args.cwd = os.path.abspath(args.cwd)
            sys.exit(asyncio.run(_run(args)))
        elif command in ("trust", "untrust"):
            sys.exit(_trust(args))
        else:  # sessions, compact: no event loop unless compacting (as cheap as --help)
            from crow import cli_sessions

            sys.exit(cli_sessions.main(args))
    except CrowError as exc:
        print(f"crow: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


async def _serve(config_path: str | None) -> None:
    from crow.acp.server import serve
    from crow.agent import Agent
    from crow.config import load_config
    from crow.startup import imports_done

    agent = Agent(load_config(config_path))
    agent.on_ready(imports_done)  # a broken plugin or store must not leave the GC paused either
    await serve(agent)


def _trust(args: argparse.Namespace) -> int:
    from pathlib import Path

    from crow.config import load_config
    from crow.project_config import compose, find_project_file
    from crow.trust import TrustStore, describe, read_project

    user = load_config(args.config)
    store = TrustStore(user.home)
    if getattr(args, "list", False):
        for folder, entry in sorted(store.entries().items()):
            print(f"{folder}\t{entry.get('file', 'crow.yaml')} sha256:{str(entry.get('sha256'))[:12]}")
        return 0
    start = Path(args.dir).expanduser().absolute()
    if not start.is_dir():
        print(f"crow: {start} is not a folder", file=sys.stderr)
        return 2
    found = find_project_file(start)
    if args.command == "untrust":
        folders = {start.resolve(), *([found.parent.resolve()] if found else [])}
        removed = [f for f in folders if store.untrust(f)]
        print(f"untrusted {', '.join(map(str, removed))}" if removed else f"{start} was not trusted")
        return 0
    if found is None:
        print(f"crow: no crow.yaml in {start} or above it (up to the repository root)", file=sys.stderr)
        return 2
    project = read_project(found)
    if project.problem:
        print(f"crow: {project.problem}", file=sys.stderr)
        return 2
    compose(user, project.data, project.path)  # an invalid file is refused now, not at a prompt
    store.trust(project)
    print(f"trusted {project.path} as it is now: it {describe(project.data)}")
    print("a change to the file must be trusted again", file=sys.stderr)
    return 0


def _run_mcp(server: str, rest: list[str]) -> None:
    if server == "filesystem":
        from mcp_servers.filesystem.__main__ import main as fs_main

        fs_main(rest)
    else:
        from mcp_servers.todos.__main__ import main as todos_main

        todos_main(rest)


async def _run(args: argparse.Namespace) -> int:
    """The loop in a terminal: the answer on stdout, tool activity on stderr."""
    from crow.agent import Agent
    from crow.config import load_config
    from crow.events import Event, ModeChanged, Notice, TextDelta, ToolCallEnd, ToolCallStart
    from crow.messages import human
    from crow.startup import imports_done

    # Flags are the top layer: a project's crow.yaml cannot override them.
    overrides: dict[str, Any] = {"model": args.model} if args.model else {}
    if args.yolo:
        overrides["mode"] = "yolo"
    wrote_text = False

    async def emit(event: Event) -> None:
        nonlocal wrote_text
        # The model's text and the tools' output share the terminal with the permission
        # questions: an escape sequence in them could hide a question (`\x1b[8m`) or fake one.
        if isinstance(event, TextDelta):
            sys.stdout.write(_printable(event.text) if sys.stdout.isatty() else event.text)
            sys.stdout.flush()
            wrote_text = True
        elif isinstance(event, ToolCallStart):
            from crow.acp.view import tool_title

            print(f"\n→ {_printable(tool_title(event.call, event.spec))}", file=sys.stderr)
        elif isinstance(event, ToolCallEnd):
            mark = "✗" if event.result.is_error else "✓"
            first = (event.result.text.splitlines() or [""])[0][:120]
            print(f"  {mark} {_printable(first)}", file=sys.stderr)
        elif isinstance(event, Notice):
            print(event.text, file=sys.stderr)
        elif isinstance(event, ModeChanged):
            print(f"  mode: {event.mode}", file=sys.stderr)

    async with Agent(load_config(args.config, overrides=overrides)) as agent:
        agent.on_ready(imports_done)
        agent.warm_up()
        session = agent.create_session(args.cwd)
        if sys.stdin.isatty():
            session.client = TerminalClient(args.cwd)
        result = await agent.prompt(session, human(" ".join(args.prompt)), emit)
        if wrote_text:
            sys.stdout.write("\n")
        return 1 if result.error else 0


class TerminalClient:
    """`crow run`'s stand-in for an editor: permission prompts on the terminal, one at a
    time, each naming its call and showing the command or the change. Only what is typed
    after a question appears answers it (earlier input is discarded)."""

    can_read = can_write = can_terminal = False
    KEYS: ClassVar[dict[str, str]] = {
        "allow_once": "y",
        "allow_always": "a",
        "allow_always_folder": "f",
        "allow_always_project": "p",
        "reject_once": "n",
        "reject_always": "v",
    }

    def __init__(self, cwd: str, fd: int = 0) -> None:
        self.cwd = cwd
        self.fd = fd
        self._lock: Any = None

    async def ask_permission(
        self, call: Any, *, options: Any = None, spec: Any = None, timeout: float = 600.0
    ) -> str | None:
        import anyio

        from crow.acp.client import DEFAULT_CHOICES

        options = list(options or DEFAULT_CHOICES)
        keys = {self.KEYS.get(o.id, str(n)): o.id for n, o in enumerate(options, 1)}
        labels = {o.id: o.label for o in options}
        menu = _printable("  ".join(f"[{k}] {labels[i]}" for k, i in keys.items()))
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            with anyio.move_on_after(timeout):
                self._discard_typed_ahead()
                print(_printable(_question(call, self.cwd, spec)), file=sys.stderr)
                prompt = f"  {menu}\n  Answer for {_call_name(call, spec)}: "
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
                    prompt = f"  Please answer one of {', '.join(keys)} for {_call_name(call, spec)}: "
            return None

    async def ask(
        self,
        call: Any,
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

        lines = [f"\n{title}\n", _printable(text).rstrip(), ""]
        lines += [f"  [{n}] {label}" for n, (_, label, _) in enumerate(options, 1)]
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            with anyio.move_on_after(timeout):
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

    def _discard_typed_ahead(self) -> None:
        import termios

        self._buffer = b""
        if os.isatty(self.fd):
            termios.tcflush(self.fd, termios.TCIFLUSH)

    async def _readline(self) -> str | None:
        import anyio

        while b"\n" not in self._buffer:
            await anyio.wait_readable(self.fd)
            try:
                chunk = os.read(self.fd, 4096)
            except BlockingIOError:
                continue
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode(errors="replace")


def _printable(text: str) -> str:
    """The model's text as the terminal should show it: a control character (`\\r`, an
    escape sequence) could hide part of a command or fake the options below it."""
    return "".join(c if c.isprintable() or c in "\n\t" else f"\\x{ord(c):02x}" for c in text)


def _call_name(call: Any, spec: Any = None) -> str:
    from crow.acp.view import tool_title

    return f"{tool_title(call, spec)!r} (call {call.id})"


def _question(call: Any, cwd: str, spec: Any = None) -> str:
    """The call and what it would do: the command, a unified diff, or its arguments."""
    import difflib

    from crow.acp.view import current_text, tool_title

    args = call.args
    lines = [f"\nAllow {tool_title(call, spec)}?"]
    kind = spec.kind if spec is not None else "other"
    path = args.get("path") if isinstance(args.get("path"), str) else None
    writes = isinstance(args.get("content"), str)  # a whole file, else old_text -> new_text
    if kind == "execute":
        lines.append(f"  $ {args.get('command', '')}")
    elif kind == "edit" and path and (writes or isinstance(args.get("new_text"), str)):
        if writes:
            old = current_text(os.path.join(cwd, path))
            new = str(args.get("content", ""))
        else:
            old, new = str(args.get("old_text", "")), str(args.get("new_text", ""))
        diff = list(
            difflib.unified_diff(
                (old or "").splitlines(), new.splitlines(), f"a/{path}", f"b/{path}", lineterm=""
            )
        )
        if old is None and writes:
            if os.path.lexists(os.path.join(cwd, path)):
                diff[0:2] = [f"--- a/{path} (exists; binary or over 1 MB, not shown)", f"+++ b/{path}"]
            else:
                diff[0:2] = ["--- /dev/null", f"+++ b/{path} (new file)"]
        shown = diff[:60]
        lines.extend(f"  {d}" for d in shown)
        if len(diff) > len(shown):
            lines.append(f"  … {len(diff) - len(shown)} more lines")
    else:
        for key, value in args.items():
            text = value if isinstance(value, str) else repr(value)
            lines.append(f"  {key}: {text if len(text) <= 200 else text[:197] + '...'}")
    return "\n".join(lines)
