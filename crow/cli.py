"""The `crow` command.

    crow                      on a terminal: chat (below); piped: serve ACP over stdio
    crow serve                serve ACP over stdio, always (what an editor launches)
    crow serve --listen ws://HOST:PORT   ACP over WebSocket, for many clients (crow.acp.ws)
    crow chat                 the interactive front end in the terminal (crow.tui)
    crow run "PROMPT" | -     one prompt for scripts: the answer on stdout (crow.cli_run)
    crow mcp filesystem|todos run a builtin MCP server over stdio
    crow sessions ...         list / show / delete / export / rewind / migrate stored sessions
    crow compact SESSION_ID   compact a stored session
    crow trust [DIR]          apply DIR's crow.yaml (as it is now) to sessions there
    crow untrust [DIR]        stop applying it; `crow trust --list` shows what is trusted
    crow login / logout       store (checked) / forget a provider API key in CROW_HOME
    crow --version            print the version

Only argparse and logging are imported before the command is known: the ACP path must
answer `initialize` fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


class _Printable(logging.Formatter):
    """Log lines with control characters spelled out: a log names files of a repository
    that may be hostile (`x\x1b[8m.md`), and stderr may be the user's terminal."""

    def format(self, record: logging.LogRecord) -> str:
        from crow.terminal import printable

        return printable(super().format(record))


def _setup_logging(level: str | None, log_file: str | None) -> None:
    # stdout belongs to the protocol: logs go to stderr or a file, configured before
    # anything (MCPServer calls logging.basicConfig) can claim the root logger.
    handler: logging.Handler = (
        logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(_Printable("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel((level or os.environ.get("CROW_LOG_LEVEL") or "WARNING").upper())


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="crow", description="ACP coding-agent server")
    p.add_argument("--config", help="your YAML config file (default: $CROW_HOME/config.yaml)")
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING (default; or CROW_LOG_LEVEL)")
    p.add_argument("--log-file", help="write logs here instead of stderr")
    p.add_argument("--version", action="version", version=f"crow {_version()}")
    sub = p.add_subparsers(dest="command")
    serve = sub.add_parser("serve", help="serve ACP over stdio (the default when stdio is not a terminal)")
    serve.add_argument(
        "--listen",
        metavar="URL",
        help="serve ACP over WebSocket instead, to any number of clients: ws://HOST:PORT, or wss://HOST:PORT"
        " with --tls-cert/--tls-key (PORT 0: any free port; crow prints the one it took on stderr)."
        " Clients send Authorization: Bearer TOKEN, the token from CROW_SERVER_TOKEN or --token-file",
    )
    serve.add_argument("--token-file", metavar="PATH", help="the clients' token (a file only you may read)")
    serve.add_argument("--tls-cert", metavar="FILE", help="wss://: the server's certificate chain (PEM)")
    serve.add_argument("--tls-key", metavar="FILE", help="wss://: its private key (PEM)")
    serve.add_argument(
        "--ping-interval",
        metavar="SECONDS",
        type=float,
        help="WebSocket keepalive: ping each client this often, and drop one that does not answer"
        " (or read) within it (default 20)",
    )
    serve.add_argument(
        "--max-connections",
        metavar="N",
        type=int,
        help="WebSocket: clients served at once; one more is told 503 at its handshake (default 100)",
    )
    chat = sub.add_parser("chat", help="talk to crow in the terminal (the default on a terminal)")
    _session_flags(chat)
    run = sub.add_parser(
        "run",
        help="run one prompt for a script: the answer on stdout",
        description="Run one prompt. The answer goes to stdout, the session id, tool activity and"
        " notices to stderr. Questions are asked only when stdin is a terminal (not with -).",
        epilog=_RUN_EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("prompt", nargs="+", help="the prompt's words, or - to read it from stdin")
    _session_flags(run)
    run.add_argument(
        "--output",
        choices=["text", "json", "stream-json"],
        default="text",
        help="text (default), json (one object at the end) or stream-json (one object per line)",
    )
    mcp = sub.add_parser("mcp", help="run a builtin MCP server over stdio")
    mcp.add_argument("server", choices=["filesystem", "todos"])
    mcp.add_argument("rest", nargs=argparse.REMAINDER)
    sessions = sub.add_parser("sessions", help="manage stored sessions")
    sessions.add_argument("action", choices=["list", "show", "delete", "export", "rewind", "migrate"])
    sessions.add_argument("session_id", nargs="?")
    sessions.add_argument("turns", nargs="?", help="rewind: how many turns to take back (default 1)")
    sessions.add_argument("--cwd", help="only sessions of this workspace (list)")
    sessions.add_argument(
        "--to",
        metavar="URL",
        help="migrate: the postgresql:// database to copy into (default: CROW_STORE); with no password in it",
    )
    compact = sub.add_parser("compact", help="compact a stored session")
    compact.add_argument("session_id")
    compact.add_argument("instructions", nargs="*")
    trust = sub.add_parser("trust", help="trust a project's crow.yaml (found from DIR up to the repo root)")
    trust.add_argument("dir", nargs="?", default=os.getcwd())
    trust.add_argument("--list", action="store_true", help="list the trusted project folders")
    untrust = sub.add_parser("untrust", help="stop trusting a project's crow.yaml")
    untrust.add_argument("dir", nargs="?", default=os.getcwd())
    login = sub.add_parser("login", help="check a provider API key and store it in CROW_HOME (0600)")
    login.add_argument("--provider", help="openai, anthropic, or a provider of your config (default: ask)")
    login.add_argument("--base-url", help="the server the key is for (default: the provider's)")
    login.add_argument("--key-stdin", action="store_true", help="read the key from stdin (scripts)")
    login.add_argument("--no-verify", action="store_true", help="store the key without checking it")
    sub.add_parser("logout", help="forget the API keys crow login stored")
    return p


_RUN_EXIT_STATUS = """exit status:
  0    the turn ended normally
  1    the model call failed, a refused API key too (the error is on stderr, and in json
       output)
  2    a usage, configuration or session error (an empty prompt, an unknown or ambiguous
       --resume ID, no session to --continue, a session busy in another crow, a broken
       plugin, stdout closed); json output still ends with the object, its error and cause
  3    the turn stopped short: max_turn_requests or max_tokens reached, or the model refused
  4    a tool call was refused permission (by you, by a rule or the mode, or because nobody
       could be asked: stdin is not a terminal) in the turn's last tool round (a
       subagent's: in its own last), and then the model ended the turn
  130  Ctrl-C cancelled the turn (the history stays valid: crow run --continue goes on)
  141  stdout was closed early (a reader such as head went away)"""


def _session_flags(p: argparse.ArgumentParser) -> None:
    """The flags `crow chat` and `crow run` share: where, which model, which session."""
    p.add_argument("--cwd", default=os.getcwd(), help="workspace (default: current directory)")
    p.add_argument("--model", help="provider:model, overrides CROW_MODEL")
    p.add_argument("--yolo", action="store_true", help="allow edits and commands without asking")
    which = p.add_mutually_exclusive_group()
    which.add_argument("-c", "--continue", dest="cont", action="store_true",
                       help="continue the last session in this folder")  # fmt: skip
    which.add_argument("-r", "--resume", metavar="ID", help="continue session ID (any unique prefix)")


def _version() -> str:
    from crow import __version__  # the package is loaded already: this costs nothing

    return __version__


def main(argv: list[str] | None = None) -> None:
    """Every command; a reader that closes stdout early (`crow sessions list | head -1`)
    ends it quietly with status 141 (128 + SIGPIPE, as a shell tool killed by it), a
    Ctrl-C with 130."""
    from crow import interrupts

    _closed_std_fds()
    replaced = interrupts.quit_on_interrupt()
    try:
        try:
            _command(argv)
        finally:
            interrupts.give_back(replaced)
            if sys.stdout is not None and not sys.stdout.closed:  # ACP's transport closes it
                sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
    except BrokenPipeError:
        from crow.terminal import drop_stdout

        drop_stdout()
        sys.exit(141)
    except KeyboardInterrupt:  # Ctrl-C in a command that lets it raise (run, serve, sessions):
        sys.exit(130)  # it leaves as interrupted, without a traceback


def _closed_std_fds() -> None:
    """A standard stream started closed (`2>&-`): /dev/null takes its descriptor, so that no
    file crow opens (the session store) gets it and receives what a child process writes
    to its stderr. stderr gets a writer on it: with `sys.stderr` None, `print(...,
    file=sys.stderr)` writes to stdout, into `crow run`'s answer or its JSON. stdin and
    stdout stay None: `crow run` refuses them with a message."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.dup2(null := os.open(os.devnull, os.O_RDWR), fd)
            if null != fd:
                os.close(null)
            if fd == 2:
                sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)


def _command(argv: list[str] | None) -> None:
    args = _parser().parse_args(argv)
    _setup_logging(args.log_level, args.log_file)
    command = args.command or ("chat" if _on_a_terminal() else "serve")
    if command == "chat" and not args.command:  # bare `crow`: chat's flags at their defaults
        args = _parser().parse_args([*(argv if argv is not None else sys.argv[1:]), "chat"])
    if command == "mcp":
        from crow.interrupts import interrupts_raise

        interrupts_raise()
        _run_mcp(args.server, args.rest)
        return
    if command in ("serve", "run", "chat"):
        import asyncio

        from crow.startup import configure_process

        configure_process()
    from crow.errors import CrowError
    from crow.interrupts import interrupts_raise

    if command != "chat":  # the chat claims SIGINT itself once it can take a Ctrl-C
        interrupts_raise()
    try:
        if command == "serve":
            asyncio.run(_serve(args))
        elif command == "run":
            from crow import cli_run

            args.cwd = os.path.abspath(args.cwd)
            sys.exit(cli_run.run(args))
        elif command == "chat":
            from crow.tui import chat

            args.cwd = os.path.abspath(args.cwd)
            sys.exit(asyncio.run(chat.main(args)))
        elif command in ("trust", "untrust"):
            sys.exit(_trust(args))
        elif command in ("login", "logout"):
            from crow import login

            sys.exit(login.main(args))
        else:  # sessions, compact: no event loop unless compacting (as cheap as --help)
            from crow import cli_sessions

            if getattr(args, "cwd", None):  # stored folders are absolute: `--cwd .` matched none
                args.cwd = os.path.abspath(args.cwd)

            sys.exit(cli_sessions.main(args))
    except CrowError as exc:
        print(f"crow: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


def _on_a_terminal() -> bool:
    """Bare `crow` chats when a person is at a terminal (stdin and stdout both ttys); an
    editor launches it with pipes, and gets ACP."""
    try:
        return os.isatty(0) and os.isatty(1)
    except OSError:
        return False


async def _serve(args: argparse.Namespace) -> None:
    from crow.acp.server import serve
    from crow.agent import Agent
    from crow.config import load_config
    from crow.errors import ConfigError
    from crow.startup import imports_done

    listen = getattr(args, "listen", None)  # None for a bare `crow` (no serve flags)
    flags = ("token_file", "tls_cert", "tls_key", "ping_interval", "max_connections")
    if listen is None and (given := [f for f in flags if getattr(args, f, None) is not None]):
        raise ConfigError(f"--{given[0].replace('_', '-')} goes with --listen")
    if listen is not None:
        from crow.acp import ws

        where = ws.listen_address(listen, args.tls_cert, args.tls_key)  # before anything starts
        token = ws.server_token(args.token_file)
        interval = ws.PING_INTERVAL if args.ping_interval is None else args.ping_interval
        if not interval > 0:
            raise ConfigError("--ping-interval must be a positive number of seconds")
        most = ws.MAX_CONNECTIONS if args.max_connections is None else args.max_connections
        if most < 1:
            raise ConfigError("--max-connections must be 1 or more")
    agent = Agent(load_config(args.config))
    agent.on_ready(imports_done)  # a broken plugin or store must not leave the GC paused either
    if listen is None:
        await serve(agent)
    else:
        await ws.serve_websocket(agent, where, token, interval, most)


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

        fs_main(rest, prog="crow mcp filesystem")
    else:
        from mcp_servers.todos.__main__ import main as todos_main

        todos_main(rest, prog="crow mcp todos")
