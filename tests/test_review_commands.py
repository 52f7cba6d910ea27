"""Slash commands under attack (review of issue 14): an MCP server whose prompts/get hangs,
whose prompts change in a storm, whose prompt declares huge arguments; builtins typed
with odd whitespace."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import acp
import pytest

from tests.conftest import crow_env, spawn_crow
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec
from tests.test_e2e_commands import advertised, latest, support_server

pytestmark = pytest.mark.anyio

HOSTILE = support_server("hostile", "hostile_prompts_mcp.py")


async def test_a_hanging_mcp_prompt_is_cancelled_and_the_session_goes_on(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.default = lambda r: Reply(text="fine")
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[HOSTILE])).session_id
        await advertised(client, "hostile.hang")
        task = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("/hostile.hang")]))
        await asyncio.sleep(1.0)
        assert not task.done()
        started = time.monotonic()
        await conn.cancel(session_id=sid)
        response = await asyncio.wait_for(task, 10)
        assert response.stop_reason == "cancelled" and time.monotonic() - started < 5
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("/hostile.fine")])
        assert response.stop_reason == "end_turn" and llm.requests[-1].last_user_text == "Fine."
        asked = len(llm.requests)
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("/hostile.boom")])
        assert response.stop_reason == "end_turn" and len(llm.requests) == asked, "refused: no turn"
        assert "MCP server 'hostile' refused prompt 'boom'" in client.text(), client.text()


async def test_a_list_changed_storm_does_not_flood_the_editor(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Reply(tool_calls=[ToolCallSpec("storm", {"seconds": 3.0})]), Reply(text="ok"))
    async with spawn_crow(crow_env(llm, home, CROW_MODE="yolo")) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[HOSTILE])).session_id
        await advertised(client, "hostile.hang")
        before = len(client.of_type("AvailableCommandsUpdate"))
        await conn.prompt(session_id=sid, prompt=[acp.text_block("storm")])
        last = int(llm.requests[-1].json["messages"][-1]["content"].split()[1])  # "changed N times"
        for _ in range(100):  # the last change is still listed
            if f"hostile.p{last}" in latest(client):
                break
            await asyncio.sleep(0.05)
        assert [n for n in latest(client) if n.startswith("hostile.p")] == [f"hostile.p{last}"]
        sent = len(client.of_type("AvailableCommandsUpdate")) - before
    assert last > 500 and sent <= 8, f"{sent} available_commands_update for {last} changes in 3 s"


async def test_an_mcp_prompts_hint_is_bounded(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        await conn.new_session(cwd=str(workspace), mcp_servers=[HOSTILE])
        commands = await advertised(client, "hostile.wide")
    description, hint = commands["hostile.wide"]
    assert len(hint) <= 200 and len(description) <= 250, len(hint)


async def test_taking_back_a_slash_command_names_what_the_user_typed(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    from tests.conftest import raw_request

    (workspace / ".crow/commands").mkdir(parents=True)
    (workspace / ".crow/commands/audit.md").write_text("Audit the code under $1 with great care.\n")
    llm.default = lambda r: Reply(text="done")
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        for line in ("/audit src", "/audit lib", "/init"):
            await conn.prompt(session_id=sid, prompt=[acp.text_block(line)])
        assert llm.requests[-1].last_user_text.startswith("Look at this project")
        await conn.prompt(session_id=sid, prompt=[acp.text_block("/undo")])
        told = client.text()
        assert "“/init”" in told and "Look at this project" not in told, told
        answer = await raw_request(conn, "_crow.rewind", {"sessionId": sid, "turns": 1})
    assert [p["text"] for p in answer["prompts"]] == ["/audit lib"]
    assert "“/audit lib”" in answer["message"]


async def test_a_builtin_on_a_line_of_its_own_runs_as_a_prompt_command_does(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """`/init` followed by a new line (or a tab) and more text runs /init; the builtins
    must read the line the same way, not send `/compact\\n...` to the model as text."""
    llm.default = lambda r: Reply(text="done")
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        await conn.prompt(session_id=sid, prompt=[acp.text_block("/init\nmention the Makefile")])
        assert llm.requests[-1].last_user_text.endswith("The user adds: mention the Makefile")
        asked = len(llm.requests)
        for line in ("/compact\nkeep the API notes", "/usage\tplease", "/mcp\n\nlist them"):
            await conn.prompt(session_id=sid, prompt=[acp.text_block(line)])
        assert len(llm.requests) == asked, [r.last_user_text for r in llm.requests[asked:]]
        told = client.text()
        assert (
            "Nothing compacted" in told and "Usage: Model:" in told and "MCP servers of this session" in told
        )


def test_a_commands_folder_of_countless_entries_is_listed_only_so_far(tmp_path: Path) -> None:
    """Listed before every prompt: 20,000 empty folders and junk files cost ~0.4 s a prompt
    before the listing was bounded (MAX_ENTRIES); the user's own folder is still read."""
    import os

    from crow import prompt_files

    folder = tmp_path / "repo" / ".crow" / "commands"
    for i in range(100):
        for j in range(100):
            os.makedirs(folder / f"d{i}" / f"e{j}")
    for i in range(2000):
        (folder / f"junk{i}.txt").touch()
    (tmp_path / "home" / "commands").mkdir(parents=True)
    (tmp_path / "home" / "commands" / "mine.md").write_text("Mine\n")
    commands, problems = prompt_files.scan(tmp_path / "repo", tmp_path / "home")
    assert [c.name for c in commands] == ["mine"]
    assert problems == [f"{folder}: over {prompt_files.MAX_ENTRIES} files and folders; the rest are skipped"]


def test_crow_run_expands_a_prompt_file_and_passes_an_unknown_word(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    from tests.test_cli import crow

    (workspace / ".crow/commands").mkdir(parents=True)
    (workspace / ".crow/commands/audit.md").write_text("---\ndescription: x\n---\nAudit $1 now.\n")
    llm.default = lambda r: Reply(text="ok")
    env = crow_env(llm, home)
    done = crow("run", "/audit", "src/a.py", "--cwd", str(workspace), env=env, cwd=workspace)
    assert done.returncode == 0 and llm.requests[-1].last_user_text == "Audit src/a.py now.", done.stderr
    done = crow("run", "/usr/bin/env", "is", "missing", "--cwd", str(workspace), env=env, cwd=workspace)
    assert done.returncode == 0 and llm.requests[-1].last_user_text == "/usr/bin/env is missing"


async def test_a_server_failing_every_relisting_is_told_once(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Reply(tool_calls=[ToolCallSpec("break_listing", {"seconds": 3.0})]), Reply(text="ok"))
    llm.default = lambda r: Reply(text="fine")
    async with spawn_crow(crow_env(llm, home, CROW_MODE="yolo")) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[HOSTILE])).session_id
        await advertised(client, "hostile.hang")
        await conn.prompt(session_id=sid, prompt=[acp.text_block("break it")])
        await conn.prompt(session_id=sid, prompt=[acp.text_block("hello")])
        told = client.text().count("did not list its prompts")
    assert told == 1, f"told {told} times"


LAUGHS = """\
import resource, sys, time
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from crow import prompt_files
started = time.monotonic()
commands, problems = prompt_files.scan(Path(sys.argv[1]), Path(sys.argv[1]) / "home")
print([c.name for c in commands], problems, round(time.monotonic() - started, 1))
"""


def test_a_billion_laughs_argument_hint_is_refused_not_expanded(tmp_path: Path) -> None:
    """1 KB of YAML aliases as `argument-hint` (a list of lists of ... 9^12 words): the
    scan (before every prompt) must refuse it, not spell it out until memory runs out."""
    import subprocess

    lines = ["---", "a0: &a0 [" + ",".join(["lol"] * 9) + "]"]
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 12)]
    lines += ["argument-hint: [*a11]", "---", "body"]
    folder = tmp_path / ".crow" / "commands"
    folder.mkdir(parents=True)
    (folder / "laugh.md").write_text("\n".join(lines) + "\n")
    (folder / "fine.md").write_text("Fine\n")
    done = subprocess.run(
        [sys.executable, "-c", LAUGHS, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.startswith(
        f"""['fine'] ["{folder}/laugh.md: 'argument-hint' must be text or a list of words; skipped"]"""
    ), done.stdout


async def test_load_resume_and_fork_each_advertise_the_sessions_commands(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (workspace / ".crow/commands").mkdir(parents=True)
    (workspace / ".crow/commands/audit.md").write_text("Audit $1\n")
    llm.default = lambda r: Reply(text="ok")

    async def offered(client: object, sid: str) -> list[str]:
        for _ in range(400):
            updates = client.of_type("AvailableCommandsUpdate", sid)  # type: ignore[attr-defined]
            if updates and "audit" in (names := [c.name for c in updates[-1].available_commands]):
                return names
            await asyncio.sleep(0.05)
        raise AssertionError(f"session {sid}: /audit never advertised")

    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        await conn.prompt(session_id=sid, prompt=[acp.text_block("/audit a.py")])
    for how in ("load", "resume", "fork"):
        async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
            await conn.initialize(protocol_version=1)
            if how == "load":
                await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
                shown = sid
            elif how == "resume":
                await conn.resume_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
                shown = sid
            else:
                shown = (
                    await conn.fork_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
                ).session_id
            names = await offered(client, shown)
            first = client.of_type("AvailableCommandsUpdate", shown)[0]
            assert [c.name for c in first.available_commands] == [
                "compact",
                "undo",
                "usage",
                "mcp",
                "init",
            ], how
            assert names[:6] == ["compact", "undo", "usage", "mcp", "init", "audit"], how


def test_precedence_within_the_project_and_the_documented_limits(tmp_path: Path) -> None:
    """docs/commands.md: .crow/commands before .claude/commands; a prompt file before a
    project skill of the same name; `argument-hint` as a YAML list; 1,000 files a folder;
    a skill whose name has a space is no command."""
    import anyio

    from builtin_hooks.skills import SkillsHook
    from crow import prompt_files
    from crow.command_catalog import gather
    from crow.config import Config
    from crow.hooks import HookRegistry
    from crow.session import Session

    def write(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    write(tmp_path / ".crow/commands/same.md", "---\ndescription: crow's\n---\nC\n")
    write(tmp_path / ".claude/commands/same.md", "---\ndescription: claude's\n---\nX\n")
    write(
        tmp_path / ".claude/commands/tidy.md",
        "---\ndescription: the file\nargument-hint: [path, depth]\n---\nT\n",
    )
    write(tmp_path / ".crow/skills/tidy/SKILL.md", "---\nname: tidy\ndescription: the skill\n---\nS\n")
    write(tmp_path / ".crow/skills/spaced/SKILL.md", "---\nname: two words\ndescription: spaced\n---\nS\n")
    hooks = HookRegistry()
    hooks.register(SkillsHook(home=tmp_path / "home"))
    agent = type("A", (), {"config": Config(home=str(tmp_path / "home")), "hooks": hooks})()
    found, _ = anyio.run(gather, agent, Session("s", tmp_path))
    assert {n: (c.description, c.hint) for n, c in found.items() if n != "init"} == {
        "same": ("crow's", ""),
        "tidy": ("the file", "[path] [depth]"),
    }
    many = tmp_path / "many"
    for i in range(prompt_files.MAX_FILES + 5):
        write(many / ".crow/commands" / f"c{i:04}.md", "x\n")
    commands, problems = prompt_files.scan(many, tmp_path / "home")
    assert len(commands) == prompt_files.MAX_FILES == 1000
    assert problems == [f"{many}/.crow/commands: over 1000 prompt files; the rest are skipped"]


async def test_a_prompt_file_that_expands_to_nothing_is_refused(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """A prompt file of frontmatter only: no empty user message reaches the model (the
    Anthropic API refuses one, and an editor's empty prompt is refused too)."""
    (workspace / ".crow/commands").mkdir(parents=True)
    (workspace / ".crow/commands/hollow.md").write_text("---\ndescription: nothing inside\n---\n")
    llm.default = lambda r: Reply(text="ok")
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("/hollow")])
        assert response.stop_reason == "end_turn" and llm.requests == []
        assert "/hollow expanded to an empty prompt" in client.text()
        await conn.prompt(session_id=sid, prompt=[acp.text_block("/hollow with words")])
        assert llm.requests[-1].last_user_text == "ARGUMENTS: with words"


def test_crow_run_shows_a_notice_without_its_control_characters(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """A hostile repository names a prompt file with an escape sequence; the warning naming
    it must not reach the terminal raw (`\\x1b[8m` hides what follows, as in model text)."""
    from tests.test_cli import crow

    (workspace / ".crow/commands").mkdir(parents=True)
    (workspace / ".crow/commands/x\x1b[8mhidden.md").write_text("x\n")
    llm.default = lambda r: Reply(text="ok")
    done = crow("run", "hello", "--cwd", str(workspace), env=crow_env(llm, home), cwd=workspace)
    assert done.returncode == 0 and "is not a command name" in done.stderr, done.stderr
    assert "\x1b" not in done.stderr and "x\\x1b[8mhidden.md" in done.stderr


async def test_a_slash_command_with_an_at_mention_keeps_its_arguments_and_the_file(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """Zed sends `/review @a.py speed` as text, an embedded resource (crow advertises
    embeddedContext), text. `$1` must be the mention and `$2` the word after it, and the
    file's content must still reach the model."""
    (workspace / ".crow/commands").mkdir(parents=True)
    (workspace / ".crow/commands/review.md").write_text("Review $1, looking at $2.\n")
    llm.default = lambda r: Reply(text="ok")
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, _client):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        uri = (workspace / "a.py").as_uri()
        blocks = [
            acp.text_block("/review "),
            acp.resource_block(acp.embedded_text_resource(uri, 'print("it\'s here")')),
            acp.text_block(" speed"),
        ]
        await conn.prompt(session_id=sid, prompt=blocks)
    sent = llm.requests[-1].last_user_text
    assert sent.startswith(f"Review [@a.py]({uri}), looking at speed."), sent
    assert 'print("it\'s here")' in sent, sent
