"""AskHook: the `ask_user(question, options?, multiple?)` tool, the model asking the user.

How the question reaches the user depends on the front end (`session.client`):

- it shows forms (`can_elicit`: an ACP client that advertised `elicitation.form`, `crow
  run` on a terminal): a form with one field, `answer`: one of the options (a string
  enum), several (`multiple`: an array of that enum), or free text. The answer is the
  tool's result; declining or dismissing the form is a result the model reads too, and an
  answer that does not fit the form is refused with the reason.
- it only asks permission questions (an ACP client without elicitation) and the question
  has options: a `session/request_permission` with one option per choice, and "Skip the
  question". That way takes one choice: for `multiple` the result tells the model so.
- otherwise (free text without forms, or nobody attached to ask: `crow run` in a script):
  the question ends the turn as its answer's text and the user's reply comes as the next
  prompt. The call's result says so (the history stays valid); the model call that would
  follow is answered with the question instead of calling the model, and the turn ends
  `end_turn`.

Asking changes nothing, so the tool is read-only to the permissions hook: it runs in
every mode, plan and read-only included, without a permission question of its own. A
cancel while the user is asked ends the request (`$/cancel_request` for a form).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from crow import (
    EditorClient,
    Hook,
    HookContext,
    Message,
    ModelRequest,
    ModelResponse,
    ServerSpec,
    Session,
    Stop,
    TextDelta,
    ToolCall,
    ToolResult,
)

log = logging.getLogger("crow.hooks.ask")

TOOL = "ask_user"
MAX_QUESTION = 2_000  # characters: a question, not a document
MAX_OPTIONS = 10
MAX_OPTION = 200  # characters of one option
MAX_ANSWER = 10_000  # characters of a typed answer the model gets
FIELD = "answer"  # the form's one field
SKIP = "skip"  # the permission question's way not to answer
_END_TURN = "ask.end_turn"  # ctx.turn_state: questions that end this turn, in order
_ENDED = "ask.ended"  # ctx.turn_state: the turn's answer is the question

ENDS_TURN = (
    "The question is shown to the user as your answer and the turn ends here: their reply "
    "comes as their next message. Do nothing more in this turn."
)
DECLINED = (
    "The user declined to answer. Do not ask the same again: go on with your best judgement "
    "and say what you assumed, or stop and explain what you need."
)
DISMISSED = (
    "The question went unanswered (dismissed, or no answer in time). Go on with your best "
    "judgement and say what you assumed, or stop and explain what you need."
)


@dataclass(frozen=True, slots=True)
class Question:
    text: str
    options: tuple[str, ...] = ()
    multiple: bool = False

    @classmethod
    def of(cls, args: Mapping[str, Any]) -> Question:
        """From arguments `problem` found nothing wrong with. `multiple` is read as the
        tool's server validated it ("false" is false there, and not to `bool`)."""
        from pydantic import TypeAdapter

        options = tuple(o.strip() for o in args.get("options") or ())
        multiple = TypeAdapter(bool).validate_python(args.get("multiple") or False)
        return cls(str(args["question"]).strip(), options, multiple and bool(options))

    def schema(self) -> dict[str, Any]:
        """The form: one field, `answer`."""
        if not self.options:
            field: dict[str, Any] = {"type": "string", "title": "Your answer"}
        elif self.multiple:
            items = {"type": "string", "enum": list(self.options)}
            field = {"type": "array", "title": "Choose any", "items": items}
        else:
            field = {"type": "string", "title": "Choose one", "enum": list(self.options)}
        return {"type": "object", "properties": {FIELD: field}, "required": [FIELD]}

    def as_text(self) -> str:
        """The question as the answer of a turn it ends, its options listed."""
        if not self.options:
            return self.text
        lines = [self.text, "", *(f"- {o}" for o in self.options)]
        if self.multiple:
            lines += ["", "(Any number of these.)"]
        return "\n".join(lines)


def problem(question: str, options: Sequence[str] | None, multiple: bool) -> str | None:
    """What is wrong with the arguments, in words for the model; None when nothing is."""
    if not question.strip():
        return "`question` is empty: write the question itself"
    if len(question) > MAX_QUESTION:
        return f"`question` is {len(question):,} characters; keep it to {MAX_QUESTION:,} at most"
    if options is None:
        return "`multiple` needs `options` to choose from" if multiple else None
    if len(options) < 2:
        return "give at least 2 `options`, or leave `options` out for a free-text answer"
    if len(options) > MAX_OPTIONS:
        return f"{len(options)} options are too many; give at most {MAX_OPTIONS}"
    stripped = [o.strip() for o in options]
    if not all(stripped):
        return "an option is empty: each option is the text of one choice"
    if (longest := max(map(len, stripped))) > MAX_OPTION:
        return f"an option is {longest} characters; keep each to {MAX_OPTION} at most"
    if len(set(stripped)) < len(stripped):
        return "two options are the same: each must be a different choice"
    return None


def read_answer(question: Question, content: Mapping[str, Any] | None) -> str | list[str]:
    """The accepted form's answer; ValueError saying why it does not fit the form."""
    if not isinstance(content, Mapping) or FIELD not in content:
        raise ValueError(f"it has no `{FIELD}`")
    value = content[FIELD]
    if question.multiple:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"`{FIELD}` is {_shown(value)}, not a list of the options")
        unknown = [v for v in value if v not in question.options]
        if unknown:
            raise ValueError(f"{_shown(unknown[0])} is not one of the options")
        return list(dict.fromkeys(value))
    if not isinstance(value, str):
        raise ValueError(f"`{FIELD}` is {_shown(value)}, not text")
    if question.options and value not in question.options:
        raise ValueError(f"{_shown(value)} is not one of the options")
    return value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def answered(question: Question, answer: str | list[str]) -> str:
    """The tool's result for an answer, in words the model reads."""
    if isinstance(answer, list):
        return (
            f"The user chose: {', '.join(map(_quoted, answer))}."
            if answer
            else ("The user chose none of the options.")
        )
    if question.options:
        return f"The user chose {_quoted(answer)}."
    if not answer.strip():
        return "The user sent an empty answer."
    if len(answer) > MAX_ANSWER:
        answer = f"{answer[:MAX_ANSWER]}\n[cut: the answer was {len(answer):,} characters]"
    return f"The user answered:\n{answer}"


def _quoted(text: str) -> str:
    return '"' + text.replace('"', '\\"') + '"'


class AskHook(Hook):
    name = "ask"
    order = -75  # inside permissions and plan: they may refuse the call before it asks

    def __init__(self, timeout: float = 600.0) -> None:
        self.timeout = timeout
        self._server: Any = None

    def tool_servers(self, session: Session) -> list[ServerSpec]:
        # One server for every session: the tool only checks its arguments (this hook does
        # the asking), and it is called in-process, with nothing kept between calls.
        if self._server is None:
            self._server = self._build_server()
        return [ServerSpec("ask", "inprocess", server=self._server)]

    @staticmethod
    def _build_server() -> Any:
        from mcp.server.mcpserver.exceptions import ToolError

        from crow import function_server

        async def ask_user(question: str, options: list[str] | None = None, multiple: bool = False) -> str:
            """Ask the user a question and wait for the answer: when you need a decision or
            a fact only the user has, ask instead of guessing. Give `options` (2 to 10
            short choices) when the answer is one of a few; set `multiple` when several may
            be chosen; leave `options` out for a free-text answer. The answer is this tool's
            result; where the user cannot be asked right away, the question ends your turn
            and their reply comes as their next message."""
            if (wrong := problem(question, options, multiple)) is not None:
                raise ToolError(wrong)
            # What the call answers when crow's ask hook did not take it (then nobody asks).
            return "The question was not shown: nothing in crow was there to ask it."

        shown = {TOOL: ("other", "Ask: {question}")}
        return function_server([(ask_user, True)], "crow-ask", shown)

    async def wrap_tool_call(self, ctx: HookContext, call: ToolCall, call_next: Any) -> ToolResult:
        hub = ctx.session.tools
        if call.name != TOOL or hub is None or not hub.trusted(call.name):
            return await call_next(call)  # another server's `ask_user` is its own tool
        checked: ToolResult = await call_next(call)  # the server checks the arguments
        if checked.is_error:
            return checked
        question = Question.of(call.args)
        client: EditorClient | None = ctx.session.client
        if client is not None and getattr(client, "can_elicit", False):
            return await self._form(client, call, question)
        if client is not None and question.options:
            return await self._choice(client, call, question)
        ctx.turn_state.setdefault(_END_TURN, []).append(question.as_text())
        return ToolResult(call.id, call.name, output=ENDS_TURN)

    async def _form(self, client: EditorClient, call: ToolCall, question: Question) -> ToolResult:
        reply = await client.elicit(call, question.text, question.schema(), timeout=self.timeout)
        if reply.action == "accept":
            try:
                answer = read_answer(question, reply.content)
            except ValueError as exc:
                log.warning("ask_user %s: an answer that does not fit the form: %s", call.id, exc)
                return ToolResult(
                    call.id,
                    call.name,
                    error=f"The editor sent an answer that does not fit the question ({exc}); it "
                    "was ignored. Ask again if you still need the answer.",
                )
            return ToolResult(call.id, call.name, output=answered(question, answer))
        if reply.action == "decline":
            return ToolResult(call.id, call.name, output=DECLINED)
        if reply.action == "cancel":
            return ToolResult(call.id, call.name, output=DISMISSED)
        return ToolResult(
            call.id,
            call.name,
            error=f"The editor answered with {_shown(reply.action)}, which crow does not know: "
            "no answer. Go on with your best judgement and say what you assumed.",
        )

    async def _choice(self, client: EditorClient, call: ToolCall, question: Question) -> ToolResult:
        """A question with options, as a permission question: one choice."""
        options = [(str(n), label, "allow_once") for n, label in enumerate(question.options)]
        options.append((SKIP, "Skip the question", "reject_once"))
        text = question.text
        if question.multiple:
            text += "\n\n(Several could apply; pick the one that matters most.)"
        shown = question.text if len(question.text) <= 80 else question.text[:77] + "..."
        title = f"Ask: {shown}"  # as the call's title shows it (its `shown` template)
        chosen = await client.ask(call, options, title=title, text=text, kind="other", timeout=self.timeout)
        if chosen is None:
            return ToolResult(call.id, call.name, output=DISMISSED)
        if chosen == SKIP:
            return ToolResult(call.id, call.name, output=DECLINED)
        output = answered(question, question.options[int(chosen)])
        if question.multiple:
            output += (
                " Only one could be picked: this editor shows questions with one answer. Ask "
                "again (without `multiple`) if another choice matters too."
            )
        return ToolResult(call.id, call.name, output=output)

    async def wrap_model_call(self, ctx: HookContext, request: ModelRequest, call_next: Any) -> ModelResponse:
        questions = ctx.turn_state.pop(_END_TURN, None)
        if not questions:
            return await call_next(request)
        text = "\n\n".join(questions)  # several calls in one reply: all of them
        message = Message("assistant", text, id=str(uuid.uuid4()))
        await ctx.send(TextDelta(text, message.id))
        ctx.turn_state[_ENDED] = True
        return ModelResponse(message, stop_reason="end_turn")

    async def agent_stop(self, ctx: HookContext) -> Stop | None:
        # The question is the turn's answer: no other hook's Continue reopens it.
        return Stop("end_turn") if ctx.turn_state.pop(_ENDED, False) else None


def factory(agent: Any) -> AskHook:
    settings = agent.config.hooks.settings.get("ask", {})
    return AskHook(timeout=float(settings.get("timeout", agent.config.permission_timeout)))
