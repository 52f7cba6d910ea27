"""Fault drills: crow under SIGKILL, cancellation storms, a misbehaving model, hostile
JSON-RPC on stdin, an `execute` storm and a path-escape corpus.

Every test here is `slow` (run with `pytest -m slow`). Random moments come from one seed,
printed on failure (set DRILL_SEED to replay a run).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import acp
import anyio
import pytest
import yaml

from tests.conftest import CROW, RecordingClient, crow_env, spawn_crow
from tests.llm_server import Cut, Fault, RecordedRequest, Reply, ScriptedLLM, Stall, ToolCallSpec

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SUPPORT = Path(__file__).parent / "support"
SEED = int(os.environ.get("DRILL_SEED") or random.SystemRandom().randrange(1 << 30))
CANCEL_BUDGET = 0.5  # seconds from session/cancel to the `cancelled` answer


def rng_for(name: str) -> random.Random:
    return random.Random(f"{SEED}:{name}")


def seed_note() -> str:
    return f"(DRILL_SEED={SEED})"


# --------------------------------------------------------------------------- helpers


def write_config(home: Path, **data: Any) -> Path:
    path = home / "drill-config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def drill_env(llm: ScriptedLLM, home: Path, **extra: str) -> dict[str, str]:
    return crow_env(llm, home, PYTHONPATH=str(SUPPORT), **extra)


async def open_session(conn: Any, workspace: Path) -> str:
    await conn.initialize(protocol_version=1)
    return (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id


async def wait_until(pred: Callable[[], Any], timeout: float = 10.0, step: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        await asyncio.sleep(step)
    return bool(pred())


def _proc_stat(pid: str) -> tuple[str, int] | None:
    """(state, ppid) of a process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return fields[0].decode(), int(fields[1])


def processes_with(marker: str) -> list[tuple[int, str]]:
    """Live (non-zombie) processes whose command line carries `marker`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        stat = _proc_stat(pid)
        if marker in cmd and stat is not None and stat[0] != "Z":
            found.append((int(pid), cmd.strip()))
    return found


def children_of(ppid: int) -> list[tuple[int, str]]:
    """(pid, state) of every process whose parent is `ppid`."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and (stat := _proc_stat(pid)) is not None and stat[1] == ppid:
            out.append((int(pid), stat[0]))
    return out


def kill_pids(pids: list[int]) -> None:
    """Clean up processes this test started (found by their unique marker), by pid."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def check_history(messages: list[dict[str, Any]], where: str = "") -> None:
    """The history crow sends to the model is valid: system only first, a user message
    opens it and closes it, every tool call is answered before anything else and every
    tool result answers an open call, no empty assistant messages."""
    roles = [m["role"] for m in messages]
    ctx = f"{where}: roles {roles}"
    assert all(r in ("system", "user", "assistant", "tool") for r in roles), ctx
    assert "system" not in roles[1:], f"system message in the middle; {ctx}"
    body = [m for m in messages if m["role"] != "system"]
    assert body and body[0]["role"] == "user", f"history must open with the user; {ctx}"
    assert body[-1]["role"] == "user", f"history must end with the new prompt; {ctx}"
    open_calls: dict[str, str] = {}
    seen: set[str] = set()
    for i, m in enumerate(body):
        if m["role"] == "tool":
            cid = m.get("tool_call_id")
            assert cid in open_calls, f"tool result {cid!r} at {i} answers no open call; {ctx}"
            del open_calls[cid]
            continue
        assert not open_calls, f"tool calls {sorted(open_calls)} unanswered before {m['role']} at {i}; {ctx}"
        if m["role"] == "assistant":
            calls = m.get("tool_calls") or []
            assert m["content"] or calls, f"empty assistant message at {i}; {ctx}"
            for c in calls:
                assert c["id"] and c["id"] not in seen, f"tool call id {c['id']!r} repeated; {ctx}"
                seen.add(c["id"])
                open_calls[c["id"]] = c["name"]
    assert not open_calls, f"tool calls {sorted(open_calls)} never answered; {ctx}"


def last_request_for(llm: ScriptedLLM, text: str) -> RecordedRequest:
    return [r for r in llm.requests if r.last_user_text == text][-1]


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


# --------------------------------------------------------------------------- 1. SIGKILL


async def test_sigkill_at_random_moments_loses_nothing_acknowledged(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """SIGKILL crow mid-stream and mid-tool (5 random moments each), restart, load: every
    acknowledged prompt and every completed tool call is replayed, the history sent next
    is valid, and the next prompt works."""
    rng = rng_for("sigkill")
    (workspace / "a.txt").write_text("alpha\n")
    run = f"{uuid.uuid4().int % 10**6:06d}"
    markers: list[str] = []

    def script(req: RecordedRequest) -> Reply:
        text = req.last_user_text
        if text.startswith("kill-stream"):
            return Reply(text=words(400, "s"), chunk_delay=0.005)
        if text.startswith("kill-tool"):
            marker = text.split()[-1]
            after = 0
            for m in reversed(req.messages):
                if m["role"] == "user":
                    break
                after += m["role"] == "tool"
            if after == 0:
                return Reply(tool_calls=[ToolCallSpec("read_file", {"path": "a.txt"})])
            if after == 1:
                return Reply(tool_calls=[
                    ToolCallSpec("read_file", {"path": "a.txt"}),
                    ToolCallSpec("execute", {"command": f"sleep {marker} & sleep {marker}", "timeout": 60}),
                ])  # fmt: skip
            return Reply(text="tool turn finished")
        return Reply(text=f"fine: {text}")

    llm.default = script
    env = drill_env(llm, home, CROW_MODE="yolo")
    moments = ["stream", "tool"] * 5
    rng.shuffle(moments)
    sent: list[str] = []  # prompts crow acknowledged (answered, or streamed something for)
    completed_tools: set[str] = set()
    sid = ""
    orphans: list[tuple[int, str]] = []
    try:
        for k, moment in enumerate([*moments, None]):
            async with spawn_crow(env) as (conn, proc, client):
                if not sid:
                    sid = await open_session(conn, workspace)
                else:
                    await conn.initialize(protocol_version=1)
                    await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
                    replayed_users = [u.content.text for u in client.of_type("UserMessageChunk")]
                    assert all(s in replayed_users for s in sent), (
                        f"acknowledged prompts lost after kill {k}: sent {sent}, replayed {replayed_users} "
                        + seed_note()
                    )
                    # a replayed tool call is one tool_call carrying its final status
                    replay_done = {
                        u.tool_call_id
                        for kind in ("ToolCallStart", "ToolCallProgress")
                        for u in client.of_type(kind)
                        if u.status == "completed"
                    }
                    assert completed_tools <= replay_done, (
                        f"completed tool calls lost after kill {k}: {sorted(completed_tools - replay_done)} "
                        + seed_note()
                    )
                    check = f"check-{k}"
                    response = await conn.prompt(session_id=sid, prompt=[acp.text_block(check)])
                    assert response.stop_reason == "end_turn", seed_note()
                    sent.append(check)
                    check_history(last_request_for(llm, check).messages, f"after kill {k} {seed_note()}")
                    client.updates.clear()
                if moment is None:
                    break
                marker = f"{7000 + k}.{run}"
                markers.append(marker)
                text = f"kill-{moment}-{k} {marker}"
                client.updates.clear()
                task = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block(text)]))
                if moment == "stream":
                    await wait_until(lambda: client.of_type("AgentMessageChunk"), 15)
                    await asyncio.sleep(rng.uniform(0, 1.2))
                else:
                    await wait_until(lambda: client.of_type("ToolCallStart"), 15)
                    await asyncio.sleep(rng.uniform(0, 0.6))
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                done_now = {
                    u.tool_call_id for u in client.of_type("ToolCallProgress") if u.status == "completed"
                }
                turn_kinds = {"AgentMessageChunk", "AgentThoughtChunk", "ToolCallStart", "ToolCallProgress"}
                if any(type(u).__name__ in turn_kinds for _, u in client.updates):
                    sent.append(text)  # crow streamed for this prompt: it was acknowledged
                completed_tools |= done_now
            await asyncio.sleep(0.2)
            orphans += processes_with(marker)
    finally:  # commands a killed crow left running: ours, found by marker
        kill_pids([pid for m in markers for pid, _ in processes_with(m)])
    killed_acknowledged = [t for t in sent if t.startswith("kill-")]
    print(
        f"{len(moments)} kills; {len(killed_acknowledged)} killed prompts acknowledged and replayed; "
        f"{len(completed_tools)} completed tool calls replayed"
    )
    assert len(killed_acknowledged) >= len(moments) // 2, "the kills did not land mid-turn"
    assert completed_tools, "no kill came after a completed tool call"
    # Not asserted (SIGKILL leaves crow no chance to act), but reported: commands started by
    # a killed crow keep running.
    if orphans:
        print(f"NOTE: {len(orphans)} execute processes outlived a SIGKILLed crow: {orphans[:4]}")


# --------------------------------------------------------------------------- 2. cancel storm


class HangingPermissionClient(RecordingClient):
    """Never answers a permission request until the test releases it (as an editor does
    when it sends session/cancel)."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[asyncio.Future[None]] = []

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any
    ) -> Any:
        from acp.schema import DeniedOutcome, RequestPermissionResponse

        self.permission_requests.append((tool_call, options))
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.pending.append(fut)
        with contextlib.suppress(asyncio.CancelledError):
            await fut
        return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))

    def release(self) -> None:
        for fut in self.pending:
            if not fut.done():
                fut.set_result(None)
        self.pending.clear()


async def test_cancel_at_fifty_random_moments(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    """Cancel during streaming, `execute`, a slow programmatic tool and a pending permission
    prompt: `cancelled` within 500 ms, no command left running, the session goes on."""
    rng = rng_for("cancel")
    run = f"{uuid.uuid4().int % 10**6:06d}"

    def script(req: RecordedRequest) -> Reply:
        text = req.last_user_text
        after_tool = bool(req.messages) and req.messages[-1]["role"] == "tool"
        kind, _, marker = text.partition(" ")
        if after_tool:
            return Reply(text="tool finished")
        if kind == "stream":
            return Reply(text=words(300, "c"), chunk_delay=0.01)
        if kind in ("exec", "permission"):
            command = f"sleep {marker} & sleep {marker}; echo finished"
            return Reply(tool_calls=[ToolCallSpec("execute", {"command": command, "timeout": 60})])
        if kind == "slow":
            return Reply(tool_calls=[ToolCallSpec("drill_sleep", {"seconds": 60})])
        return Reply(text=f"pong {text}")

    llm.default = script
    config = write_config(home, tools=["drill_tools:drill_sleep"])
    kinds = ["stream"] * 14 + ["exec"] * 12 + ["slow"] * 12 + ["permission"] * 12
    rng.shuffle(kinds)
    client = HangingPermissionClient()
    failures: list[str] = []
    timings: list[float] = []
    running = 0
    env = drill_env(llm, home, CROW_MODE="yolo")
    async with spawn_crow(env, "--config", str(config), client=client) as (conn, proc, _c):
        yolo = await open_session(conn, workspace)
        ask = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        await conn.set_session_mode(session_id=ask, mode_id="ask")
        for i, kind in enumerate(kinds):
            sid = ask if kind == "permission" else yolo
            marker = f"{8000 + i}.{run}"
            text = f"{kind} {marker}"
            before = len(client.updates)
            asked = len(client.permission_requests)
            task = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block(text)]))
            finished: list[float] = []
            task.add_done_callback(lambda _t, f=finished: f.append(time.monotonic()))
            if kind == "stream":
                delay = rng.uniform(0, 1.2)
            elif kind == "permission":
                if rng.random() < 0.75:  # mostly while the prompt is on screen
                    await wait_until(lambda a=asked: len(client.permission_requests) > a, 10)
                delay = rng.uniform(0, 0.4)
            else:
                delay = rng.uniform(0, 0.8)
            await asyncio.sleep(delay)
            phase = [getattr(u, "session_update", "?") for _, u in client.updates[before:]][-1:]
            if kind == "exec" and processes_with(marker):
                running += 1  # the drill really caught the command running
            started = time.monotonic()
            await conn.cancel(session_id=sid)
            try:
                response = await asyncio.wait_for(asyncio.shield(task), 10)
            except TimeoutError:
                failures.append(f"#{i} {kind} after {delay:.2f}s ({phase}): no answer 10 s after cancel")
                client.release()
                response = await task
            client.release()
            took = finished[0] - started
            timings.append(took)
            if response.stop_reason != "cancelled":
                failures.append(f"#{i} {kind}: stop_reason {response.stop_reason}")
            if took > CANCEL_BUDGET:
                failures.append(
                    f"#{i} {kind} after {delay:.2f}s ({phase}): cancelled in {took * 1000:.0f} ms"
                )
            if kind in ("exec", "permission"):
                await asyncio.sleep(0.05)
                if left := processes_with(marker):
                    failures.append(f"#{i} {kind}: processes left after cancel: {left}")
                    kill_pids([p for p, _ in left])
            if kind == "permission" and any(
                getattr(u, "status", None) == "completed" for _, u in client.updates[before:]
            ):
                failures.append(f"#{i} permission: the command ran although permission was never given")
            ping = f"ping-{i}"
            again = await conn.prompt(session_id=sid, prompt=[acp.text_block(ping)])
            if again.stop_reason != "end_turn":
                failures.append(f"#{i} {kind}: next prompt ended {again.stop_reason}")
            try:
                check_history(last_request_for(llm, ping).messages, f"#{i} {kind}")
            except AssertionError as exc:
                failures.append(str(exc))
        zombies = [c for c in children_of(proc.pid) if c[1] == "Z"]
    assert not zombies, f"crow left zombie children: {zombies}"
    assert running >= 4, f"only {running} of 12 exec cancels caught the command running"
    timings.sort()
    print(
        f"cancel latency: median {timings[len(timings) // 2] * 1000:.0f} ms, max {timings[-1] * 1000:.0f} ms"
    )
    assert not failures, f"{len(failures)} of {len(kinds)} cancels failed {seed_note()}:\n" + "\n".join(
        failures
    )


async def test_cancel_execute_that_ignores_sigterm(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    """A command that traps SIGTERM must not hold the cancel for the 2 s kill grace."""
    marker = f"6100.{uuid.uuid4().int % 10**6:06d}"
    command = f"trap '' TERM; sleep {marker} & sleep {marker}"
    llm.push(Reply(tool_calls=[ToolCallSpec("execute", {"command": command, "timeout": 60})]))
    llm.default = Reply(text="pong")
    async with spawn_crow(drill_env(llm, home, CROW_MODE="yolo")) as (conn, _proc, _client):
        sid = await open_session(conn, workspace)
        task = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("stubborn")]))
        assert await wait_until(lambda: processes_with(marker), 20), "the command never started"
        await asyncio.sleep(0.1)
        started = time.monotonic()
        await conn.cancel(session_id=sid)
        response = await task
        took = time.monotonic() - started
        await asyncio.sleep(0.05)
        left = processes_with(marker)
        kill_pids([p for p, _ in left])
        again = await conn.prompt(session_id=sid, prompt=[acp.text_block("ping")])
    assert response.stop_reason == "cancelled"
    assert not left, f"processes left after cancel: {left}"
    assert again.stop_reason == "end_turn"
    assert took <= CANCEL_BUDGET, f"cancel of a SIGTERM-ignoring command took {took * 1000:.0f} ms"


# --------------------------------------------------------------------------- 3. misbehaving model


async def test_misbehaving_model(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    """429 storms, 500s, stalls, cut streams, empty answers, broken tool calls and a model
    that never stops calling tools: each prompt ends with a clear outcome, the session
    stays usable, and the history sent next is valid."""
    config = write_config(
        home,
        providers={"openai": {"read_timeout": 0.5, "max_retries": 2}},
        tools=["drill_tools:drill_add"],
    )
    add = {"a": 1, "b": 2}
    failures: list[str] = []
    async with spawn_crow(drill_env(llm, home), "--config", str(config)) as (conn, _proc, client):
        main_sid = sid = await open_session(conn, workspace)
        n = 0

        async def scenario(
            name: str, steps: list[Any], expect: Callable[[Any, str, float, list[RecordedRequest]], None],
            *, limit: float = 8.0, fresh: bool = False,
        ) -> None:  # fmt: skip
            nonlocal n
            n += 1
            sid = main_sid
            if fresh:  # keep what this scenario leaves in the history out of the others
                sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
            llm.reset()
            llm.default = Reply(text="(default)")
            llm.push(*steps)
            before = len(client.updates)
            started = time.monotonic()
            try:
                response = await asyncio.wait_for(
                    conn.prompt(session_id=sid, prompt=[acp.text_block(f"{name} #{n}")]), limit
                )
            except TimeoutError:
                failures.append(f"{name}: no answer within {limit} s")
                return
            except acp.RequestError as exc:  # a failed turn: an error answer, its history stored
                response = exc
            elapsed = time.monotonic() - started
            shown = "".join(
                u.content.text for _, u in client.updates[before:] if type(u).__name__ == "AgentMessageChunk"
            )
            try:
                expect(response, shown, elapsed, list(llm.requests))
            except AssertionError as exc:
                failures.append(f"{name}: {exc}")
            llm.reset()
            llm.default = Reply(text="(default)")
            llm.push(Reply(text=f"usable after {name}"))
            after = await conn.prompt(session_id=sid, prompt=[acp.text_block(f"after {name}")])
            if after.stop_reason != "end_turn" or not client.text().endswith(f"usable after {name}"):
                failures.append(f"{name}: the session is not usable afterwards ({after.stop_reason})")
            if llm.requests:
                try:
                    check_history(llm.requests[-1].messages, name)
                except AssertionError as exc:
                    failures.append(f"{name}: {exc}")

        def error_of(response: Any) -> str:
            failed = isinstance(response, acp.RequestError)
            return str((response.data or {}).get("error") or "") if failed else ""

        def failed_with(needle: str, attempts: int | None = None, within: float = 6.0) -> Any:
            def expect(response: Any, shown: str, elapsed: float, reqs: list[RecordedRequest]) -> None:
                error = error_of(response)
                assert isinstance(response, acp.RequestError), f"answered {response}, not an error"
                assert response.code == -32000 and error, "no error reported in the answer's data"
                assert needle in error, f"unclear error: {error!r}"
                assert "Model call failed" in shown, f"the user was not told: {shown[-200:]!r}"
                if attempts is not None:
                    assert len(reqs) == attempts, f"{len(reqs)} model requests, expected {attempts}"
                assert elapsed < within, f"took {elapsed:.1f} s"

            return expect

        def answered(text: str, attempts: int | None = None) -> Any:
            def expect(response: Any, shown: str, elapsed: float, reqs: list[RecordedRequest]) -> None:
                assert not isinstance(response, acp.RequestError), error_of(response)
                assert response.stop_reason == "end_turn", response.stop_reason
                assert shown.endswith(text), shown[-200:]
                if attempts is not None:
                    assert len(reqs) == attempts, f"{len(reqs)} model requests, expected {attempts}"

            return expect

        def tool_error_reached_model(expected: str) -> Any:
            def expect(response: Any, shown: str, elapsed: float, reqs: list[RecordedRequest]) -> None:
                assert response.stop_reason == "end_turn", response.stop_reason
                assert len(reqs) >= 2, "the model never saw the tool result"
                tools = [m for m in reqs[1].messages if m["role"] == "tool"]
                assert tools, "no tool result sent back"
                assert tools[-1]["content"] == expected, f"tool result {tools[-1]['content'][:300]!r}"
                check_history([*reqs[1].messages, {"role": "user", "content": ""}], "mid-turn")

            return expect

        await scenario(
            "429-storm",
            [Fault(429, retry_after=0.05, times=20)],
            failed_with("HTTP 429", attempts=2),
        )
        await scenario("429-no-retry-after", [Fault(429, times=20)], failed_with("HTTP 429", attempts=2))
        await scenario("529-overloaded", [Fault(529, times=20)], failed_with("HTTP 529", attempts=2))
        await scenario("500-storm", [Fault(500, times=20)], failed_with("HTTP 500", attempts=2))
        await scenario("503-then-ok", [Fault(503), Reply(text="recovered")], answered("recovered", 2))
        await scenario("stall-headers", [Stall(5)] * 4, failed_with("read timed out", attempts=2))
        await scenario(
            "stall-no-headers",
            [Stall(5, send_headers=False)] * 4,
            failed_with("read timed out", attempts=2),
        )
        await scenario("stall-then-ok", [Stall(5), Reply(text="late but fine")], answered("late but fine", 2))
        await scenario(
            "stall-mid-stream",
            [Reply(text="one two three four", chunk_delay=3)],
            failed_with("read timed out", attempts=1),
        )
        await scenario(
            "cut-before-output",
            [Cut(after_chunks=0, text="never"), Reply(text="second try")],
            answered("second try", 2),
        )
        await scenario(
            "cut-before-output-storm",
            [Cut(after_chunks=0, text="x")] * 4,
            failed_with("connection lost mid-response", attempts=2),
        )
        await scenario(
            "cut-after-output",
            [Cut(after_chunks=3, text="one two three four five six")],
            failed_with("connection lost mid-response", attempts=1),
        )

        def empty_ok(response: Any, shown: str, elapsed: float, reqs: list[RecordedRequest]) -> None:
            assert response.stop_reason in ("end_turn", "refusal"), response.stop_reason
            assert len(reqs) == 1, f"{len(reqs)} requests for one empty answer"

        await scenario("empty-answer", [Reply(empty=True)], empty_ok)

        def length_cut(response: Any, shown: str, elapsed: float, reqs: list[RecordedRequest]) -> None:
            assert response.stop_reason == "max_tokens", response.stop_reason

        await scenario("empty-answer-with-length", [Reply(empty=True, finish_reason="length")], length_cut)
        again = "Send the arguments again as one valid JSON object."
        wrong = "Error: drill_add was not run: its arguments are wrong.\n"
        send = 'Send: {"a": integer, "b": integer}'
        bad_json = {  # the arguments sent -> what the model reads about them
            '{"a": 1, "b":': f"Error: arguments are not valid JSON (Expecting value at position 13): "
            f"'{{\"a\": 1, \"b\":'. {again}",
            "[1, 2]": f"Error: arguments must be a JSON object, got '[1, 2]'. {again}",
            '"a string"': f"Error: arguments must be a JSON object, got '\"a string\"'. {again}",
            "null": f"Error: arguments must be a JSON object, got 'null'. {again}",
            "": f"{wrong}- `a`: missing; it is required\n- `b`: missing; it is required\n{send}",
            "{}{}": f"Error: arguments are not valid JSON (Extra data at position 2): '{{}}{{}}'. {again}",
            '{"a": "x", "b": []}': f"{wrong}- `a`: input should be a valid integer, unable to parse string as an "
            f"integer (got 'x')\n- `b`: input should be a valid integer (got [])\n{send}",
        }
        for raw, told in bad_json.items():
            await scenario(f"tool-json {raw!r}", [
                Reply(tool_calls=[ToolCallSpec("drill_add", raw_arguments=raw)]), Reply(text="sorry"),
            ], tool_error_reached_model(told))  # fmt: skip
        tool_names = "ask_user, drill_add, edit_file, execute, exit_plan_mode, glob, grep, ls, read_file, read_skill, task, write_file, write_todos"
        for name in ("no_such_tool", "../../bin/sh", "drill_add; rm -rf /", "x" * 300):
            await scenario(f"unknown-tool {name[:20]!r}", [
                Reply(tool_calls=[ToolCallSpec(name, add)]), Reply(text="sorry"),
            ], tool_error_reached_model(f"Error: unknown tool {name!r}; available tools: {tool_names}"))  # fmt: skip
        # An empty tool name: crow drops the call; the session must stay valid and usable.
        await scenario("empty-tool-name", [
            Reply(tool_calls=[ToolCallSpec("", add)]), Reply(text="sorry"),
        ], lambda r, *_: None, fresh=True)  # fmt: skip
        # Local OpenAI-compatible servers repeat ids ("call_0" every turn); ACP tool call ids
        # and Anthropic tool_use ids must be unique, so crow has to make them so.
        await scenario("duplicate-call-ids-in-one-turn", [
            Reply(tool_calls=[ToolCallSpec("drill_add", add, id="dup"), ToolCallSpec("drill_add", add, id="dup")]),
            Reply(text="sorry"),
        ], lambda r, *_: None, fresh=True)  # fmt: skip
        await scenario("duplicate-call-ids-across-turns", [
            Reply(tool_calls=[ToolCallSpec("drill_add", add, id="call_0")]),
            Reply(tool_calls=[ToolCallSpec("drill_add", add, id="call_0")]),
            Reply(text="sorry"),
        ], lambda r, *_: None, fresh=True)  # fmt: skip
        await scenario("empty-call-id", [
            Reply(tool_calls=[ToolCallSpec("drill_add", add, id="")]), Reply(text="sorry"),
        ], lambda r, *_: None, fresh=True)  # fmt: skip
        sid = main_sid

        def forever(response: Any, shown: str, elapsed: float, reqs: list[RecordedRequest]) -> None:
            assert response.stop_reason == "max_turn_requests", response.stop_reason
            assert len(reqs) == 25, f"{len(reqs)} model requests, expected the limit of 25"

        llm.reset()
        llm.default = Reply(tool_calls=[ToolCallSpec("drill_add", add)])
        n += 1
        response = await conn.prompt(session_id=sid, prompt=[acp.text_block("forever")])
        try:
            forever(response, "", 0, list(llm.requests))
        except AssertionError as exc:
            failures.append(f"tools-forever: {exc}")
        llm.reset()
        llm.default = Reply(text="usable after forever")
        after = await conn.prompt(session_id=sid, prompt=[acp.text_block("after forever")])
        assert after.stop_reason == "end_turn"
        try:
            check_history(llm.requests[-1].messages, "tools-forever")
        except AssertionError as exc:
            failures.append(f"tools-forever: {exc}")
    assert not failures, f"{len(failures)} model misbehaviours mishandled:\n" + "\n".join(failures)


# --------------------------------------------------------------------------- 4. hostile JSON-RPC


def hostile_frames(count: int, rng: random.Random, workspace: Path) -> list[tuple[bytes, Any]]:
    """`count` frames: (line, id a response must carry or None when none is owed)."""
    frames: list[tuple[bytes, Any]] = []
    huge = "H" * (3 * 1024 * 1024)

    def req(rid: Any, method: Any, params: Any = None, with_params: bool = True) -> bytes:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if with_params:
            msg["params"] = params
        return json.dumps(msg).encode()

    def note(method: Any, params: Any = None) -> bytes:
        return json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode()

    garbage = [
        b"{",
        b"}",
        b"[1, 2",
        b'{"jsonrpc": "2.0", "id": 5',
        b"\xff\xfe\xfa not utf8 {}",
        b"nul \x00 byte",
        b"Content-Length: 42",
        b"\x1b[31mred\x1b[0m",
        b"{'single': 'quotes'}",
        b"NaN",
        b"-",
        b'"unterminated',
    ]
    non_objects = [b"[]", b"[1]", b"123", b'"str"', b"null", b"true", b"[{}]", b"1e999", b"{}"]
    sessions = ["nope", "", "../../etc/passwd", "x" * 1000, "\u202e\u0000"]
    methods = ["initialize", "session/new", "session/load", "session/prompt", "session/set_mode",
               "session/list", "session/resume", "session/fork", "session/close",
               "session/set_config_option", "_crow.compact", "authenticate"]  # fmt: skip
    for i in range(count):
        rid: Any = 100_000 + i if i % 3 else f"s-{i}"
        kind = i % 12
        if kind == 0:
            frames.append(
                (rng.choice(garbage) + bytes(rng.randrange(32, 127) for _ in range(rng.randrange(30))), None)
            )
        elif kind == 1:
            frames.append((rng.choice(non_objects), None))
        elif kind == 2:
            frames.append((req(rid, f"no/such/method/{i}", {}), rid))
        elif kind == 3:  # wrong types for the method name
            frames.append((req(rid, rng.choice([123, [], {}, True, 1.5])), rid))
        elif kind == 4:  # wrong params types for real methods
            frames.append(
                (req(rid, rng.choice(methods), rng.choice([[], "params", 42, [1, 2, 3], True])), rid)
            )
        elif kind == 5:  # unknown session ids
            sess = rng.choice(sessions)
            method, params = rng.choice([
                ("session/prompt", {"sessionId": sess, "prompt": [{"type": "text", "text": "hi"}]}),
                ("session/load", {"sessionId": sess, "cwd": str(workspace), "mcpServers": []}),
                ("session/resume", {"sessionId": sess, "cwd": str(workspace), "mcpServers": []}),
                ("session/set_mode", {"sessionId": sess, "modeId": "yolo"}),
                ("session/set_config_option", {"sessionId": sess, "configId": "mode", "value": "ask"}),
                ("session/fork", {"sessionId": sess, "cwd": str(workspace), "mcpServers": []}),
                ("_crow.compact", {"sessionId": sess}),
            ])  # fmt: skip
            frames.append((req(rid, method, params), rid))
        elif kind == 6:  # missing or incomplete params
            method = rng.choice([*methods[:5], "session/set_config_option", "session/fork", "_crow.compact"])
            frames.append((req(rid, method, rng.choice([{}, None]), with_params=rng.random() < 0.5), rid))
        elif kind == 7:  # notifications with bad params: nothing is owed
            method = rng.choice(["session/cancel", "session/update", "no/such/notification", "_crow.nope"])
            frames.append(
                (note(method, rng.choice([None, {}, [], "x", {"sessionId": 5}, {"sessionId": "nope"}])), None)
            )
        elif kind == 8:  # responses to requests crow never made
            frames.append(
                (json.dumps({"jsonrpc": "2.0", "id": rng.randrange(1 << 40), "result": {}}).encode(), None)
            )
        elif kind == 9:  # deep nesting inside a request json can still parse
            depth = rng.choice([50, 200, 500])
            nested: Any = "x"
            for _ in range(depth):
                nested = [nested] if rng.random() < 0.5 else {"k": nested}
            params = {"sessionId": "nope", "prompt": nested}
            frames.append((req(rid, "session/prompt", params), rid))
        elif kind == 10:  # nesting too deep to parse: dropped, nothing owed
            depth = rng.choice([5_000, 100_000])
            frames.append((b"[" * depth + b"]" * depth, None))
        else:  # odd ids and wrong id types
            odd = rng.choice([{"x": 1}, [1], True, 1.5, None, -1, 2**70])
            frames.append((json.dumps({"jsonrpc": "2.0", "id": odd, "method": "no/such"}).encode(), None))
    # a few multi-megabyte strings
    for j in range(5):
        rid = f"huge-{j}"
        if j % 2:
            params = {"sessionId": "nope", "prompt": [{"type": "text", "text": huge}]}
            frames.insert(rng.randrange(len(frames)), (req(rid, "session/prompt", params), rid))
        else:
            frames.insert(rng.randrange(len(frames)), (req(rid, "x" + huge), rid))
    frames.insert(rng.randrange(len(frames)), (b'"' + huge.encode() + b'"', None))
    return frames


def vm_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


class RawPeer:
    """crow on pipes, driven frame by frame; every stdout line is collected and parsed."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.responses: dict[Any, dict[str, Any]] = {}
        self.duplicates: list[Any] = []
        self.notifications: list[dict[str, Any]] = []
        self.not_jsonrpc: list[bytes] = []
        self.changed = asyncio.Event()
        self.task = asyncio.create_task(self._read())

    @staticmethod
    def strict(rid: Any) -> bool:
        """Ids this drill uses once each (odd ids such as null or 1.5 repeat on purpose)."""
        return isinstance(rid, str) or (
            isinstance(rid, int) and not isinstance(rid, bool) and 100_000 <= rid < 10**9
        )

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            try:
                msg = json.loads(line)
            except ValueError:
                self.not_jsonrpc.append(line[:200])
                continue
            if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
                self.not_jsonrpc.append(line[:200])
                continue
            if "method" in msg and "id" not in msg:
                self.notifications.append(msg)
            elif "id" in msg and ("result" in msg) != ("error" in msg):
                key = json.dumps(msg["id"])
                if key in self.responses and self.strict(msg["id"]):
                    self.duplicates.append(msg["id"])
                self.responses[key] = msg
            else:
                self.not_jsonrpc.append(line[:200])
            self.changed.set()

    async def send(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + b"\n")
        await self.proc.stdin.drain()

    async def call(self, rid: Any, method: str, params: Any, timeout: float = 30) -> dict[str, Any]:
        await self.send(
            json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode()
        )
        key = json.dumps(rid)
        deadline = time.monotonic() + timeout
        while key not in self.responses:
            if self.proc.returncode is not None or time.monotonic() > deadline:
                raise AssertionError(f"no answer to {method} (crow exit code {self.proc.returncode})")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 0.5)
        return self.responses[key]


async def test_hostile_jsonrpc_frames(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    """10,000 malformed or hostile frames on stdin: requests with an id get JSON-RPC errors,
    stdout carries nothing but JSON-RPC, RSS stays bounded, and crow keeps serving."""
    rng = rng_for("frames")
    env = crow_env(llm, home)
    llm.default = lambda req: Reply(text=f"echo {req.last_user_text}")
    with open(home / "stderr.log", "wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *CROW, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err, env=env,
            limit=64 * 1024 * 1024,
        )  # fmt: skip
    peer = RawPeer(proc)
    try:
        init = await peer.call("init-1", "initialize", {"protocolVersion": 1})
        assert "result" in init, init
        new = await peer.call("new-1", "session/new", {"cwd": str(workspace), "mcpServers": []})
        sid = new["result"]["sessionId"]
        text = [{"type": "text", "text": "warm up"}]
        warm = await peer.call("prompt-1", "session/prompt", {"sessionId": sid, "prompt": text})
        assert warm["result"]["stopReason"] == "end_turn", warm
        await asyncio.sleep(0.5)
        rss_before = vm_rss_kb(proc.pid)

        frames = hostile_frames(10_000, rng, workspace)
        owed = {json.dumps(rid) for _, rid in frames if rid is not None}
        started = time.monotonic()
        with contextlib.suppress(ConnectionError):
            for line, _ in frames:
                await peer.send(line)
        deadline = time.monotonic() + 90
        while not owed <= peer.responses.keys() and time.monotonic() < deadline and proc.returncode is None:
            peer.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(peer.changed.wait(), 1)
        storm = time.monotonic() - started
        alive = proc.returncode is None

        # crow keeps serving: a fresh initialize, session/new and prompt
        if alive:
            init2 = await peer.call("init-2", "initialize", {"protocolVersion": 1})
            new2 = await peer.call("new-2", "session/new", {"cwd": str(workspace), "mcpServers": []})
            sid2 = new2["result"]["sessionId"]
            text = [{"type": "text", "text": "still there?"}]
            done = await peer.call("prompt-2", "session/prompt", {"sessionId": sid2, "prompt": text})
            await asyncio.sleep(0.5)
            rss_after = vm_rss_kb(proc.pid)
        missing = sorted(owed - peer.responses.keys())
        not_errors = [
            peer.responses[k]["id"] for k in owed & peer.responses.keys() if "error" not in peer.responses[k]
        ]
        bad_codes = [
            (peer.responses[k]["id"], peer.responses[k]["error"].get("code"))
            for k in owed & peer.responses.keys()
            if "error" in peer.responses[k] and not isinstance(peer.responses[k]["error"].get("code"), int)
        ]
    finally:
        if proc.returncode is None:
            proc.stdin.close()  # type: ignore[union-attr]
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        peer.task.cancel()
    print(f"{len(frames)} frames in {storm:.1f} s; {len(owed)} answers owed, {len(missing)} missing")
    assert alive, f"crow died during the storm (exit {proc.returncode}); see {home / 'stderr.log'}"
    assert not peer.not_jsonrpc, f"non-JSON-RPC output on stdout: {peer.not_jsonrpc[:5]}"
    assert not missing, f"{len(missing)} requests with an id never answered, e.g. {missing[:8]}"
    assert not not_errors, f"hostile requests answered with success: {not_errors[:8]}"
    assert not bad_codes, f"error objects without an integer code: {bad_codes[:5]}"
    assert not peer.duplicates, f"ids answered twice: {peer.duplicates[:8]}"
    assert "result" in init2 and done["result"]["stopReason"] == "end_turn", (init2, done)
    growth_mb = (rss_after - rss_before) / 1024
    print(f"RSS {rss_before / 1024:.0f} MB -> {rss_after / 1024:.0f} MB")
    assert growth_mb < 50, f"RSS grew by {growth_mb:.0f} MB"


# --------------------------------------------------------------------------- 5. execute storm


async def test_thousand_executes_with_timeouts_and_kills(tmp_path: Path) -> None:
    """1,000 `execute` calls in-process: quick ones, ones that time out with background
    children, ones cancelled mid-run. Afterwards no zombie and no orphan is left."""
    from mcp import Client

    from mcp_servers.filesystem import build_server

    rng = rng_for("execute")
    root = tmp_path / "ws"
    root.mkdir()
    marker = f"{5000 + rng.randrange(999)}.{uuid.uuid4().int % 10**6:06d}"
    before_children = {pid for pid, _ in children_of(os.getpid())}
    counts = {"quick": 0, "timeout": 0, "cancelled": 0}
    problems: list[str] = []
    started = time.monotonic()
    async with Client(build_server(root)) as client:

        async def one(i: int) -> None:
            kind = rng.choices(["quick", "timeout", "cancelled"], [5, 3, 2])[0]
            counts[kind] += 1
            if kind == "quick":
                result = await client.call_tool("execute", {"command": f"echo quick-{i}"})
                text = result.content[0].text  # type: ignore[union-attr]
                if result.is_error or f"quick-{i}" not in text or "[exit code 0]" not in text:
                    problems.append(f"quick {i}: {text[:200]}")
            elif kind == "timeout":
                command = f"sleep {marker} & (sleep {marker} &) ; sleep {marker}"
                result = await client.call_tool("execute", {"command": command, "timeout": 0.2})
                text = result.content[0].text  # type: ignore[union-attr]
                if "timed out" not in text:
                    problems.append(f"timeout {i}: {text[:200]}")
            else:
                with anyio.move_on_after(rng.uniform(0, 0.3)):
                    await client.call_tool(
                        "execute", {"command": f"sleep {marker} & sleep {marker}", "timeout": 60}
                    )

        for b in range(0, 1000, 40):
            batch = range(b, min(b + 40, 1000))
            async with anyio.create_task_group() as tg:
                for i in batch:
                    tg.start_soon(one, i)
        await wait_until(lambda: not processes_with(marker), 3, 0.05)
        left = processes_with(marker)
        from mcp_servers.filesystem import execute

        watchdog = {execute._reaper.pid}  # the one long-lived child, by design
        ours = [c for c in children_of(os.getpid()) if c[0] not in before_children | watchdog]
    elapsed = time.monotonic() - started
    kill_pids([pid for pid, _ in left])
    print(f"1000 executes {counts} in {elapsed:.1f} s")
    assert not problems, f"{len(problems)} executes misbehaved: {problems[:5]}"
    assert not left, f"{len(left)} orphaned processes carry the marker: {left[:5]}"
    assert not ours, f"children of the test process left behind (pid, state): {ours[:10]}"


# --------------------------------------------------------------------------- 6. path escapes


SECRET = "SECRET-TOKEN-d41d8cd9"
OUTSIDE_NAME = "OUTSIDE-ONLY-NAME.txt"


def snapshot(top: Path, skip: Path) -> dict[str, str]:
    """Everything under `top` except `skip`: name -> kind and content hash (no link follows)."""
    state: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if here / d != skip]
        for name in dirnames + filenames:
            p = here / name
            if p.is_symlink():
                state[str(p)] = "link:" + os.readlink(p)
            elif p.is_file():
                state[str(p)] = "file:" + hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                state[str(p)] = "dir"
    return state


def escape_corpus(ws: Path, outside: Path, token: str, rng: random.Random) -> list[str]:
    """Paths that, if confinement failed, would land in `outside` or /tmp/drill-<token>:
    never on a system file (these drills may run as root)."""
    out_rel = os.path.relpath(outside, ws)  # "../outside"
    tmp_target = f"/tmp/drill-{token}"
    reach_outside = [
        out_rel, "sub/../" + out_rel, "sub/" + "../" + out_rel, "./" + out_rel, "link_out", "link_up/outside",
        "sub/link_upup/outside", "link_root" + str(outside), "../" * 30 + str(outside)[1:], str(outside),
        "/proc/self/root" + str(outside), f"/proc/{os.getpid()}/root{outside}", "//" + str(outside)[1:],
        str(ws) + "/../outside", str(ws) + "/link_out", "link_chain1", "link_abs_out", "link_out/.",
        "sub/../link_out", "link_out/../outside", "/proc/self/cwd/" + os.path.relpath(outside, os.getcwd()),
        "/proc/thread-self/root" + str(outside), "/./" + str(outside)[1:], str(outside) + "/.",
        "link_dangling_dir", "link_root/tmp/drill-" + token,
    ]  # fmt: skip
    files = ["secret.txt", "new-file.txt", "newsub/deep.txt", "", "."]  # never OUTSIDE_NAME: see probe
    prefixes = ["", "./", "sub/../", "nonexistent/../", ".//"]
    corpus = [
        (pre if not base.startswith("/") else "") + (f"{base}/{f}" if f else base)
        for base in reach_outside
        for f in files
        for pre in prefixes
    ]
    corpus += [
        "link_secret", "link_dangling", "sub/link_secret2", tmp_target, tmp_target + "/x.txt",
        "link_proc_cwd", "link_proc_cwd/x.txt", "link_loop", "link_loop/x",
        "/proc/self/fd/0", "/proc/self/fd/1", "/dev/stdout", "/dev/null", "/proc/self/environ",
    ]  # fmt: skip
    # odd unicode, encodings, separators and lookalikes
    odd = [
        "\u2025/outside/secret.txt", "\uff0e\uff0e/outside/secret.txt", "..\u2215outside\u2215secret.txt",
        "\u202e../outside/secret.txt", "%2e%2e/outside/secret.txt", "..%2foutside%2fsecret.txt",
        "..\\outside\\secret.txt", ".. /outside/secret.txt", " ../outside/secret.txt", "..\t/outside",
        "\ud800/../../outside/secret.txt", "a\udcff", "e\u0301/../../outside/secret.txt",
        "..\u0301/outside/secret.txt", "\u0000", "a\x00b", "../outside/secret.txt\x00.png",
        "link_out\x00/secret.txt", "~/../outside", "$HOME", "`id`", "$(touch /tmp/drill-" + token + ")",
        "\n../outside/secret.txt", "../outside/secret.txt\n", "\u00a0../outside/secret.txt",
        "sub/\u200b../../outside/secret.txt", "....//outside/secret.txt", ".../outside",
    ]  # fmt: skip
    corpus += odd
    # very long names and paths
    corpus += [
        "a" * 255, "a" * 256, "é" * 128, ("ab/" * 1400) + "x", ("../" * 1400) + str(outside)[1:],
        "sub/" + "a" * 300 + "/../../" + out_rel + "/secret.txt", "x/" * 2047 + "y",
    ]  # fmt: skip
    # random splices of the pieces above
    pieces = ["..", ".", "sub", "link_out", "link_up", "outside", "secret.txt", "", "\u2025", "a" * 50,
              "link_chain1", "/proc/self/root", str(outside)[1:], "link_root"]  # fmt: skip
    for _ in range(1000):
        parts = [rng.choice(pieces) for _ in range(rng.randrange(1, 8))]
        path = "/".join(parts)
        if rng.random() < 0.2:
            path = "/" + path
        corpus.append(path)
    return list(dict.fromkeys(corpus))


def expected_outside(ws: Path, path: str) -> bool | None:
    """True when the path resolves outside the root (it must be refused), False when inside,
    None when it is invalid anyway (NUL, unencodable, too long)."""
    if "\x00" in path:
        return None
    try:
        raw = os.fsencode(path)
    except UnicodeEncodeError:
        return None
    if len(raw) > 4096 or any(len(part) > 255 for part in raw.split(b"/")):
        return None
    candidate = path if os.path.isabs(path) else os.path.join(ws, path)
    try:
        resolved = Path(os.path.realpath(candidate))
    except (OSError, ValueError):
        return None
    return not (resolved == ws or resolved.is_relative_to(ws))


@pytest.mark.parametrize("grep_impl", ["rg", "python"])
async def test_path_escape_corpus(tmp_path: Path, grep_impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A generated corpus of escape attempts against every file tool: nothing outside the
    root is read, listed or written, and refusals name the workspace."""
    from mcp import Client

    from mcp_servers.filesystem import build_server, search

    if grep_impl == "python":
        monkeypatch.setattr(search, "find_rg", lambda: None)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # /proc/self/cwd points here, outside the root
    rng = rng_for(f"paths-{grep_impl}")
    token = uuid.uuid4().hex[:10]
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(f"{SECRET}\n")
    (outside / OUTSIDE_NAME).write_text(f"{SECRET} too\n")
    (outside / "dir").mkdir()
    (outside / "dir" / "deeper.txt").write_text(SECRET)
    ws = tmp_path / "ws"
    ws.mkdir()
    ws = ws.resolve()
    (ws / "sub").mkdir()
    (ws / "a.txt").write_text("alpha SECRET-ish? no\n")
    (ws / "sub" / "inner.txt").write_text("inner\n")
    links = {
        "link_out": "../outside", "link_abs_out": str(outside), "link_secret": "../outside/secret.txt",
        "link_up": "..", "sub/link_upup": "../..", "sub/link_secret2": "../../outside/secret.txt",
        "link_root": "/", "link_dangling": "../outside/created-by-escape.txt",
        "link_dangling_dir": "../outside/newdir", "link_proc_cwd": "/proc/self/cwd",
        "link_loop": "link_loop", "link_chain1": "link_chain2", "link_chain2": "link_out",
    }  # fmt: skip
    for name, target in links.items():
        (ws / name).symlink_to(target)
    before = snapshot(tmp_path, ws)
    corpus = escape_corpus(ws, outside, token, rng)
    escapes: list[str] = []
    unclear: list[str] = []
    bare: list[str] = []  # errors that tell the model nothing
    skipped: list[str] = []  # writes not attempted: they could hit a system file
    calls = 0

    def safe_to_write(path: str) -> bool:
        """Would this write land under tmp_path or /tmp/drill-<token> even if confinement
        failed? (The drill may run as root: never aim a write at a system file.)"""
        if expected_outside(ws, path) is None:
            return True  # refused before any resolution
        candidate = path if os.path.isabs(path) else os.path.join(ws, path)
        resolved = os.path.realpath(candidate)
        return resolved.startswith((str(tmp_path) + "/", f"/tmp/drill-{token}"))

    def text_of(result: Any) -> str:
        return "\n".join(getattr(c, "text", "") for c in result.content)

    async with Client(build_server(ws)) as client:

        async def probe(tool: str, args: dict[str, Any], path: str) -> None:
            nonlocal calls
            calls += 1
            outside_expected = expected_outside(ws, path)
            if tool in ("write_file", "edit_file") and not safe_to_write(path):
                skipped.append(path)
                return
            result = await client.call_tool(tool, args)
            text = text_of(result)
            blob = text + json.dumps(result.structured_content or {}) + json.dumps(result.meta or {})
            named = OUTSIDE_NAME in json.dumps(args)  # an error may echo the argument
            if SECRET in blob or (OUTSIDE_NAME in blob and tool in ("ls", "glob") and not named):
                escapes.append(f"{tool}({args}) revealed outside content: {blob[:200]!r}")
            if result.is_error and text.strip() == f"Error executing tool {tool}":
                bare.append(f"{tool}({path[:60]!r}...{len(path)} chars)")
            if outside_expected and not result.is_error:
                escapes.append(f"{tool}({path!r}) resolves outside but succeeded: {text[:200]!r}")
            if outside_expected and result.is_error and "workspace" not in text:
                unclear.append(f"{tool}({path!r}): {text[:200]!r}")

        for i, path in enumerate(corpus):
            await probe("read_file", {"path": path}, path)
            await probe("ls", {"path": path}, path)
            await probe("write_file", {"path": path, "content": f"ESCAPED {token} {i}"}, path)
            await probe("edit_file", {"path": path, "old_text": SECRET[-8:], "new_text": "PWNED"}, path)
            if i % 4 == 0:
                await probe("grep", {"pattern": "SECRET-TOKEN", "path": path}, path)
                await probe("glob", {"pattern": "**/*", "path": path}, path)
        for pattern in ["../*", "../**", "**/../../*", "../outside/*", "link_out/*", "link_out/**",
                        "{..,.}/*", "**/*secret*", "*/../../**", "link_*/**", "**", "[.][.]/*",
                        "/tmp/*", str(outside) + "/*"]:  # fmt: skip
            await probe("glob", {"pattern": pattern}, ".")
            await probe("grep", {"pattern": "SECRET-TOKEN", "glob": pattern}, ".")
        for mode in ("content", "files_with_matches", "count"):
            await probe("grep", {"pattern": "SECRET", "output_mode": mode}, ".")
            await probe("grep", {"pattern": ".", "path": "link_out", "output_mode": mode}, "link_out")
    after = snapshot(tmp_path, ws)
    changed = {
        k: (before.get(k), after.get(k))
        for k in before.keys() | after.keys()
        if before.get(k) != after.get(k)
    }
    tmp_hits = [p for p in os.listdir("/tmp") if token in p]
    print(f"{len(corpus)} paths, {calls} calls, {len(skipped)} writes skipped as unsafe")
    assert not changed, f"files outside the workspace changed: {list(changed.items())[:5]}"
    assert not tmp_hits, f"written outside the workspace: {tmp_hits}"
    assert not escapes, f"{len(escapes)} escapes:\n" + "\n".join(escapes[:10])
    assert not unclear, f"{len(unclear)} refusals do not mention the workspace:\n" + "\n".join(unclear[:10])
    assert not bare, (
        f"{len(bare)} errors without a reason (an unhandled exception in the tool):\n" + "\n".join(bare[:10])
    )
