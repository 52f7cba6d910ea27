"""What compaction asks the model, and what replaces the old history: pure functions.

Cache-preserving requests (the default): the summary request repeats the previous model
request (`session.last_request`) exactly — same system message, tools, model and options,
the same messages — and only appends one user message with the instruction, with
`tool_choice="none"`. A provider's prompt cache then covers nearly all of it.
`prefix_share` measures that: serialize the request as a list of items (the tool list,
then each message, as JSON), walk both requests while the items are equal, and divide the
characters of the shared items by the characters of the whole summary request. Without a
previous request (or with `cache_preserving: false`, or when the history no longer fits
the window) the request is standalone: a summarizer system prompt and the old messages
rendered as text, old write_file/edit_file arguments cut, no tools.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from crow.compact.cut import closed_prefix
from crow.llm.base import ModelRequest
from crow.messages import Message, human, system

__all__ = [
    "cached_request",
    "prefix_share",
    "render",
    "standalone_request",
    "summary_message",
]

# Tools whose (often huge) arguments are cut in the summarized part of the history.
FILE_WRITE_TOOLS = frozenset({"write_file", "edit_file"})

SUMMARY_INTRO = (
    "This conversation was compacted to fit the context window. The summary below "
    "replaces the earlier messages; the most recent messages follow it unchanged."
)

SUMMARIZER_SYSTEM = (
    "You summarize conversations between a user and a coding agent so that the agent can "
    "continue the work with only your summary and the most recent messages."
)


def instruction(words: int, kept: int, extra: str | None) -> str:
    """The user message that asks for the summary; `kept` messages stay after it."""
    tail = (
        f" The last {kept} messages will stay in the context verbatim after your summary, "
        "so concentrate on what came before them."
        if kept
        else ""
    )
    text = (
        "Stop working on the task for a moment: the conversation is about to be compacted. "
        "Do not call any tools. Write a summary of the conversation so far, under "
        f"{words} words, that lets you continue the work without the earlier messages."
        f"{tail} Preserve:\n"
        "1. The user's goals, requests and constraints, in their own words where it matters.\n"
        "2. Decisions made and why.\n"
        "3. Files read, written or edited, with the key details (paths, functions, what "
        "changed).\n"
        "4. Errors met and how they were fixed.\n"
        "5. The current state of the work and the next steps.\n"
        "6. Any todo items and their status.\n"
        "Answer with the summary only, as plain text or Markdown."
    )
    if extra and extra.strip():
        text += f"\n\nAdditional instructions from the user:\n{extra.strip()}"
    return text


def summary_message(summary: str) -> Message:
    """The user message that stands in for the summarized part of the history."""
    return Message("user", f"{SUMMARY_INTRO}\n\n<summary>\n{summary}\n</summary>", meta={"crow": "summary"})


def summary_text(answer: str) -> str:
    """The model's answer without the <summary> tags some models add around it."""
    text = answer.strip()
    if text.startswith("<summary>") and text.endswith("</summary>"):
        text = text[len("<summary>") : -len("</summary>")].strip()
    return text


# ---------------------------------------------------------------- the two requests
def cached_request(
    previous: ModelRequest, messages: Sequence[Message], kept: int, words: int, extra: str | None
) -> ModelRequest:
    """The previous request again — its system message(s), tools, model and options —
    with the session's current messages and one user message asking for the summary."""
    head = []
    for m in previous.messages:
        if m.role != "system":
            break
        head.append(m)
    body = closed_prefix(messages)
    visible = kept - (len(messages) - len(body))  # the open call is not in the request
    ask = human(instruction(words, max(visible, 0), extra))
    return previous.replace(messages=[*head, *body, ask], tool_choice="none")


def standalone_request(
    old: Sequence[Message],
    *,
    model: str,
    context_window: int,
    words: int,
    max_arg_chars: int,
    extra: str | None,
) -> ModelRequest:
    """A request of its own: the old messages as text, cut to fit the window."""
    budget = max(4000, int(context_window * 4 * 0.6))  # chars; room for the answer
    text = render(old, max_arg_chars)
    if len(text) > budget:
        text = render(old, max_arg_chars, max_output_chars=max_arg_chars // 2)
    if len(text) > budget:
        text = "[... the oldest part of the conversation was cut ...]\n" + text[-budget:]
    prompt = f"<conversation>\n{text}\n</conversation>\n\n{instruction(words, 0, extra)}"
    return ModelRequest(messages=[system(SUMMARIZER_SYSTEM), human(prompt)], model=model)


# ---------------------------------------------------------------- prefix share
def _item(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, sort_keys=True, default=str)


def _message_item(m: Message) -> str:
    d = m.to_dict()
    d.pop("meta", None)  # never sent to the model
    return _item(d)


def _request_items(request: ModelRequest) -> list[str]:
    tools = _item([dataclasses.asdict(t) for t in request.tools])
    return [tools, *(_message_item(m) for m in request.messages)]


def prefix_share(request: ModelRequest, previous: ModelRequest | None) -> float | None:
    """Share of `request` (serialized JSON characters, tools then messages) that repeats
    `previous` exactly from the start; None without a previous request."""
    if previous is None:
        return None
    mine, theirs = _request_items(request), _request_items(previous)
    total = sum(map(len, mine))
    shared = 0
    for a, b in zip(mine, theirs, strict=False):
        if a != b:
            break
        shared += len(a)
    return shared / total if total else 0.0


# ---------------------------------------------------------------- the history as text
def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... {len(text) - limit} more characters cut by compaction]"


def _head_tail(text: str, limit: int) -> str:
    if len(text) <= 2 * limit:
        return text
    return f"{text[:limit]}\n[... {len(text) - 2 * limit} characters cut ...]\n{text[-limit:]}"


def render(
    messages: Sequence[Message], max_arg_chars: int = 2000, max_output_chars: int | None = None
) -> str:
    """The messages as plain text for a standalone summary request. String arguments of
    write_file/edit_file calls are cut to `max_arg_chars` with a marker; tool outputs are
    cut to head and tail when `max_output_chars` is given."""
    labels = {"system": "System", "user": "User", "assistant": "Assistant"}
    parts = []
    for m in messages:
        if m.role == "tool":
            head = f"[Tool result: {m.name}{' (error)' if m.is_error else ''}]"
            body = m.content if max_output_chars is None else _head_tail(m.content, max_output_chars)
            parts.append(f"{head}\n{body}")
            continue
        lines = [f"[{labels.get(m.role, m.role)}]"]
        if m.content:
            lines.append(m.content)
        for call in m.tool_calls:
            args = dict(call.args)
            if call.name in FILE_WRITE_TOOLS:
                args = {k: _cut(v, max_arg_chars) if isinstance(v, str) else v for k, v in args.items()}
            lines.append(f"→ {call.name}({json.dumps(args, ensure_ascii=False)})")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)
