"""`crow chat`: the interactive session in a terminal. The user types (`prompt_input`,
prompt_toolkit), crow answers (`crow.tui.render.Renderer`); a prompt is `Agent.prompt`, so
the slash commands are the editor's. The chat's own commands (`chat_commands`: /help,
/exit, /expand, /clear) never reach the agent.

Start-up shows the banner and the prompt at once: the agent warms up in the background
and the first prompt waits for it. Ctrl-C cancels the running turn (`TurnControl`); a
second one while it is being cancelled exits. A closed terminal (its SIGHUP, the EIO of a
read or write, or during a turn its hangup as it happens) cancels what runs and exits quietly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import logging
import os
import select
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import anyio

from crow.tui.chat_commands import TerminalCommands

if TYPE_CHECKING:
    from crow.agent import Agent
    from crow.events import Event
    from crow.session import Session
    from crow.tui.render import Renderer

log = logging.getLogger("crow.chat")
HANGUP_STATUS = 128 + signal.SIGHUP  # what a shell reports for a program its terminal left


class TurnControl:
    """The running turn, for whoever must stop it: Ctrl-C (SIGINT) and the question
    pickers, which read Ctrl-C as a key (`cancel` is their `on_interrupt`)."""

    def __init__(self) -> None:
        self._scope: anyio.CancelScope | None = None
        self.quit = False  # Ctrl-C again while the turn was being cancelled: leave after it

    @property
    def running(self) -> bool:
        return self._scope is not None

    @contextlib.contextmanager
    def run(self) -> Iterator[anyio.CancelScope]:
        with anyio.CancelScope() as scope:
            self._scope = scope
            try:
                yield scope
            finally:
                self._scope = None

    def cancel(self) -> None:
        """Cancel the running turn; asked again while it is being cancelled, also exit."""
        if self._scope is None:
            return
        if self._scope.cancel_called:
            self.quit = True
        self._scope.cancel()


class Chat:
    def __init__(self, agent: Agent, session: Session, renderer: Renderer, cwd: str) -> None:
        from crow.private import crow_home
        from crow.tui.prompt_input import ChatInput

        self.agent, self.renderer, self.cwd = agent, renderer, cwd
        self.turns = TurnControl()
        self.commands = TerminalCommands(self)
        self.input = ChatInput(crow_home(), self.commands.offered, self.expand)
        self.hung_up = False
        self.armed = False  # a Ctrl-C asked to leave: one more exits (the prompt shows the hint)
        self._whole = anyio.CancelScope()  # the chat's life: a hangup cancels it
        self.session = session

    async def use(self, session: Session) -> None:
        """Chat in `session` from now on: its questions asked on this terminal, its
        commands, once gathered, offered to an open completion menu."""
        from crow import command_catalog
        from crow.roots import editor_cwd
        from crow.tui.questions import ChatClient

        self.session = session
        session.client = ChatClient(editor_cwd(session), self.renderer, self.turns.cancel)
        await command_catalog.watch(session, self._commands_changed, command_catalog.listed(session))

    async def _commands_changed(self, event: Event) -> None:
        self.input.commands_changed()

    async def run(self, *, resumed: bool) -> int:
        from crow.tui.chat_screen import banner, recap
        from crow.tui.prompt_input import logs_through_sys_stderr

        logs_through_sys_stderr()
        await self.use(self.session)
        banner(self.renderer, self.agent, self.session)
        if resumed:
            recap(self.renderer, self.session)
        try:
            with self._whole:
                await self._converse()
        except OSError as exc:  # the terminal went away before its SIGHUP was handled
            if not _terminal_lost(exc):
                raise
            self._hang_up()
        finally:
            loop = asyncio.get_running_loop()
            loop.remove_signal_handler(signal.SIGINT)
            loop.remove_signal_handler(signal.SIGHUP)
        return HANGUP_STATUS if self.hung_up else 0

    def _claim_signals(self) -> None:
        """SIGINT and SIGHUP are the chat's (prompt_toolkit is told to leave SIGINT alone):
        a Ctrl-C between two prompts must not become a KeyboardInterrupt. Claimed again
        before each prompt and turn: an Application run with `handle_sigint` (a picker)
        removes the handler it displaced when it ends."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, self._sigint)
        loop.add_signal_handler(signal.SIGHUP, self._hang_up)

    async def _converse(self) -> None:
        while not self.turns.quit:
            self._claim_signals()
            armed, self.armed = self.armed, False
            text = await self.input.read(armed=armed)
            if text is None:
                return
            if not text.strip():
                continue
            if await self.commands.handle(text):
                if self.commands.leaving:
                    return
                continue
            await self.turn(text)

    async def turn(self, text: str) -> None:
        from crow.errors import CrowError
        from crow.messages import human
        from crow.tui.prompt_input import keys_unechoed

        self._claim_signals()
        self.renderer.start_turn()
        result, problem = None, None
        with keys_unechoed(), self.turns.run() as scope:
            async with self._hangup_watched():
                try:
                    result = await self.agent.prompt(self.session, human(text), self._emit)
                except CrowError as exc:  # SessionBusy, a broken plugin or setting: said, the chat goes on
                    problem = str(exc)
                except Exception as exc:
                    if _terminal_lost(exc):  # the answer could not be shown: the terminal is gone
                        self._hang_up()
                        return
                    problem = f"crow failed: {type(exc).__name__}: {exc}"
                    log.error("the prompt failed: %s", problem)
                    log.debug("the prompt failed", exc_info=True)  # a bug's traceback: not over the screen
        if self.hung_up:
            return
        self.renderer.end_turn(result, cancelled=scope.cancelled_caught)
        self.armed = scope.cancelled_caught  # the Ctrl-C that cancelled it was the first of two
        if problem:
            self.renderer.error(problem)

    @contextlib.asynccontextmanager
    async def _hangup_watched(self) -> AsyncIterator[None]:
        """Inside, the terminal's hangup ends the chat as it happens (`_hang_up`). A turn may
        write nothing for long (the model silent, a tool running) and the live part's writes
        cannot tell: once the terminal hung up, `isatty()` fails, so rich takes its output for
        a file and stops drawing `Live` instead of failing; the shell may keep its SIGHUP
        from crow (`trap "" HUP`)."""

        async def watch() -> None:
            await hangup(0)
            self._hang_up()

        async with anyio.create_task_group() as watching:
            watching.start_soon(watch)
            yield
            watching.cancel_scope.cancel()

    async def _emit(self, event: Event) -> None:
        try:
            await self.renderer.emit(event)
        except OSError as exc:  # the terminal is gone: the turn ends as a cancelled one
            if not _terminal_lost(exc):
                raise
            self._hang_up()

    def expand(self) -> None:
        """Ctrl-O and /expand: what the last turn folded away, printed in full."""
        if not self.renderer.expand():
            self.renderer.info("Nothing to expand.")

    def _sigint(self) -> None:
        if self.turns.running:
            self.turns.cancel()
        else:  # a `kill -INT`, or the key pressed before the prompt took the terminal
            self.input.interrupt()  # (no callback runs between a turn and the next prompt)

    def _hang_up(self) -> None:
        """The terminal is gone: nothing more can be shown or typed. What runs is cancelled
        (the turn ends as a cancelled one does, its history valid), then crow exits."""
        self.hung_up = True
        _detach_terminal()
        self.turns.cancel()
        self._whole.cancel()


async def main(args: argparse.Namespace) -> int:
    from crow.agent import Agent
    from crow.config import load_config
    from crow.session_lookup import open_session
    from crow.startup import imports_done
    from crow.tui.render import Renderer

    if not (os.isatty(0) and os.isatty(1)):  # prompt_toolkit would half-work on a pipe
        print("crow: crow chat needs a terminal; for a script use crow run PROMPT (or -)", file=sys.stderr)
        return 2
    overrides: dict[str, Any] = {"model": args.model} if args.model else {}
    if args.yolo:
        overrides["mode"] = "yolo"
    async with Agent(load_config(args.config, overrides=overrides)) as agent:
        agent.on_ready(imports_done)
        agent.warm_up()  # not awaited: the prompt shows now, the first prompt waits for it
        session = await open_session(agent, args.cwd, cont=args.cont, resume=args.resume, yolo=args.yolo)
        cwd = str(session.cwd)  # a resumed session keeps its own folder
        chat = Chat(agent, session, Renderer(cwd=cwd), cwd)
        return await chat.run(resumed=bool(args.cont or args.resume))


def _terminal_lost(exc: BaseException) -> bool:
    """A write to (or read of) a terminal that was closed: EIO."""
    return isinstance(exc, OSError) and exc.errno == errno.EIO


async def hangup(fd: int) -> None:
    """Return once the terminal on `fd` hangs up (its other side closed: the window, tmux or
    ssh went away). An epoll asked for no event reports only EPOLLHUP and EPOLLERR: the
    keys typed do not wake it, and stay for whoever reads them (a question's picker). Never
    returns without epoll (not Linux) or for an fd epoll cannot watch: there the terminal's
    SIGHUP, or the EIO of a read or write, says it is gone."""
    if hasattr(select, "epoll"):
        with select.epoll() as watch:
            try:
                watch.register(fd, 0)
            except OSError:  # not pollable (a regular file): no hangup to wait for
                pass
            else:
                await anyio.wait_readable(watch.fileno())
                return
    await anyio.sleep_forever()


def _detach_terminal() -> None:
    """stdin, stdout and stderr onto /dev/null: the last writes (prompt_toolkit restoring
    the terminal, the renderer, a log line) then land nowhere instead of raising EIO."""
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
