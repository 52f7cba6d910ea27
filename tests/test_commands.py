"""Slash-command sources without a model: prompt files read as a hostile repository may
ship them, arguments as Claude Code expands them, MCP prompt arguments from a line."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from crow import prompt_files
from crow.commands import expand_arguments, split_arguments
from crow.errors import CommandError
from crow.mcp_prompts import as_message, prompt_arguments

pytestmark = pytest.mark.anyio


def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(data, bytes) else path.write_text)(data)  # type: ignore[operator]
    return path


def test_arguments_follow_claude_codes_prompt_files() -> None:
    assert expand_arguments("Fix #$1 with $2 priority", "123 high") == "Fix #123 with high priority"
    assert expand_arguments("All: $ARGUMENTS.", 'a "b c"') == 'All: a "b c".'
    assert expand_arguments("[$1] [$2] [$3]", 'a "b c"') == "[a] [b c] []"
    assert expand_arguments("$ARGUMENTS[0]+$ARGUMENTS[1]", "x y") == "x+y"
    assert expand_arguments("Costs $10 and $0, not $1x", "a") == "Costs  and $0, not $1x"
    assert expand_arguments("No placeholder.", "extra words") == "No placeholder.\n\nARGUMENTS: extra words"
    assert expand_arguments("No placeholder.", "  ") == "No placeholder."
    assert split_arguments('unbalanced "quote here') == ["unbalanced", '"quote', "here"]


def test_a_hostile_repository_costs_only_its_bad_files(tmp_path: Path) -> None:
    cwd, home = tmp_path / "repo", tmp_path / "home"
    folder = cwd / ".crow" / "commands"
    write(folder / "good.md", "---\ndescription: Good\n---\nbody\n")
    write(folder / "nested" / "deep.md", "Deep one\n")
    write(folder / "binary.md", b"\x00\x01\x02ELF")
    write(folder / "latin1.md", "caf\xe9".encode("latin-1"))
    write(folder / "huge.md", "x" * (prompt_files.MAX_BYTES + 1))
    write(folder / "badyaml.md", "---\ndescription: [never closed\n---\n")
    write(folder / "unclosed.md", "---\ndescription: x\n")
    write(folder / "notmap.md", "---\n- a\n---\n")
    write(folder / "wrongtype.md", "---\ndescription: [1, 2]\n---\n")
    write(folder / "has space.md", "x")
    write(tmp_path / "secret.md", "---\ndescription: outside\n---\nsecret\n")
    (folder / "escape.md").symlink_to(tmp_path / "secret.md")
    (folder / "loop").symlink_to(folder)
    os.mkfifo(folder / "fifo.md")
    deep = folder / "a" / "b" / "c" / "d" / "e"
    write(deep / "too-deep.md", "x")
    write(folder / "inside.md", "Inside\n")
    (folder / "alias.md").symlink_to(folder / "inside.md")
    commands, problems = prompt_files.scan(cwd, home)
    names = {c.name: c for c in commands}
    assert sorted(names) == ["alias", "good", "inside", "nested:deep"]
    assert names["nested:deep"].description == "Deep one" and names["good"].origin == "project"
    said = "\n".join(problems)
    for why in (
        "binary.md: binary content",
        "latin1.md: not UTF-8",
        "huge.md: over 256 KB",
        "badyaml.md: invalid YAML",
        "unclosed.md: frontmatter has no closing",
        "notmap.md: expected a mapping",
        "wrongtype.md: 'description' must be text",
        "'has space' is not a command name",
        "escape.md: a symlink out of",
        "fifo.md: not a regular file",
        "folders deeper than 4",
    ):
        assert why in said, why
    assert "secret" not in "".join(c.description for c in commands)


def test_a_project_commands_folder_linked_out_of_the_project_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    write(elsewhere / "secret.md", "---\ndescription: from outside\n---\nx\n")
    (tmp_path / "repo" / ".claude").mkdir(parents=True)
    (tmp_path / "repo" / ".claude" / "commands").symlink_to(elsewhere)
    commands, problems = prompt_files.scan(tmp_path / "repo", tmp_path / "home")
    assert commands == [] and problems == [
        f"{tmp_path}/repo/.claude/commands: a symlink out of the project; skipped"
    ]
    (tmp_path / "home").symlink_to(tmp_path / "elsewhere-home")
    write(tmp_path / "elsewhere-home" / "commands" / "mine.md", "Mine\n")
    [mine], _ = prompt_files.scan(tmp_path / "repo", tmp_path / "home")
    assert mine.name == "mine", "the user's own folder may be a link (dotfiles)"


def test_an_unchanged_file_is_not_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / ".crow/commands/a.md", "A\n")
    prompt_files.scan(tmp_path, tmp_path / "home")
    reads: list[str] = []
    real = prompt_files.read_text_file
    monkeypatch.setattr(prompt_files, "read_text_file", lambda p: reads.append(p) or real(p))
    prompt_files.scan(tmp_path, tmp_path / "home")
    assert reads == []
    write(tmp_path / ".crow/commands/a.md", "A changed, longer\n")
    [command], _ = prompt_files.scan(tmp_path, tmp_path / "home")
    assert command.description == "A changed, longer" and len(reads) == 1


async def test_a_prompt_file_broken_after_listing_refuses_with_its_reason(tmp_path: Path) -> None:
    path = write(tmp_path / ".crow/commands/a.md", "Use $1\n")
    [command], _ = prompt_files.scan(tmp_path, tmp_path / "home")
    assert await command.expand("x") == "Use x"
    path.write_bytes(b"\x00junk")
    with pytest.raises(CommandError, match="binary content"):
        await command.expand("x")


def test_mcp_prompt_arguments_by_name_or_position() -> None:
    declared = [SimpleNamespace(name="city", required=True), SimpleNamespace(name="units", required=False)]
    assert prompt_arguments("Paris", declared, "w.now") == {"city": "Paris"}
    assert prompt_arguments('"New York" metric', declared, "w.now") == {"city": "New York", "units": "metric"}
    assert prompt_arguments('units=imperial city="Los Angeles"', declared, "w.now") == {
        "city": "Los Angeles",
        "units": "imperial",
    }
    assert prompt_arguments("units=metric Oslo", declared, "w.now") == {"city": "Oslo", "units": "metric"}
    assert prompt_arguments("a=b", declared, "w.now") == {"city": "a=b"}, "an undeclared name is a value"
    with pytest.raises(
        CommandError, match=r"missing required argument 'city'; usage: /w.now city=… \[units=…\]"
    ):
        prompt_arguments("units=metric", declared, "w.now")
    with pytest.raises(CommandError, match="too many arguments \\('c'\\)"):
        prompt_arguments("a b c", declared, "w.now")
    with pytest.raises(CommandError, match="given twice"):
        prompt_arguments("city=a city=b", declared, "w.now")


def test_an_mcp_prompts_messages_become_one_prompt() -> None:
    from mcp.types import (
        EmbeddedResource,
        GetPromptResult,
        ImageContent,
        PromptMessage,
        ResourceLink,
        TextContent,
        TextResourceContents,
    )

    def said(role: str, content: object) -> PromptMessage:
        return PromptMessage(role=role, content=content)  # type: ignore[arg-type]

    result = GetPromptResult(
        messages=[
            said("user", TextContent(type="text", text="Look at this")),
            said("user", ImageContent(type="image", data="not base64!", mime_type="image/png")),
            said(
                "user",
                EmbeddedResource(
                    type="resource",
                    resource=TextResourceContents(uri="file:///a.txt", text="A", mime_type=None),
                ),
            ),
            said("user", ResourceLink(type="resource_link", uri="file:///b.txt", name="b.txt")),
            said("assistant", TextContent(type="text", text="I will.")),
        ]
    )
    message = as_message(result)
    assert message.images == ()
    assert message.content.split("\n\n") == [
        "Look at this",
        message.content.split("\n\n")[1],
        '<context ref="file:///a.txt">\nA\n</context>',
        "[@b.txt](file:///b.txt)",
        "Assistant: I will.",
    ]
    assert message.content.split("\n\n")[1].startswith("[an image was removed here:")
    with pytest.raises(CommandError, match="empty prompt"):
        as_message(GetPromptResult(messages=[]))


async def test_precedence_and_a_failing_hook(tmp_path: Path) -> None:
    """builtin > project > user > mcp whatever the order offered; a hook whose commands()
    raises costs its own commands only, and is named."""
    from types import SimpleNamespace

    from crow import Hook, PromptCommand
    from crow.command_catalog import gather
    from crow.config import Config
    from crow.hooks import HookRegistry
    from crow.session import Session

    async def text(rest: str) -> str:
        return rest

    class Offers(Hook):
        name = "offers"

        async def before_agent(self, ctx: object) -> None: ...

        def commands(self, session: Session) -> list[PromptCommand]:
            return [
                PromptCommand("same", "from mcp", text, scope="mcp", origin="MCP server m"),
                PromptCommand("same", "from the user", text, scope="user", origin="user"),
                PromptCommand("compact", "not the builtin", text, scope="project"),
                PromptCommand("init", "not /init either", text, scope="project"),
                PromptCommand("bad name", "skipped", text),
            ]

    class Broken(Hook):
        name = "broken"

        async def before_agent(self, ctx: object) -> None: ...

        def commands(self, session: Session) -> list[PromptCommand]:
            raise RuntimeError("boom")

    write(tmp_path / "home" / "commands" / "mine.md", "Mine\n")
    write(tmp_path / ".claude" / "commands" / "same.md", "---\ndescription: the project's\n---\nP\n")
    hooks = HookRegistry()
    hooks.register(Broken())
    hooks.register(Offers())
    agent = SimpleNamespace(config=Config(home=str(tmp_path / "home")), hooks=hooks)
    found, problems = await gather(agent, Session("s", tmp_path))  # type: ignore[arg-type]
    assert {n: c.description for n, c in found.items()} == {
        "init": "Write or update AGENTS.md from a look at the project",
        "same": "the project's",
        "mine": "Mine",
    }
    assert problems == [
        "hook 'broken' could not list its commands: boom",
        "hook 'offers': 'bad name' is no command name; skipped",
    ]


async def test_an_ordinary_prompt_gathers_the_commands_beside_its_turn_at_most_once_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt that starts with `/` gathers the commands before it (a file added a moment
    ago is found); any other prompt gathers them beside its turn, at most once a second, so
    a script's rapid prompts do not pay a scan each and a person's always see the change."""
    from crow import command_catalog
    from crow.agent import Agent
    from crow.config import Config
    from crow.events import CommandsChanged, Event
    from crow.llm.base import ModelRequest, ModelResponse, ScriptedProvider
    from crow.messages import ai, human

    def answer(request: ModelRequest) -> ModelResponse:
        return ModelResponse(ai("ok"))

    events: list[Event] = []

    async def emit(event: Event) -> None:
        events.append(event)

    def advertised() -> list[list[str]]:
        return [[c.name for c in e.commands] for e in events if isinstance(e, CommandsChanged)]

    folder = tmp_path / "ws" / ".crow" / "commands"
    folder.mkdir(parents=True)
    agent = Agent(Config(home=tmp_path / "home"), provider=ScriptedProvider(answer), builtin_hooks=False)
    async with agent:
        session = agent.create_session(tmp_path / "ws")
        await agent.prompt(session, human("first"), emit)
        (folder / "later.md").write_text("---\ndescription: Added later\n---\nLater.\n")
        await agent.prompt(session, human("second, within the second"), emit)
        assert not any("later" in names for names in advertised()), "gathered again within a second"
        monkeypatch.setattr(command_catalog, "REFRESH_EVERY", 0.0)  # a second has passed
        await agent.prompt(session, human("third"), emit)
        assert "later" in advertised()[-1], "an ordinary prompt a second later gathers beside its turn"
        (folder / "soon.md").write_text("---\ndescription: Soon\n---\nSoon.\n")
        monkeypatch.setattr(command_catalog, "REFRESH_EVERY", 3600.0)
        await agent.prompt(session, human("/soon"), emit)
        assert "soon" in advertised()[-1], "a prompt starting with / always gathers first"


def test_a_file_read_in_short_pieces_is_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read may return less than asked (FUSE, network file systems, /proc): the file is
    read to its end, not cut at the first piece."""
    path = write(tmp_path / "a.md", "line\n" * 1000)
    real = os.read
    monkeypatch.setattr(prompt_files.os, "read", lambda fd, n: real(fd, min(n, 100)))
    assert prompt_files.read_text_file(path) == "line\n" * 1000
