"""What a session can ask of the ACP client: permission, a form, its files, its terminals.

Hooks reach it as `ctx.session.client`; it is None when no editor is attached (`crow run`).
Each capability is used only when the client advertised it in `initialize`. A subagent
asks through `for_child`: the same connection, terminals and one-question-at-a-time lock,
its questions naming it.
"""

from __future__ import annotations

import copy
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
from acp import RequestError, text_block, tool_content
from acp.schema import ClientCapabilities, EnvVariable, PermissionOption, ToolCallUpdate

from crow.acp import view as acp_view
from crow.acp import wire as acp_wire
from crow.acp.protocol import ClientFeatures
from crow.editor import Elicited
from crow.events import child_call_id
from crow.llm.base import ToolSpec
from crow.messages import ToolCall
from crow.rules import Choice

log = logging.getLogger("crow.acp")

# Offered when the caller names no options (crow's permissions hook always does).
DEFAULT_CHOICES: tuple[Choice, ...] = (
    Choice("allow_once", "allow_once", "Allow"),
    Choice("reject_once", "reject_once", "Reject"),
)
_OUTPUT_LIMIT = 100_000
_RELEASE_GRACE = 5.0  # seconds a cancelled command has to kill and release its terminal
RESOURCE_NOT_FOUND = -32002  # what editors answer fs/read_text_file for a missing file


class AcpSessionClient:
    def __init__(self, conn: Any, session_id: str, caps: ClientCapabilities | None, cwd: Path) -> None:
        self.conn = conn
        self.session_id = session_id
        self.cwd = cwd
        fs = caps.fs if caps is not None else None
        self.can_read = bool(fs and fs.read_text_file)
        self.can_write = bool(fs and fs.write_text_file)
        self.can_terminal = bool(caps and caps.terminal)
        features = ClientFeatures.of(caps)
        self.can_elicit = features.elicitation_form
        self.shows_subagents = features.subagents
        self._terminals: dict[str, str] = {}  # created and not yet released -> on which session
        # Made at the first question: the first anyio.Lock() imports anyio's asyncio
        # backend (~15 ms), which must not land on session/new.
        self._asking: anyio.Lock | None = None
        self._top = self  # whose lock a subagent's client shares
        self.asker = ""  # a subagent's name, before each question's title
        self.shown_id: Callable[[str], str] = lambda call_id: call_id  # a call's id as the editor shows it

    def for_child(self, *, session_id: str, name: str, parent_call_id: str) -> AcpSessionClient:
        """What subagent `session_id` (run by this session's call `parent_call_id`) asks
        through: its questions name it; they are on its own session with its own call ids when
        the editor shows subagents, else on this one with the ids its calls are shown under
        there (`child_call_id`)."""
        child = copy.copy(self)  # the connection, capabilities and terminals, shared
        child.asker = name
        if self.shows_subagents:
            child.session_id, child.shown_id = session_id, lambda call_id: call_id
        else:
            task_call = self.shown_id(parent_call_id)
            child.shown_id = lambda call_id: child_call_id(task_call, call_id)
        return child

    def _lock(self) -> anyio.Lock:
        """The one-question-at-a-time lock of the whole subagent tree."""
        if self._top._asking is None:
            self._top._asking = anyio.Lock()
        return self._top._asking

    def _titled(self, title: str) -> str:
        return f"{self.asker}: {title}" if self.asker else title

    async def ask_permission(
        self,
        call: ToolCall,
        *,
        options: Sequence[Choice] = DEFAULT_CHOICES,
        spec: ToolSpec | None = None,
        timeout: float = 600.0,
    ) -> str | None:
        """Ask the user, one request at a time; returns the chosen option id, or None
        (cancelled or no answer). `spec` (the tool's kind and title) shapes the request."""
        call = call.replace(id=self.shown_id(call.id))
        start = acp_view.start_update(call, self.cwd, spec)
        update = ToolCallUpdate(
            tool_call_id=call.id,
            title=self._titled(start.title),
            kind=start.kind,
            status="pending",
            locations=start.locations,
            raw_input=start.raw_input,
            content=acp_view.preview(call, self.cwd, spec),
        )
        offered = [PermissionOption(option_id=o.id, name=o.label, kind=o.kind) for o in options]
        return await self._request(update, offered, f"permission request for {call.name}", timeout)

    async def ask(
        self,
        call: ToolCall,
        options: Sequence[tuple[str, str, str]],
        *,
        title: str,
        text: str,
        kind: str | None = None,
        timeout: float = 600.0,
    ) -> str | None:
        """Ask the user a question about `call` with its own options, each (option_id, label,
        permission kind); `text` (markdown) is what the request shows. Returns the chosen
        option_id, or None (cancelled, failed or unanswered)."""
        choices = [PermissionOption(option_id=i, name=label, kind=k) for i, label, k in options]
        update = ToolCallUpdate(
            tool_call_id=self.shown_id(call.id),
            title=self._titled(title),
            kind=kind,
            status="pending",
            content=[tool_content(text_block(text))],
        )
        return await self._request(update, choices, f"question about {call.name}", timeout)

    async def _request(
        self, update: ToolCallUpdate, offered: list[PermissionOption], what: str, timeout: float
    ) -> str | None:
        """One `session/request_permission` at a time per session (a batch's other calls
        wait for this answer); the chosen option id, or None. An id that was not offered
        counts as no answer. A wait that ends early (the turn cancelled by a delete or by
        `$/cancel_request`, which the editor did not see as a `session/cancel`; `timeout`)
        tells the client with `$/cancel_request` (`acp_wire.request`): its dialog goes."""
        from acp.schema import RequestPermissionRequest, RequestPermissionResponse
        from pydantic import ValidationError

        request = RequestPermissionRequest(session_id=self.session_id, tool_call=update, options=offered)
        params = request.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_defaults=True)
        async with self._lock():
            with anyio.move_on_after(timeout):
                try:
                    answer = await acp_wire.request(self.conn, "session/request_permission", params)
                    response = RequestPermissionResponse.model_validate(answer)
                except (RequestError, ValidationError) as exc:
                    log.warning("%s failed: %s", what, exc)
                    return None
                except ConnectionError:  # the client has gone: no answer (the turn ends with it)
                    log.info("%s unanswered: the client has gone", what)
                    return None
                outcome = response.outcome
                chosen = outcome.option_id if getattr(outcome, "outcome", None) == "selected" else None
                return chosen if any(o.option_id == chosen for o in offered) else None
        log.info("%s unanswered after %.0f s: rejected", what, timeout)
        return None

    async def elicit(
        self, call: ToolCall | None, message: str, schema: Mapping[str, Any], *, timeout: float = 600.0
    ) -> Elicited:
        """`elicitation/create` in form mode, scoped to this session and to `call` (when
        given); one question at a time, with the permission requests. When the wait ends
        early (a cancelled turn, `timeout`), `$/cancel_request` tells the client. A failed
        request, no answer or a malformed one: "cancel". Raises ValueError for a `schema`
        that is not an elicitation schema (the caller's bug)."""
        from acp.schema import CreateFormSessionElicitationRequest, ElicitationSchema
        from pydantic import ValidationError

        if not self.can_elicit:
            raise RuntimeError("the client did not advertise elicitation.form")
        try:
            request = CreateFormSessionElicitationRequest(
                session_id=self.session_id,
                tool_call_id=self.shown_id(call.id) if call is not None else None,
                message=self._titled(message),
                mode="form",
                requested_schema=ElicitationSchema.model_validate(dict(schema)),
            )
        except ValidationError as exc:
            raise ValueError(f"not an elicitation schema: {exc}") from exc
        params = request.model_dump(mode="json", by_alias=True, exclude_none=True)
        async with self._lock():
            with anyio.move_on_after(timeout):
                try:
                    answer = await acp_wire.request(self.conn, "elicitation/create", params)
                except (RequestError, ConnectionError) as exc:  # failed, or the client has gone
                    log.warning("elicitation for %s failed: %s", call.name if call else message[:60], exc)
                    return Elicited("cancel")
                return _elicited(answer)
        log.info("elicitation unanswered after %.0f s", timeout)
        return Elicited("cancel")

    async def ask_choice(
        self, title: str, text: str, options: list[tuple[str, str]], *, timeout: float = 600.0
    ) -> str | None:
        """A question that is not a tool call (e.g. trusting a folder), through
        session/request_permission. `options` are (kind, label) pairs; returns the chosen
        kind, or None (cancelled, failed or unanswered)."""
        update = ToolCallUpdate(
            tool_call_id=f"crow-question-{uuid.uuid4().hex[:12]}",
            title=self._titled(title),
            kind="other",
            status="pending",
            content=[tool_content(text_block(text))],
        )
        offered = [PermissionOption(option_id=kind, name=name, kind=kind) for kind, name in options]
        return await self._request(update, offered, f"question {title!r}", timeout)

    async def read_text(self, path: Path) -> str:
        try:
            response = await self.conn.read_text_file(session_id=self.session_id, path=str(path))
        except RequestError as exc:
            raise _os_error(exc, "read", path) from exc
        return response.content

    async def write_text(self, path: Path, text: str) -> None:
        try:
            await self.conn.write_text_file(session_id=self.session_id, path=str(path), content=text)
        except RequestError as exc:
            raise _os_error(exc, "write", path) from exc

    async def run_in_terminal(
        self, command: str, cwd: Path, timeout: float, env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Run in an editor terminal; returns output, exit_code, timed_out, truncated, terminal_id."""
        terminal = await self.conn.create_terminal(
            session_id=self.session_id,
            command="/bin/sh",
            args=["-c", command],
            cwd=str(cwd),
            env=[EnvVariable(name=k, value=v) for k, v in (env or {}).items()],
            output_byte_limit=_OUTPUT_LIMIT,
        )
        tid = terminal.terminal_id
        self._terminals[tid] = self.session_id
        timed_out = False
        try:
            with anyio.move_on_after(timeout) as scope:
                exit_status = await self.conn.wait_for_terminal_exit(
                    session_id=self.session_id, terminal_id=tid
                )
            if scope.cancelled_caught:
                timed_out = True
                await self.conn.kill_terminal(session_id=self.session_id, terminal_id=tid)
                exit_status = None
            out = await self.conn.terminal_output(session_id=self.session_id, terminal_id=tid)
        except BaseException:  # cancelled or failed: no result will show this terminal
            with anyio.move_on_after(_RELEASE_GRACE, shield=True):
                try:
                    await self.conn.kill_terminal(session_id=self.session_id, terminal_id=tid)
                except Exception:
                    log.debug("kill_terminal failed", exc_info=True)
                await self.release_terminal(tid)
            raise
        code = getattr(exit_status, "exit_code", None) if exit_status is not None else None
        return {
            "output": out.output,
            "exit_code": code,
            "timed_out": timed_out,
            "truncated": bool(out.truncated),
            "terminal_id": tid,
        }

    async def release_terminal(self, terminal_id: str) -> None:
        """`terminal/release`, once, for a terminal this client (or a subagent's) created."""
        session_id = self._terminals.pop(terminal_id, None)
        if session_id is None:
            return
        try:
            await self.conn.release_terminal(session_id=session_id, terminal_id=terminal_id)
        except Exception:
            log.debug("release_terminal failed", exc_info=True)

    async def release_terminals(self) -> None:
        """Release what a turn left (a cancel after its command ended, before its result was
        shown): no terminal outlives the prompt that made it."""
        if not self._terminals:
            return
        with anyio.move_on_after(_RELEASE_GRACE, shield=True):
            for terminal_id in list(self._terminals):
                await self.release_terminal(terminal_id)


def _elicited(answer: Any) -> Elicited:
    """The client's answer to `elicitation/create`, as far as its shape goes (what the
    content says is the asker's to check)."""
    action = answer.get("action") if isinstance(answer, dict) else None
    if not isinstance(action, str):
        log.warning("elicitation answered without an action: %.200r", answer)
        return Elicited("cancel")
    content = answer.get("content")
    if action != "accept" or content is None:
        return Elicited(action)
    if not isinstance(content, dict):
        log.warning("elicitation answered with content that is not an object: %.200r", content)
        return Elicited(action)
    return Elicited(action, content)


def _os_error(exc: RequestError, verb: str, path: Path) -> OSError:
    """The editor's JSON-RPC error as the OSError the file tools already explain to the model."""
    if exc.code == RESOURCE_NOT_FOUND:
        return FileNotFoundError(2, "No such file or directory", str(path))
    detail = exc.data.get("details") if isinstance(exc.data, dict) else None
    return OSError(f"the editor could not {verb} {path}: {detail or exc}")
