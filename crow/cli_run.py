"""`crow run`: one prompt for a script. The answer goes to stdout (`crow.run_output`: text,
json or stream-json); the session id, tool activity and notices to stderr.

The prompt is the words given, or stdin read whole (`crow run -`, UTF-8). Questions
(permissions, forms) are asked on the terminal only when stdin is one: piped, a call that
needs the user's permission is refused, and the model is told so (exit 4 when that ended
the turn). Ctrl-C cancels the turn; the history stays valid for `--continue` (exit 130).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

import anyio

from crow.errors import ConfigError

if TYPE_CHECKING:
    from crow.session import Session

# The exit statuses are listed in `crow run --help` (crow.cli) and `run_output.exit_status`.


def run(args: argparse.Namespace) -> int:
    """`crow run`, whatever ends it: json and stream-json output end with the result object
    even when no turn result came (an error raised before or instead of it: exit 2 or a
    crow failure; Ctrl-C before the turn began), so a script parsing stdout always gets one."""
    import asyncio

    from crow.run_output import Ending

    ending = Ending(args.output)
    try:
        return asyncio.run(main(args, ending))
    except (KeyboardInterrupt, Exception) as exc:  # re-raised: cli.py prints it, sets the status
        if not isinstance(exc, BrokenPipeError):
            ending.fail(exc)
        raise


async def main(args: argparse.Namespace, ending: Any = None) -> int:
    from crow import run_output
    from crow.agent import Agent
    from crow.config import load_config
    from crow.errors import AuthRequired
    from crow.events import Event
    from crow.loop import TurnResult
    from crow.messages import human
    from crow.notices import cause_of
    from crow.pricing import USAGE_TOTAL
    from crow.roots import editor_cwd
    from crow.session_lookup import open_session
    from crow.startup import imports_done
    from crow.terminal import TerminalClient, drop_stdout, on_sigint

    ending = ending or run_output.Ending(args.output)
    if sys.stdout is None:  # `>&-`: nobody can read the answer; no turn is paid for
        raise ConfigError("crow run: stdout is closed; redirect it to /dev/null to discard the answer")
    prompt = _prompt(args.prompt)
    # Flags are the top layer: a project's crow.yaml cannot override them.
    overrides: dict[str, Any] = {"model": args.model} if args.model else {}
    if args.yolo:
        overrides["mode"] = "yolo"
    tracker = run_output.Tracker()
    async with Agent(load_config(args.config, overrides=overrides)) as agent:
        agent.on_ready(imports_done)
        agent.warm_up()
        session = await open_session(agent, args.cwd, cont=args.cont, resume=args.resume, yolo=args.yolo)
        ending.session_id = session.id
        await _announce(agent, session, args.output)  # before the screen's live part starts
        out = _output(args.output, str(session.cwd))
        # not with `-`: the terminal's input was read to its end (crow run --help)
        if sys.stdin is not None and sys.stdin.isatty() and args.prompt != ["-"]:
            # a question stops the live part while it is up: it would draw over it
            paused = out.renderer.paused if isinstance(out, run_output.OnTerminal) else None
            session.client = TerminalClient(editor_cwd(session), paused=paused)
        usage_before, cost_before = session.state.get(USAGE_TOTAL), session.cost

        scope = anyio.CancelScope()
        reader_gone = False

        async def emit(event: Event) -> None:
            nonlocal reader_gone
            tracker.see(event)
            if reader_gone:
                return
            try:
                await out.emit(event)
            except BrokenPipeError:  # `crow run ... | head`: the turn ends as if cancelled
                reader_gone = True
                scope.cancel()

        result = None
        with scope:
            undo = on_sigint(scope.cancel)
            try:
                result = await agent.prompt(session, human(prompt), emit)
            except AuthRequired as exc:  # a refused key is a failed model call (exit 1), told already
                result = TurnResult("end_turn", str(exc.cause), cause_of(exc.cause))
            finally:
                undo()
        if reader_gone:
            ending.written = True  # nobody to write it for
            drop_stdout()
            print("crow: stdout was closed: the turn was cancelled", file=sys.stderr)
            return 141
        report = _report(session, result, tracker.answer, usage_before, cost_before)
        ending.written = True
        out.finish(report, result)
        if result is None:
            print("crow: cancelled", file=sys.stderr)
        return run_output.exit_status(result, tracker.refused)


def _prompt(words: list[str]) -> str:
    """The prompt: the words, or all of stdin for `-`. Empty or undecodable: exit 2."""
    if words != ["-"]:
        text = " ".join(words)
    elif sys.stdin is None:
        raise ConfigError("crow run -: stdin is closed; give the prompt as words instead")
    else:
        if sys.stdin.isatty():  # a person types it: say how it ends, else it looks like a hang
            print("crow run -: type the prompt, then Ctrl-D", file=sys.stderr, flush=True)
        data = sys.stdin.buffer.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"crow run -: the prompt on stdin is not UTF-8 (byte {exc.start})") from exc
    if not text.strip():
        raise ConfigError(
            "crow run: the prompt is empty" + (" (stdin had nothing)" if words == ["-"] else "")
        )
    return text


def _output(kind: str, cwd: str) -> Any:
    from crow import run_output

    if kind == "json":
        return run_output.OneObject()
    if kind == "stream-json":
        return run_output.Stream()
    return run_output.OnTerminal(cwd) if sys.stdout.isatty() else run_output.PlainText()


async def _announce(agent: Any, session: Session, kind: str) -> None:
    """The session's id on stderr (and in the stream), first: a script can resume it."""
    from crow.session_lookup import SHORT_ID

    await agent.ready()
    short = (await agent.store.short_ids([session.id], SHORT_ID)).get(session.id, session.id)
    more = "…" if short != session.id else ""
    print(f"session {short}{more} · crow run --resume {short} to continue", file=sys.stderr, flush=True)
    if kind == "stream-json":
        from crow.run_output import write_json

        write_json({"type": "session", "session_id": session.id, "short_id": short, "cwd": str(session.cwd)})


def _report(
    session: Session, result: Any, answer: str, usage_before: Any, cost_before: float | None
) -> dict[str, Any]:
    """What json output ends with (stream-json's `result` too)."""
    from crow.llm.base import Usage
    from crow.pricing import USAGE_TOTAL

    total: Usage = session.state.get(USAGE_TOTAL) or Usage()
    before: Usage = usage_before or Usage()
    cost = None if cost_before is None or session.cost is None else round(session.cost - cost_before, 9)
    report: dict[str, Any] = {
        "session_id": session.id,
        "stop_reason": "cancelled" if result is None else result.stop_reason,
        "answer": answer,
        "usage": {
            "input_tokens": total.input_tokens - before.input_tokens,
            "output_tokens": total.output_tokens - before.output_tokens,
            "cache_read_tokens": total.cache_read_tokens - before.cache_read_tokens,
            "cache_write_tokens": total.cache_write_tokens - before.cache_write_tokens,
        },
        "cost": cost,
    }
    if result is not None and result.error:
        report.update(error=result.error, cause=result.cause)
    return report
