"""The chat's own slash commands: handled in the terminal, never sent to the agent, and
offered for completion beside the session's (`crow.command_catalog`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from crow.terminal import printable

if TYPE_CHECKING:
    from crow.prompting import Command
    from crow.tui.chat import Chat

log = logging.getLogger("crow.chat")

TERMINAL_COMMANDS = {
    "help": "List the commands",
    "expand": "Show what the last turn folded away (also Ctrl-O)",
    "clear": "Start a new session in this folder (the current one is kept)",
    "exit": "Leave crow (also Ctrl-D)",
    "quit": "Leave crow (also Ctrl-D)",
}


class TerminalCommands:
    def __init__(self, chat: Chat) -> None:
        self.chat = chat
        self.leaving = False  # /exit or /quit was typed

    def session_commands(self) -> list[Command]:
        """The session's commands: the builtins and /init at once, the rest (prompt files,
        skills, MCP prompts) once the session's tools are ready and its catalog gathered."""
        from crow import command_catalog

        seen: dict[str, Command] = {}
        for command in [*command_catalog.listed(self.chat.session), *command_catalog.builtin_commands()]:
            if command.name not in TERMINAL_COMMANDS:  # never offered: the terminal's win
                seen.setdefault(command.name, command)
        return list(seen.values())

    def offered(self) -> list[tuple[str, str]]:
        """(name, description) of every command, for completion."""
        return [*TERMINAL_COMMANDS.items(), *((c.name, c.description) for c in self.session_commands())]

    async def handle(self, text: str) -> bool:
        """Run `text` when it is one of the terminal's commands (then True)."""
        words = text.split(maxsplit=1)
        name = words[0][1:] if words and words[0].startswith("/") else ""
        if name not in TERMINAL_COMMANDS:
            return False
        if name in ("exit", "quit"):
            self.leaving = True
        elif name == "help":
            self.help()
        elif name == "expand":
            self.chat.expand()
        elif name == "clear":
            await self.clear()
        return True

    def help(self) -> None:
        info = self.chat.renderer.info
        info("In this terminal:")
        for name, description in TERMINAL_COMMANDS.items():
            info(f"  /{name:<12} {description}")
        info("Commands of the session:")
        for command in self.session_commands():
            hint = f" [{command.hint}]" if command.hint else ""
            info(printable(f"  /{command.name:<12} {command.description}{hint}"))
        info("Keys: Enter sends; Alt-Enter, Ctrl-J or a trailing \\ start a new line; ↑/↓ history;")
        info("      Tab completes a /command; Ctrl-C cancels a turn or clears the line; Ctrl-D exits.")

    async def clear(self) -> None:
        chat = self.chat
        old = chat.session
        await chat.use(chat.agent.create_session(chat.cwd))
        try:
            await chat.agent.close_session(old.id)  # its tools (MCP servers) stop; it stays stored
        except Exception:
            log.exception("closing session %s", old.id)
        chat.renderer.info(
            f"New session {chat.session.id[:8]}; the previous one is kept: crow chat --resume {old.id[:8]}"
        )
