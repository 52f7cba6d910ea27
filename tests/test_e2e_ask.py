"""End to end: the model asks the user (`ask_user`, builtin_hooks/ask.py).

A client that shows forms (`elicitation.form`) gets `elicitation/create` tied to the tool
call, and the user's answer is the tool's result in the next model request; the official
TypeScript client proves the shapes. A client without forms gets a question with options
as `session/request_permission`, one option per choice; a free-text question ends the turn
with the question as the answer. A cancel while the user is asked settles everything, and
bad input from the model or from a hostile client gets a clear result."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import acp
import anyio
import pytest

from builtin_hooks.ask import DECLINED, DISMISSED, ENDS_TURN
from tests.conftest import CROW, RecordingClient, crow_env, initialize_125, spawn_crow
from tests.llm_server import RecordedRequest, Reply, ScriptedLLM
from tests.support.ts_client import run_script
from tests.test_e2e_cancel_while_asking import SlowToAnswer as SlowPermission
from tests.test_e2e_zed_details import as_timeline, call, crow_wrote, story

pytestmark = pytest.mark.anyio

DB = ["Postgres", "SQLite", "DuckDB"]


def result_of(request: RecordedRequest, call_id: str) -> str:
    """The tool result the model got for `call_id`."""
    found = [m["content"] for m in request.messages if m["role"] == "tool" and m["tool_call_id"] == call_id]
    assert len(found) == 1, request.messages
    return found[0]


def ask(id: str, question: str, **more: Any) -> Reply:
    return Reply(tool_calls=[call("ask_user", id, question=question, **more)])


async def new_session(conn: Any, workspace: Path, forms: bool) -> str:
    if forms:
        await initialize_125(conn)
    else:
        await conn.initialize(protocol_version=1)
    return (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id


async def prompt(conn: Any, sid: str, text: str = "go") -> Any:
    return await conn.prompt(session_id=sid, prompt=[acp.text_block(text)])


# ------------------------------------------------------------------ the TypeScript client


def test_the_typescript_client_answers_a_form_and_the_model_reads_the_answer(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """A choice, a free-text answer, several choices, a declined form: each is the tool's
    result in the next model request; each form is tied to its session and tool call."""
    llm.push(
        ask("c1", "Which database?", options=DB),
        Reply(text="SQLite it is"),
        ask("t1", "What should the function be called?"),
        Reply(text="renamed"),
        ask("m1", "Which checks should run?", options=["lint", "types", "tests"], multiple=True),
        Reply(text="running them"),
        ask("d1", "May I delete the cache?"),
        Reply(text="left alone"),
    )
    prompt = {"sessionId": "${s.sessionId}", "prompt": [{"type": "text", "text": "go"}]}
    out = run_script(
        {
            "capabilities": {"elicitation": {"form": {}}},
            "elicitations": [
                {"action": "accept", "content": {"answer": "SQLite"}},
                {"action": "accept", "content": {"answer": "frobnicate"}},
                {"action": "accept", "content": {"answer": ["tests", "lint"]}},
                {"action": "decline"},
            ],
            "steps": [
                {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "s"},
                *({"request": "session/prompt", "params": prompt, "as": f"p{n}"} for n in range(4)),
            ],
        },
        crow_env(llm, home),
        workspace,
    )
    for n in range(4):
        assert out["results"][f"p{n}"]["result"]["stopReason"] == "end_turn", out["results"]
    forms = [r["params"] for r in out["requests"] if r["method"] == "elicitation/create"]
    sid = out["results"]["s"]["result"]["sessionId"]
    assert [(f["sessionId"], f["toolCallId"], f["mode"]) for f in forms] == [
        (sid, "c1", "form"),
        (sid, "t1", "form"),
        (sid, "m1", "form"),
        (sid, "d1", "form"),
    ]
    assert [f["message"] for f in forms] == [
        "Which database?",
        "What should the function be called?",
        "Which checks should run?",
        "May I delete the cache?",
    ]
    fields = [f["requestedSchema"]["properties"]["answer"] for f in forms]
    assert fields[0]["type"] == "string" and fields[0]["enum"] == DB
    assert fields[1]["type"] == "string" and "enum" not in fields[1]
    assert fields[2]["type"] == "array" and fields[2]["items"] == {
        "type": "string",
        "enum": ["lint", "types", "tests"],
    }
    assert all(f["requestedSchema"]["required"] == ["answer"] for f in forms)
    # the model's next request carries the answer
    asked = {"c1": 1, "t1": 3, "m1": 5, "d1": 7}
    results = {cid: result_of(llm.requests[n], cid) for cid, n in asked.items()}
    assert results == {
        "c1": 'The user chose "SQLite".',
        "t1": "The user answered:\nfrobnicate",
        "m1": 'The user chose: "tests", "lint".',
        "d1": DECLINED,
    }
    # no permission question for the tool itself, and the calls end completed
    assert not [r for r in out["requests"] if r["method"] == "session/request_permission"]
    timeline = [(m["method"], m["params"]) for m in out["timeline"]]
    for cid in asked:
        assert story(timeline, cid)[-1] == "update:completed", story(timeline, cid)
    start = next(u["update"] for u in out["updates"] if u["update"].get("toolCallId") == "c1")
    assert start["title"] == "Ask: Which database?" and start["kind"] == "other"


# ------------------------------------------------------------------ without forms


class Chooser(RecordingClient):
    """Answers a permission question with the option named `choice` (None: cancelled)."""

    def __init__(self, choice: str | None) -> None:
        super().__init__()
        self.choice = choice

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any
    ) -> Any:
        from acp.schema import AllowedOutcome, DeniedOutcome, RequestPermissionResponse

        self.permission_requests.append((tool_call, options))
        chosen = next((o for o in options if o.name == self.choice), None)
        if chosen is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=chosen.option_id)
        )


async def test_without_forms_a_question_with_options_is_a_permission_question(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(
        ask("c1", "Which database?", options=DB),
        Reply(text="ok"),
        ask("m1", "Which checks?", options=["lint", "tests"], multiple=True),
        Reply(text="ok"),
        ask("s1", "Which database?", options=DB),
        Reply(text="ok"),
    )
    client = Chooser("SQLite")
    async with spawn_crow(crow_env(llm, home), client=client, unstable=True) as (conn, _proc, _):
        sid = await new_session(conn, workspace, forms=False)
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
        client.choice = "tests"
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
        client.choice = "Skip the question"
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
    assert len(client.permission_requests) == 3  # the questions only: none for the tool itself
    tool_call, options = client.permission_requests[0]
    assert tool_call.tool_call_id == "c1" and tool_call.title == "Ask: Which database?"
    assert [(o.name, o.kind) for o in options] == [
        ("Postgres", "allow_once"),
        ("SQLite", "allow_once"),
        ("DuckDB", "allow_once"),
        ("Skip the question", "reject_once"),
    ]
    assert "Which database?" in tool_call.content[0].content.text
    assert result_of(llm.requests[1], "c1") == 'The user chose "SQLite".'
    multiple = result_of(llm.requests[3], "m1")
    assert multiple.startswith('The user chose "tests". Only one could be picked'), multiple
    assert result_of(llm.requests[5], "s1") == DECLINED


async def test_without_forms_a_free_text_question_ends_the_turn_with_the_question(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """The question is the turn's answer (agent text, stored), the model is not called
    again in that turn, and the user's reply comes as the next prompt after a valid history;
    in plan mode too, with no permission question."""
    llm.push(ask("t1", "What should the function be called?"), Reply(text="renamed to frobnicate"))
    client = RecordingClient()
    async with spawn_crow(crow_env(llm, home), client=client, unstable=True) as (conn, _proc, _):
        sid = await new_session(conn, workspace, forms=False)
        await conn.set_session_mode(session_id=sid, mode_id="plan")
        first = await prompt(conn, sid, "rename it")
        assert first.stop_reason == "end_turn"
        assert len(llm.requests) == 1  # the question answered the turn's second model call
        assert client.text(sid) == "What should the function be called?"
        timeline = as_timeline(crow_wrote(client))
        assert story(timeline, "t1")[-1] == "update:completed"
        assert (await prompt(conn, sid, "frobnicate")).stop_reason == "end_turn"
    assert client.permission_requests == []
    history = llm.requests[1].messages
    assert [m["role"] for m in history[-4:]] == ["assistant", "tool", "assistant", "user"]
    assert history[-4]["tool_calls"][0]["id"] == "t1"
    assert history[-3]["content"] == ENDS_TURN
    assert history[-2]["content"] == "What should the function be called?"
    assert history[-1]["content"] == "frobnicate"


async def test_nobody_attached_a_question_with_options_ends_the_turn_listing_them(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """`crow run` in a script has no client to ask: the question and its options are the
    output."""
    llm.push(ask("c1", "Which database?", options=DB))
    proc = await anyio.run_process(
        [*CROW, "run", "--cwd", str(workspace), "go"],
        env=crow_env(llm, home),
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().strip() == "Which database?\n\n- Postgres\n- SQLite\n- DuckDB"
    assert len(llm.requests) == 1


# ------------------------------------------------------------------ cancel while asked


class SlowToAnswer(SlowPermission):
    """Never answers a permission question until cancelled, nor a form."""

    async def create_elicitation(self, message: str, mode: Any, **kwargs: Any) -> Any:
        self.asked.set()
        await anyio.sleep(30)
        raise AssertionError("unreachable: the form is withdrawn first")


@pytest.mark.parametrize("forms", [True, False], ids=["form", "permission"])
async def test_a_cancel_while_the_user_is_asked_settles_the_question(
    llm: ScriptedLLM, home: Path, workspace: Path, forms: bool
) -> None:
    llm.push(ask("c1", "Which database?", options=DB), Reply(text="after"))
    client = SlowToAnswer()
    async with spawn_crow(crow_env(llm, home), client=client, unstable=True) as (conn, _proc, _):
        sid = await new_session(conn, workspace, forms)
        answers: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                answers.append(await prompt(conn, sid))

            tg.start_soon(run)
            with anyio.fail_after(20):
                await client.asked.wait()
            await conn.cancel(session_id=sid)
        assert answers[0].stop_reason == "cancelled"
        wrote = crow_wrote(client)
        seen = story(as_timeline(wrote), "c1")
        assert seen[-1] == "update:failed", seen
        if forms:  # the form's request is cancelled by its id
            asked = next(m for m in wrote if m["method"] == "elicitation/create")
            cancels = [m["params"] for m in wrote if m["method"] == "$/cancel_request"]
            assert cancels == [{"requestId": asked["id"]}]
        ok = await prompt(conn, sid, "again")
        assert ok.stop_reason == "end_turn"
    assert "Cancelled by the user" in result_of(llm.requests[1], "c1")


# ------------------------------------------------------------------ bad input


class Hostile(RecordingClient):
    """Answers each form with the next of `answers`, as raw JSON."""

    def __init__(self, answers: list[Any]) -> None:
        super().__init__()
        self.answers = answers
        self.forms: list[Any] = []

    async def create_elicitation(self, message: str, mode: Any, **kwargs: Any) -> Any:
        self.forms.append(mode)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


async def test_answers_that_do_not_fit_the_form_are_refused_with_the_reason(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    hostile = [
        {"action": "accept", "content": {"answer": "MySQL"}},  # not an option
        {"action": "accept", "content": {"answer": 5}},  # not text
        {"action": "accept"},  # no content
        {"action": "accept", "content": {"answer": "SQLite", "extra": True}},  # fits; extra ignored
        {"action": "_snooze"},  # an action crow does not know
        {"action": "cancel"},
    ]
    expected = [
        "Error: The editor sent an answer that does not fit the question ('MySQL' is not one of the options)",
        "Error: The editor sent an answer that does not fit the question (`answer` is 5, not text)",
        "Error: The editor sent an answer that does not fit the question (it has no `answer`)",
        'The user chose "SQLite".',
        "Error: The editor answered with '_snooze', which crow does not know",
        DISMISSED,
    ]
    for n in range(len(hostile)):
        llm.push(ask(f"h{n}", "Which database?", options=DB), Reply(text="ok"))
    more = [
        (
            {"action": "accept", "content": [1, 2]},
            "Error: The editor sent an answer that does not fit the question (it has no `answer`)",
        ),
        ("yes", DISMISSED),  # not an answer object at all
        (acp.RequestError.internal_error({"details": "form broke"}), DISMISSED),
    ]
    for n, (answer, want) in enumerate(more, len(hostile)):
        llm.push(ask(f"h{n}", "Which database?", options=DB), Reply(text="ok"))
        hostile.append(answer)
        expected.append(want)
    llm.push(ask("mm", "Which?", options=DB, multiple=True), Reply(text="ok"))
    hostile.append({"action": "accept", "content": {"answer": ["SQLite", "Oracle"]}})
    expected.append(
        "Error: The editor sent an answer that does not fit the question ('Oracle' is not one of the options)"
    )
    llm.push(ask("tt", "Any notes?"), Reply(text="ok"))
    hostile.append({"action": "accept", "content": {"answer": "n" * 50_000}})
    expected.append("The user answered:\n" + "n" * 10_000 + "\n[cut: the answer was 50,000 characters]")
    client = Hostile(hostile)
    async with spawn_crow(crow_env(llm, home), client=client, unstable=True) as (conn, _proc, _):
        sid = await new_session(conn, workspace, forms=True)
        for _ in expected:
            assert (await prompt(conn, sid)).stop_reason == "end_turn"
    ids = [*(f"h{n}" for n in range(len(expected) - 2)), "mm", "tt"]
    got = [result_of(llm.requests[2 * n + 1], cid) for n, cid in enumerate(ids)]
    for text, want in zip(got, expected, strict=True):
        assert text.startswith(want), (text, want)


async def test_bad_questions_from_the_model_get_clear_results_and_nobody_is_asked(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    bad = {
        "b1": {"question": "  "},
        "b2": {"question": "Which?", "options": "Postgres, SQLite"},
        "b3": {"question": "Which?", "options": ["Postgres", 7]},
        "b4": {"question": "Which?", "options": [f"o{n}" for n in range(11)]},
        "b5": {"question": "Which?", "multiple": True},
        "b6": {"question": "Which?", "options": ["a", "a "]},
        "b7": {"question": "Which?", "options": ["only"]},
        "b8": {"question": "x" * 2001},
    }
    llm.push(Reply(tool_calls=[call("ask_user", cid, **args) for cid, args in bad.items()]), Reply(text="ok"))
    client = Hostile([])
    async with spawn_crow(crow_env(llm, home), client=client, unstable=True) as (conn, _proc, _):
        sid = await new_session(conn, workspace, forms=True)
        assert (await prompt(conn, sid)).stop_reason == "end_turn"
    assert client.forms == [] and client.permission_requests == []
    got = {cid: result_of(llm.requests[1], cid) for cid in bad}
    wanted = {
        "b1": "`question` is empty",
        "b2": "`options`: input should be a valid list (got 'Postgres, SQLite')",
        "b3": "`options[1]`: input should be a valid string (got 7)",
        "b4": "11 options are too many; give at most 10",
        "b5": "`multiple` needs `options`",
        "b6": "two options are the same",
        "b7": "give at least 2 `options`",
        "b8": "`question` is 2,001 characters",
    }
    for cid, want in wanted.items():
        assert got[cid].startswith("Error: ") and want in got[cid], (cid, got[cid])


# ------------------------------------------------------------------ crow run on a terminal


async def test_the_terminal_client_fills_in_a_form(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Choices by number (a wrong one asked again), several at once, text, a yes or no; an
    empty line declines; the end of input cancels."""
    import os

    from builtin_hooks.ask import Question
    from crow.editor import EditorClient
    from crow.terminal import TerminalClient

    one, many, text = Question("Which?", tuple(DB)), Question("Which?", tuple(DB), True), Question("Name?")
    flag = {"type": "object", "properties": {"ok": {"type": "boolean", "title": "Go ahead"}}}
    read, write = os.pipe()
    try:
        client = TerminalClient(str(workspace), fd=read)
        assert isinstance(client, EditorClient) and client.can_elicit
        answers = []
        for typed, schema in [
            (b"7\nSQLite\n2\n", one.schema()),
            (b"3, 1\n", many.schema()),
            (b"call it \x1b[2Jfrob\n", text.schema()),
            (b"maybe\nn\n", flag),
            (b"\n", one.schema()),
        ]:
            os.write(write, typed)
            answers.append(await client.elicit(None, "Which database?", schema, timeout=10))
        os.close(write)
        answers.append(await client.elicit(None, "Which database?", one.schema(), timeout=10))
    finally:
        os.close(read)
    assert [(a.action, a.content) for a in answers] == [
        ("accept", {"answer": "SQLite"}),
        ("accept", {"answer": ["DuckDB", "Postgres"]}),
        ("accept", {"answer": "call it \x1b[2Jfrob"}),
        ("accept", {"ok": False}),
        ("decline", None),
        ("cancel", None),
    ]
    shown = capsys.readouterr().err
    assert "[2] SQLite" in shown and shown.count("Please answer with 1-3.") == 2, shown
    assert "Please answer with y or n." in shown


def test_crow_run_on_a_terminal_asks_the_question_there(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    import os
    import select
    import time

    from tests.test_terminal_prompts import crow_run_on_a_terminal

    llm.push(ask("c1", "Which database?", options=DB), Reply(text="SQLite it is"))
    out = b""
    with crow_run_on_a_terminal(llm, home, workspace) as (proc, master):
        deadline = time.monotonic() + 30
        while b"Choose one (1-3" not in out and time.monotonic() < deadline:
            if select.select([master], [], [], 0.1)[0]:
                out += os.read(master, 65536)
        assert b"Which database?" in out and b"[3] DuckDB" in out, out
        os.write(master, b"2\n")
        proc.wait(timeout=20)
    assert proc.returncode == 0
    assert result_of(llm.requests[1], "c1") == 'The user chose "SQLite".'


async def test_a_form_unanswered_in_time_is_withdrawn_and_the_model_told(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (home / "config.yaml").write_text("hooks:\n  settings:\n    ask:\n      timeout: 0.5\n")
    llm.push(ask("c1", "Which database?", options=DB), Reply(text="ok"))
    client = SlowToAnswer()
    async with spawn_crow(crow_env(llm, home), client=client, unstable=True) as (conn, _proc, _):
        sid = await new_session(conn, workspace, forms=True)
        with anyio.fail_after(20):
            assert (await prompt(conn, sid)).stop_reason == "end_turn"
        wrote = crow_wrote(client)
        asked = next(m for m in wrote if m["method"] == "elicitation/create")
        assert [m["params"] for m in wrote if m["method"] == "$/cancel_request"] == [
            {"requestId": asked["id"]}
        ]
    assert result_of(llm.requests[1], "c1") == DISMISSED
