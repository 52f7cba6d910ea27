"""Compaction: the pure cut and trigger, the CompactService against a scripted provider,
the store, and the whole loop against the scripted HTTP model server."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builtin_hooks.summarization import SummarizationHook, factory
from crow.agent import Agent
from crow.compact import (
    CompactResult,
    CompactService,
    cut_point,
    prefix_share,
    render,
    should_compact,
)
from crow.config import CompactionConfig, Config
from crow.errors import ContextLengthError, ProviderError
from crow.events import CompactionFinished, CompactionStarted, UsageUpdated
from crow.llm.base import ModelRequest, ModelResponse, ScriptedProvider, ToolSpec, Usage
from crow.messages import Message, Messages, ToolCall, ai, human, system, tool_msg, validate
from crow.session import Session
from tests.llm_server import Fault, Reply, ScriptedLLM, ToolCallSpec

pytestmark = pytest.mark.anyio

INSTRUCTION_MARK = "the conversation is about to be compacted"


# ---------------------------------------------------------------- histories
def exchange(n: int, name: str = "read_file", **args: Any) -> list[Message]:
    call = ToolCall(f"c{n}", name, args or {"path": f"f{n}.py"})
    return [ai("", call), tool_msg(call.id, name, f"contents of f{n}.py " * 20)]


def history(rounds: int) -> list[Message]:
    """user, (assistant tool call, tool result) x2, assistant text — per round."""
    out: list[Message] = []
    for r in range(rounds):
        out.append(human(f"request {r}"))
        out += exchange(2 * r) + exchange(2 * r + 1)
        out.append(ai(f"answer {r}"))
    return out


TOOLS = [
    ToolSpec(
        name,
        f"{name} does things",
        {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    )
    for name in ("ls", "read_file", "write_file", "edit_file", "glob", "grep", "execute")
]


def reply(text: str = "", *calls: ToolCall, usage: Usage | None = None) -> ModelResponse:
    return ModelResponse(ai(text, *calls), usage=usage)


# ---------------------------------------------------------------- should_compact
def test_should_compact_boundaries() -> None:
    assert not should_compact(85, 100)
    assert should_compact(86, 100)
    assert not should_compact(0, 100)
    assert should_compact(51, 100, threshold=0.5)
    assert not should_compact(50, 100, threshold=0.5)
    assert not should_compact(10**6, 0)
    assert should_compact(108_801, 128_000) and not should_compact(108_800, 128_000)


# ---------------------------------------------------------------- cut_point
def test_cut_point_too_short_means_nothing() -> None:
    assert cut_point([]) == 0
    assert cut_point([human("hi")]) == 0
    assert cut_point([human("hi"), ai("hello")]) == 0


def test_cut_point_keeps_ten_percent_at_least_two() -> None:
    plain = [human(str(i)) if i % 2 == 0 else ai(str(i)) for i in range(100)]
    assert cut_point(plain) == 90
    assert cut_point(plain[:20]) == 18
    assert cut_point(plain[:3]) == 1
    assert cut_point(plain, keep_ratio=0.5) == 50
    assert cut_point(plain[:10], min_keep=4) == 6


def test_cut_point_never_lands_on_a_tool_result() -> None:
    msgs = [human("go"), ai("a"), human("b"), *exchange(1)]
    # keep 2 would start at the tool result: the call moves into the tail with it
    assert cut_point(msgs) == 3
    parallel = [
        human("go"),
        ai("thinking"),
        human("more"),
        ai("", ToolCall("a", "ls"), ToolCall("b", "ls"), ToolCall("c", "ls")),
        tool_msg("a", "ls", "1"),
        tool_msg("b", "ls", "2"),
        tool_msg("c", "ls", "3"),
    ]
    assert cut_point(parallel) == 3
    assert cut_point(parallel[3:]) == 0  # one exchange only: nothing to summarize


def test_cut_point_with_calls_still_running_at_the_end() -> None:
    msgs = [*history(3), ai("", ToolCall("late", "ls"))]
    cut = cut_point(msgs)
    assert msgs[cut].role != "tool"
    assert msgs[-1] in msgs[cut:]


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    out: list[Message] = []
    ids = 0
    for _ in range(draw(st.integers(0, 40))):
        kind = draw(st.sampled_from(["user", "text", "tools"]))
        if kind == "user":
            out.append(human("u"))
        elif kind == "text":
            out.append(ai("t"))
        else:
            calls = []
            for _ in range(draw(st.integers(0, 3))):
                ids += 1
                calls.append(ToolCall(f"id{ids}", "ls"))
            out.append(ai("" if calls else "t", *calls))
            out += [tool_msg(c.id, "ls", "r") for c in calls]
    return out


@settings(max_examples=300, deadline=None)
@given(histories(), st.floats(0.0, 0.6), st.integers(1, 5))
def test_cut_point_property(msgs: list[Message], keep_ratio: float, min_keep: int) -> None:
    validate(msgs)
    cut = cut_point(msgs, keep_ratio, min_keep)
    assert 0 <= cut <= len(msgs)
    if cut == 0:
        return
    tail = msgs[cut:]
    assert len(tail) >= min_keep
    assert tail[0].role != "tool"
    called = {c.id for m in tail for c in m.tool_calls}
    assert all(m.tool_call_id in called for m in tail if m.role == "tool")
    validate(tail)  # the tail is a valid history on its own
    validate(msgs[:cut])  # and so is the part that gets summarized


# ---------------------------------------------------------------- helpers of the service
def test_render_cuts_old_file_writes_only() -> None:
    big = "x" * 5000
    msgs = [
        ai("", ToolCall("1", "write_file", {"path": "a.py", "content": big})),
        tool_msg("1", "write_file", "ok"),
        ai("", ToolCall("2", "edit_file", {"path": "a.py", "old_text": big, "new_text": "y"})),
        tool_msg("2", "edit_file", "ok"),
        ai("", ToolCall("3", "execute", {"command": big})),
        tool_msg("3", "execute", "done"),
    ]
    text = render(msgs, 2000)
    assert text.count("3000 more characters cut by compaction") == 2
    assert big in text  # execute's argument is not a file write: untouched


def test_prefix_share_counts_equal_leading_items() -> None:
    base = ModelRequest([system("s"), human("a" * 100), ai("b" * 100)], tools=TOOLS)
    assert prefix_share(base, None) is None
    assert prefix_share(base, base) == 1.0
    longer = base.replace(messages=[*base.messages, human("c" * 100)])
    assert 0.5 < prefix_share(longer, base) < 1.0
    other_tools = longer.replace(tools=TOOLS[:1])
    assert prefix_share(other_tools, base) == 0.0


def test_result_to_dict_is_camel_case() -> None:
    r = CompactResult(True, 10, 4, 900, 120, "sum", 0.97)
    assert r.to_dict() == {
        "compacted": True,
        "messagesBefore": 10,
        "messagesAfter": 4,
        "tokensBefore": 900,
        "tokensAfter": 120,
        "summary": "sum",
    }
    assert CompactResult(False, error="why").to_dict()["error"] == "why"


# ---------------------------------------------------------------- the service, scripted
def loop_like_session(tmp_path: Path, rounds: int = 10) -> Session:
    """A session as the loop leaves it: last_request covers all but the last exchange."""
    msgs = history(rounds)
    session = Session(id="s1", cwd=tmp_path, messages=Messages(msgs))
    session.last_request = ModelRequest(
        [system("You are crow."), *msgs[:-3]], tools=TOOLS, model="scripted", temperature=0.2
    )
    return session


def summarizer(text: str = "Goals: X. Files: a.py. Next: test.") -> ScriptedProvider:
    return ScriptedProvider(lambda req: reply(text), context_window=10_000)


async def test_cache_preserving_request_repeats_the_last_request(tmp_path: Path) -> None:
    session = loop_like_session(tmp_path)
    provider = summarizer()
    before = list(session.messages)
    result = await CompactService().compact(session, provider)

    assert result.compacted and result.error is None
    (req,) = provider.requests
    last = session.last_request
    assert last is not None
    assert list(req.messages[: len(last.messages)]) == list(last.messages)  # exact prefix
    assert list(req.messages[1:-1]) == before  # system + whole current history + the ask
    assert req.messages[-1].role == "user" and INSTRUCTION_MARK in req.messages[-1].content
    assert "under 2000 words" in req.messages[-1].content
    assert req.tool_choice == "none" and list(req.tools) == TOOLS
    assert req.model == "scripted" and req.temperature == 0.2
    assert result.prefix_share is not None and result.prefix_share >= 0.9


async def test_new_context_structure(tmp_path: Path) -> None:
    session = loop_like_session(tmp_path, rounds=10)  # 60 messages -> keep 6
    before = list(session.messages)
    events: list[Any] = []

    async def emit(e: Any) -> None:
        events.append(e)

    result = await CompactService().compact(session, summarizer("THE SUMMARY"), emit=emit)
    new = list(session.messages)
    assert new[0] == before[0]  # the first user message stays verbatim
    assert new[1].role == "user" and "<summary>\nTHE SUMMARY\n</summary>" in new[1].content
    assert "compacted" in new[1].content  # framed as a summary of earlier conversation
    assert new[2:] == before[-6:]
    validate(new)
    assert (result.messages_before, result.messages_after) == (60, 8)
    assert result.tokens_after == session.context_tokens() < result.tokens_before
    assert result.summary == "THE SUMMARY"
    assert events == [
        CompactionStarted(result.id),
        CompactionFinished(result.id, "completed", "THE SUMMARY"),
        UsageUpdated(result.tokens_after, 10_000),
    ]


async def test_tail_starting_with_an_exchange_keeps_the_call(tmp_path: Path) -> None:
    msgs = [*history(5), human("next"), *exchange(99)]
    session = Session(id="s", cwd=tmp_path, messages=Messages(msgs))
    await CompactService(CompactionConfig(keep_ratio=0.0)).compact(session, summarizer())
    assert list(session.messages[2:]) == msgs[-2:]  # the call kept with its result
    validate(session.messages)


async def test_instructions_are_included(tmp_path: Path) -> None:
    session = loop_like_session(tmp_path)
    provider = summarizer()
    await CompactService().compact(session, provider, instructions="Keep the API names.")
    assert "Keep the API names." in provider.requests[0].messages[-1].content


async def test_failing_provider_leaves_the_session_unchanged(tmp_path: Path) -> None:
    session = loop_like_session(tmp_path)
    before = list(session.messages)

    def fail(req: ModelRequest) -> ModelResponse:
        raise ProviderError("HTTP 500: boom", status=500)

    result = await CompactService().compact(session, ScriptedProvider(fail))
    assert not result.compacted and "boom" in (result.error or "")
    assert list(session.messages) == before
    assert result.messages_after == result.messages_before == len(before)


async def test_empty_summary_leaves_the_session_unchanged(tmp_path: Path) -> None:
    session = loop_like_session(tmp_path)
    before = list(session.messages)
    result = await CompactService().compact(session, summarizer("   "))
    assert not result.compacted and "empty summary" in (result.error or "")
    assert list(session.messages) == before


async def test_nothing_to_compact(tmp_path: Path) -> None:
    session = Session(id="s", cwd=tmp_path, messages=Messages([human("hi"), ai("hello")]))
    provider = summarizer()
    result = await CompactService().compact(session, provider)
    assert not result.compacted and "nothing to compact" in (result.error or "")
    assert provider.requests == []
    # the first user message alone before the cut is kept anyway: still nothing to do
    session = Session(id="s", cwd=tmp_path, messages=Messages([human("hi"), ai("a"), human("b")]))
    assert not (await CompactService().compact(session, provider)).compacted
    assert not (await CompactService().compact(session, None)).compacted


async def test_standalone_request_without_last_request(tmp_path: Path) -> None:
    big = "z" * 6000
    msgs = [
        human("build it"),
        ai("", ToolCall("w", "write_file", {"path": "a.py", "content": big})),
        tool_msg("w", "write_file", "ok"),
        *history(3),
    ]
    session = Session(id="s", cwd=tmp_path, messages=Messages(msgs))
    provider = summarizer()
    result = await CompactService().compact(session, provider)
    assert result.compacted and result.prefix_share is None
    (req,) = provider.requests
    assert not req.tools and [m.role for m in req.messages] == ["system", "user"]
    assert "4000 more characters cut by compaction" in req.messages[1].content
    assert big not in req.messages[1].content
    assert INSTRUCTION_MARK in req.messages[1].content


async def test_cache_preserving_off_sends_standalone(tmp_path: Path) -> None:
    session = loop_like_session(tmp_path)
    provider = summarizer()
    result = await CompactService(CompactionConfig(cache_preserving=False)).compact(session, provider)
    assert result.compacted and not provider.requests[0].tools
    assert result.prefix_share is not None and result.prefix_share < 0.1


async def test_context_length_falls_back_to_standalone(tmp_path: Path) -> None:
    session = loop_like_session(tmp_path)

    def handler(req: ModelRequest) -> ModelResponse:
        if req.tools:
            raise ContextLengthError("maximum context length exceeded", status=400)
        return reply("short summary")

    provider = ScriptedProvider(handler)
    result = await CompactService().compact(session, provider)
    assert result.compacted and len(provider.requests) == 2
    assert provider.requests[0].tools and not provider.requests[1].tools


async def test_compaction_requested_while_tool_calls_are_open(tmp_path: Path) -> None:
    """after_model_call asks for compaction before the tools ran: the summary request leaves
    out the open call (it is exactly the last request plus the ask), the call stays last."""
    msgs = history(6)
    last = ModelRequest([system("sys"), *msgs], tools=TOOLS)
    pending = ai("", ToolCall("open", "ls"))
    session = Session(id="s", cwd=tmp_path, messages=Messages([*msgs, pending]))
    session.last_request = last
    provider = summarizer()
    result = await CompactService().compact(session, provider)
    assert result.compacted
    req = provider.requests[0]
    assert list(req.messages[:-1]) == list(last.messages)
    assert session.messages[-1] == pending
    await session.add(tool_msg("open", "ls", "files"))
    validate(session.messages)


async def test_compactions_of_one_session_never_interleave(tmp_path: Path) -> None:
    session = loop_like_session(tmp_path)
    seen: list[int] = []

    async def slow(req: ModelRequest) -> ModelResponse:
        seen.append(len(req.messages))
        await anyio.sleep(0.05)
        return reply("summary")

    service = CompactService()
    results: list[CompactResult] = []

    async def run() -> None:
        results.append(await service.compact(session, ScriptedProvider(slow)))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        tg.start_soon(run)
    first, second = results
    assert second.messages_before == first.messages_after  # saw the first one's result
    validate(session.messages)


async def test_store_gets_the_context_and_keeps_the_transcript(tmp_path: Path) -> None:
    from crow.store import SQLiteStore

    async with SQLiteStore(":memory:") as store:
        await store.create_session(id="s1", cwd=str(tmp_path))
        session = Session(id="s1", cwd=tmp_path, store=store)
        msgs = history(10)
        await session.add(*msgs)
        session.last_request = ModelRequest([system("sys"), *msgs[:-1]], tools=TOOLS)
        result = await CompactService().compact(session, summarizer("persisted summary"))
        assert result.compacted
        assert await store.load_context("s1") == list(session.messages)
        assert "persisted summary" in (await store.load_context("s1"))[1].content
        assert await store.load_transcript("s1") == msgs


async def test_a_store_that_refuses_the_new_context_leaves_the_session_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holding the database past busy_timeout (or a full disk) when the
    summary is written: compaction used to raise StoreError into the turn ("never raises"),
    with memory compacted and the store not."""
    import sqlite3
    from contextlib import closing

    from crow.store import SQLiteStore

    # Fail fast, not in 5 s: each store job sets its busy_timeout from this.
    monkeypatch.setattr("crow.store._worker.BUSY_TIMEOUT_MS", 50)

    db = tmp_path / "crow.db"
    async with SQLiteStore(db) as store:
        await store.create_session(id="s1", cwd=str(tmp_path))
        session = Session(id="s1", cwd=tmp_path, store=store)
        msgs = history(10)
        await session.add(*msgs)
        with closing(sqlite3.connect(db, isolation_level=None)) as other:

            def summarize(request: ModelRequest) -> ModelResponse:
                other.execute("BEGIN IMMEDIATE")  # taken while the summary is written
                return reply("a summary the store will refuse")

            result = await CompactService().compact(
                session, ScriptedProvider(summarize, context_window=10_000)
            )
            other.execute("ROLLBACK")
        assert not result.compacted
        assert result.error is not None and result.error.startswith("the compacted context was not stored: ")
        assert list(session.messages) == msgs == await store.load_context("s1")
        assert session.compaction.failed_at == len(msgs)  # automatic triggers back off


# ---------------------------------------------------------------- a realistic long history
def realistic_history(n: int = 200, seed: int = 7) -> list[Message]:
    rng = random.Random(seed)
    words = "def class return import self value config path error test async await".split()

    def code(chars: int) -> str:
        return " ".join(rng.choice(words) for _ in range(chars // 6))

    out: list[Message] = [human("Add retry support to the HTTP client and tests for it. " + code(400))]
    i = 0
    while len(out) < n - 1:
        i += 1
        r = rng.random()
        if r < 0.1:
            out.append(ai(code(300)))
            out.append(human(code(200)))
            continue
        name = rng.choice(["read_file", "read_file", "grep", "edit_file", "write_file", "execute"])
        args: dict[str, Any] = {"path": f"src/mod{i}.py"}
        if name == "write_file":
            args["content"] = code(rng.randint(1000, 5000))
        elif name == "edit_file":
            args |= {"old_text": code(rng.randint(100, 800)), "new_text": code(rng.randint(100, 800))}
        call = ToolCall(f"call_{i}", name, args, raw_args=json.dumps(args))
        out.append(ai(code(rng.randint(0, 200)), call))
        size = rng.randint(200, 6000) if name in ("read_file", "grep", "execute") else 80
        out.append(tool_msg(call.id, name, code(size)))
    return out[:n]


async def test_prefix_share_on_a_realistic_200_message_history(tmp_path: Path) -> None:
    msgs = realistic_history(200)
    validate(msgs)
    session = Session(id="s", cwd=tmp_path, messages=Messages(msgs))
    # the loop's last request: everything but the last assistant message and its result
    session.last_request = ModelRequest([system("You are crow. " * 40), *msgs[:-2]], tools=TOOLS)
    result = await CompactService().compact(session, summarizer())
    assert result.compacted and result.prefix_share is not None
    print(f"prefix_share on 200 messages: {result.prefix_share:.4f}")
    assert result.prefix_share >= 0.95
    assert result.messages_after == 2 + 20


# ---------------------------------------------------------------- the hook and `due`
def hook_ctx(tokens: int, window: int = 1000, service: CompactService | None = None) -> Any:
    """A HookContext whose session's context holds about `tokens` tokens."""
    from crow.context import HookContext

    session = Session(id="s", cwd=Path("/"), messages=Messages(history(2)))
    session.last_usage, session.usage_covers = Usage(tokens, 10), len(session.messages)
    provider = ScriptedProvider(lambda req: reply("summary"), context_window=window)
    return HookContext(session, "", provider, _ignore, compactor=service or CompactService())


async def test_hook_compacts_only_when_the_loop_goes_on() -> None:
    from crow.hooks import Compact

    hook = SummarizationHook()
    with_calls = reply("", ToolCall("1", "ls"))
    assert await hook.after_model_call(hook_ctx(900), with_calls) == Compact()
    assert await hook.after_model_call(hook_ctx(900), reply("final")) is None
    assert await hook.after_model_call(hook_ctx(800), with_calls) is None
    lower = CompactService(CompactionConfig(threshold=0.5))
    assert await hook.after_model_call(hook_ctx(600, service=lower), with_calls) == Compact()
    no_service = hook_ctx(900)
    no_service.compactor = None
    assert await hook.after_model_call(no_service, with_calls) is None
    big, small = hook_ctx(900), hook_ctx(100)
    await hook.before_agent(big)
    await hook.before_agent(small)
    assert big.session.messages[1].meta == {"crow": "summary"}  # compacted
    assert list(small.session.messages) == history(2)


def test_not_due_when_everything_is_in_the_kept_part(tmp_path: Path) -> None:
    """Two huge messages over the threshold: a compaction could only fail (each turn, as a
    failed compaction_update); automatic triggers wait until there is an older part."""
    service = CompactService()
    session = Session(id="s", cwd=tmp_path, messages=Messages([human("x" * 4000), ai("y" * 4000)]))
    assert not service.due(session, window=1000)
    session.messages.extend([human("z"), ai("w")])  # the first exchange is now older
    assert service.due(session, window=1000)


def test_due_backs_off_after_a_failure_until_the_history_grows(tmp_path: Path) -> None:
    service = CompactService(CompactionConfig(backoff_messages=4, backoff_ratio=0.25))
    session = Session(id="s", cwd=tmp_path, messages=Messages(history(5)))  # 30 messages
    assert service.due(session, window=100)
    session.compaction.failed_at = 30
    assert not service.due(session, window=100)
    session.messages.extend(history(1))  # 36: under 30 + max(4, 30 x 0.25 = 7)
    assert not service.due(session, window=100)
    session.messages.append(human("x"))  # 37
    assert service.due(session, window=100)
    session.messages = Messages(history(1))  # a shorter history (replaced): a new one
    assert service.due(session, window=10)
    assert not service.due(session, window=10**6)  # under the threshold


def test_the_session_config_decides(tmp_path: Path) -> None:
    """A session's config (a trusted crow.yaml merged over the user's) wins over the
    service's own settings, which are for a session without a config."""
    service = CompactService(CompactionConfig(threshold=0.9))
    session = Session(id="s", cwd=tmp_path, messages=Messages(history(1)))
    session.last_usage, session.usage_covers = Usage(70, 5), len(session.messages)
    assert not service.due(session, window=100)
    session.config = Config(home=tmp_path, compaction=CompactionConfig(threshold=0.5))
    assert service.due(session, window=100)


def test_the_compaction_section_builds_the_one_service(tmp_path: Path) -> None:
    config = Config(home=tmp_path, compaction={"threshold": 0.7, "keep_ratio": 0.2, "backoff_messages": 9})
    agent = Agent(config, builtin_hooks=False)
    assert isinstance(factory(agent), SummarizationHook)
    assert agent.compactor is None  # the hook builds nothing: the agent does, once
    service = agent._ensure_compactor()
    assert service.settings == config.compaction and agent._ensure_compactor() is service


def test_old_compaction_keys_still_work(caplog: pytest.LogCaptureFixture) -> None:
    """`compact_threshold` and `hooks.settings.summarization` configured compaction before the
    `compaction:` section; they are folded into it (the hook's threshold won), and logged."""
    import logging

    from crow import config as config_module

    config_module._warned.clear()
    old = {
        "compact_threshold": 0.6,
        "hooks": {
            "settings": {"summarization": {"threshold": 0.7, "keep_ratio": 0.2, "cache_preserving": False}}
        },
    }
    with caplog.at_level(logging.WARNING, logger="crow.config"):
        config = Config.model_validate(old)
    assert (config.compaction.threshold, config.compaction.keep_ratio) == (0.7, 0.2)
    assert config.compaction.cache_preserving is False
    assert config.hooks.settings["summarization"] == {}
    assert "compact_threshold is deprecated" in caplog.text
    assert "hooks.settings.summarization is deprecated" in caplog.text
    assert Config.model_validate({**old, "compaction": {"threshold": 0.5}}).compaction.threshold == 0.5
    assert Config.model_validate({"compact_threshold": 0.6}).compaction.threshold == 0.6


def test_a_project_old_key_wins_over_the_users_section(tmp_path: Path) -> None:
    from crow.project_config import compose

    user = Config(home=tmp_path, compaction={"threshold": 0.9, "keep_ratio": 0.3})
    merged = compose(user, {"compact_threshold": 0.5}, tmp_path / "crow.yaml")
    assert (merged.compaction.threshold, merged.compaction.keep_ratio) == (0.5, 0.3)


# ---------------------------------------------------------------- the real loop over HTTP
def note(name: str) -> str:
    """Read a note by name."""
    return f"note {name}: " + "lorem ipsum " * 10


def is_summary_request(r: Any) -> bool:
    return INSTRUCTION_MARK in r.last_user_text


SUMMARY = Reply(text="SUMMARY: the user wants notes read.", usage=(300, 20))


async def agent_with_history(
    llm: ScriptedLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, summary: Any = SUMMARY
) -> Any:
    monkeypatch.setenv("OPENAI_BASE_URL", llm.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    config = Config(
        model="openai:scripted",
        home=tmp_path / "home",
        model_settings={"openai:scripted": {"context_window": 2000}},
        hooks={"entry_points": False},
    )
    agent = Agent(config, builtin_hooks=False)
    agent.tool(note)
    agent.hooks.register(factory(agent))
    session = agent.create_session(tmp_path)
    await agent.session_ready(session)
    llm.rule(is_summary_request, summary)
    for i in range(3):  # three small turns: 12 messages of history
        llm.push(
            Reply(tool_calls=[ToolCallSpec("note", {"name": f"n{i}"})], usage=(100, 10)),
            Reply(text=f"read n{i}", usage=(120, 10)),
        )
        result = await agent.run_turn(session, human(f"read note n{i}"), _ignore)
        assert result.error is None
    assert len(session.messages) == 12
    return agent, session


async def _ignore(event: Any) -> None:
    return None


async def test_loop_compacts_when_usage_nears_the_window(
    llm: ScriptedLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, session = await agent_with_history(llm, tmp_path, monkeypatch)
    try:
        start = len(llm.requests)
        llm.push(
            Reply(tool_calls=[ToolCallSpec("note", {"name": "big"})], usage=(1900, 10)),
            Reply(text="all done", usage=(200, 10)),
        )
        events: list[Any] = []

        async def emit(e: Any) -> None:
            events.append(e)

        result = await agent.run_turn(session, human("read the big note"), emit)
        assert result.error is None
        big_call, summary_req, after = llm.requests[start:]
        assert is_summary_request(summary_req) and not is_summary_request(after)
        assert summary_req.body["tool_choice"] == "none"
        assert summary_req.tool_names == big_call.tool_names == ["note"]
        # the summary request is the previous request plus the ask (the open call left out)
        assert summary_req.messages[:-1] == big_call.messages
        assert len(after.messages) < len(big_call.messages)
        assert any("<summary>" in m["content"] for m in after.messages if m["role"] == "user")
        assert after.messages[-1]["role"] == "tool"  # the tool ran after the compaction
        assert "SUMMARY: the user wants notes read." in session.messages[1].content
        assert any(isinstance(e, UsageUpdated) and e.size == 2000 for e in events)
        transcript = await agent.store.load_transcript(session.id)
        assert len(transcript) == 12 + 4  # the transcript stays whole
        assert await agent.store.load_context(session.id) == list(session.messages)
    finally:
        await agent.aclose()


async def test_a_failed_summary_is_not_retried_at_every_model_call(
    llm: ScriptedLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every model call of this turn is over the threshold and every summary request fails:
    after a failure the hook waits until the history has grown by 4 messages (two tool
    rounds) instead of sending a full-context summary request after each call."""
    agent, session = await agent_with_history(
        llm, tmp_path, monkeypatch, summary=Fault(status=400, message="summaries are down")
    )
    try:
        start = len(llm.requests)
        for i in range(4):
            llm.push(Reply(tool_calls=[ToolCallSpec("note", {"name": f"big{i}"})], usage=(1900, 10)))
        llm.push(Reply(text="all done", usage=(1900, 10)))
        result = await agent.run_turn(session, human("read the big notes"), _ignore)
        assert result.error is None and session.messages[-1].content == "all done"
        kinds = ["summary" if is_summary_request(r) else "call" for r in llm.requests[start:]]
        # failed at 14 messages; 16 is backed off; 18 retries (and fails); 20 is backed off;
        # the final answer (22) ends the turn without a compaction.
        assert kinds == ["call", "summary", "call", "call", "summary", "call", "call"]
        assert len(session.messages) == 22  # nothing was compacted
    finally:
        await agent.aclose()


async def test_context_length_error_compacts_and_retries(
    llm: ScriptedLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, session = await agent_with_history(llm, tmp_path, monkeypatch)
    try:
        start = len(llm.requests)
        llm.push(
            Fault(status=400, message="This model's maximum context length is 2000 tokens"),
            Reply(text="recovered", usage=(300, 10)),
        )
        result = await agent.run_turn(session, human("one more"), _ignore)
        assert result.error is None and result.stop_reason == "end_turn"
        failed, summary_req, retry = llm.requests[start:]
        assert is_summary_request(summary_req) and summary_req.body["tool_choice"] == "none"
        assert len(retry.messages) < len(failed.messages)
        assert any("<summary>" in m["content"] for m in retry.messages if m["role"] == "user")
        assert retry.last_user_text == "one more"
        assert session.messages[-1].content == "recovered"
    finally:
        await agent.aclose()


async def test_big_history_is_compacted_before_the_next_turn(
    llm: ScriptedLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, session = await agent_with_history(llm, tmp_path, monkeypatch)
    try:
        llm.push(Reply(text="a long answer", usage=(1900, 10)))  # no tool calls: the turn ends
        assert (await agent.run_turn(session, human("explain"), _ignore)).error is None
        assert len(session.messages) == 14  # not compacted at the end of a turn
        start = len(llm.requests)
        llm.push(Reply(text="fresh start", usage=(200, 10)))
        assert (await agent.run_turn(session, human("go on"), _ignore)).error is None
        summary_req, first_call = llm.requests[start:]
        assert is_summary_request(summary_req)
        assert any("<summary>" in m["content"] for m in first_call.messages if m["role"] == "user")
        assert first_call.last_user_text == "go on"
    finally:
        await agent.aclose()


async def test_failed_automatic_compaction_backs_off(tmp_path: Path) -> None:
    """Through a HookContext: `should_compact` is the service's `due`."""
    from crow.context import HookContext

    calls = []

    def handler(request: Any) -> ModelResponse:
        calls.append(request)
        return ModelResponse(ai(""))  # an empty summary: the compaction fails

    provider = ScriptedProvider(handler, context_window=100)
    session = Session(
        id="s",
        cwd=tmp_path,
        messages=Messages(
            [m for i in range(10) for m in (human(f"q{i} " + "x" * 200), ai(f"a{i} " + "y" * 200))]
        ),
    )

    async def emit(event: Any) -> None:
        return None

    ctx = HookContext(session, "", provider, emit, compactor=CompactService())
    assert ctx.should_compact()
    result = await ctx.compact()
    assert not result.compacted and len(calls) == 1
    assert not ctx.should_compact(), "no retry until the history grows"
    session.messages.extend([human("more " * 50), ai("ok " * 50)] * 2)
    assert ctx.should_compact()
