"""MCP prompts as slash commands: `/<server>.<prompt> arguments`.

The hub lists each server's prompts when it connects (a server without the prompts
capability has none) and again when the server sends `notifications/prompts/list_changed`.
Arguments come from the command line, `name=value` or positional (in the order the prompt
declares them; quotes group words); a `name=` the prompt does not declare is a positional
value. A missing required argument, or one too many, refuses the command. `prompts/get`
expands it: its messages become one user prompt, in order. Text is kept as is; images are
attached (checked as a client's are); an embedded text resource is quoted in a
`<context ref=URI>` block, a binary one or a link is named; audio is named as unsupported;
an assistant message's text is marked `Assistant:`.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from crow import images
from crow.commands import NAME, PromptCommand, split_arguments
from crow.errors import CommandError
from crow.messages import Image, Message

if TYPE_CHECKING:
    from crow.tools import ToolHub

log = logging.getLogger("crow.commands")

MAX_PROMPTS = 500  # per server: what a listing may hold (pages of a hostile server end there)
# A server's prompts are listed again at most this often: a server announcing a change
# every millisecond costs a listing (and an `available_commands_update`) a second, and
# its last change is still listed.
RELIST_INTERVAL = 1.0
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")


def offers_prompts(client: Any) -> bool:
    """Whether a connected server declared the prompts capability (crow's own servers,
    called in-process, declare nothing)."""
    capabilities = getattr(client, "server_capabilities", None)
    return capabilities is not None and getattr(capabilities, "prompts", None) is not None


async def list_prompts(client: Any) -> list[Any]:
    """A connected server's prompts; none when it does not offer the capability."""
    if not offers_prompts(client):
        return []
    prompts: list[Any] = []
    cursor: str | None = None
    while len(prompts) < MAX_PROMPTS:
        page = await client.list_prompts(cursor=cursor, cache_mode="refresh")
        prompts += page.prompts
        cursor = page.next_cursor
        if not cursor:
            break
    return prompts[:MAX_PROMPTS]


async def relisting(
    changed: asyncio.Event, closing: asyncio.Event, relist: Callable[[], Awaitable[None]]
) -> None:
    """Until `closing` is set: each time `changed` is set (the server's list_changed came),
    clear it and `relist()`; at most once per `RELIST_INTERVAL`."""
    import anyio

    async def watch() -> None:
        while True:
            await changed.wait()
            changed.clear()
            await relist()
            await anyio.sleep(RELIST_INTERVAL)  # changes meanwhile: one listing after it

    async with anyio.create_task_group() as group:
        group.start_soon(watch)
        await closing.wait()
        group.cancel_scope.cancel()


async def get_prompt(
    client: Any,
    server: str,
    name: str,
    arguments: dict[str, str],
    timeout: float,
    describe: Callable[[BaseException], str],
) -> Any:
    """`prompts/get` through a connected server's client; CommandError when it cannot answer."""
    if client is None:
        raise CommandError(f"the MCP server {server!r} is not running")
    try:
        return await asyncio.wait_for(client.get_prompt(name, arguments), timeout)
    except TimeoutError as exc:
        raise CommandError(f"MCP server {server!r} did not answer within {timeout:.0f} s") from exc
    except Exception as exc:  # MCP and transport errors stop here
        raise CommandError(f"MCP server {server!r} refused prompt {name!r}: {describe(exc)}") from exc


def commands(hub: ToolHub) -> list[PromptCommand]:
    """Each prompt of the hub's servers as a command named `<server>.<prompt>`."""
    out: list[PromptCommand] = []
    for server, prompt in hub.prompts():
        name = f"{_UNSAFE.sub('-', server)}.{_UNSAFE.sub('-', prompt.name)}"
        if not NAME.fullmatch(name):
            log.info("MCP prompt %r of %r: no usable command name; not offered", prompt.name, server)
            continue
        declared = list(prompt.arguments or ())
        hint = " ".join(a.name if a.required else f"[{a.name}]" for a in declared)
        description = prompt.description or prompt.title or f"MCP prompt {prompt.name}"
        expand = partial(_expand, hub, server, prompt.name, name, declared)
        out.append(PromptCommand(name, description, expand, hint, "mcp", f"MCP server {server}"))
    return out


def prompt_arguments(line: str, declared: list[Any], command: str) -> dict[str, str]:
    """The arguments `prompts/get` gets from a command line; CommandError (with the usage)
    when a required one is missing or there is one too many."""
    names = [a.name for a in declared]
    usage = " ".join([f"/{command}", *(f"{a.name}=…" if a.required else f"[{a.name}=…]" for a in declared)])
    values: dict[str, str] = {}
    positional: list[str] = []
    for word in split_arguments(line):
        key, eq, value = word.partition("=")
        if eq and key in names:
            if key in values:
                raise CommandError(f"argument {key!r} is given twice; usage: {usage}")
            values[key] = value
        else:
            positional.append(word)
    free = [n for n in names if n not in values]
    if len(positional) > len(free):
        extra = " ".join(positional[len(free) :])
        raise CommandError(f"too many arguments ({extra!r}); usage: {usage}")
    values.update(zip(free, positional, strict=False))
    missing = [a.name for a in declared if a.required and a.name not in values]
    if missing:
        which = ", ".join(repr(m) for m in missing)
        raise CommandError(f"missing required argument {which}; usage: {usage}")
    return values


async def _expand(
    hub: ToolHub, server: str, prompt: str, command: str, declared: list[Any], line: str
) -> Message:
    values = prompt_arguments(line, declared, command)
    result = await hub.get_prompt(server, prompt, values)
    return as_message(result)


def as_message(result: Any) -> Message:
    """A `prompts/get` result as one user message (see the module doc)."""
    parts: list[str] = []
    attached: list[Image] = []
    for message in result.messages or ():
        text = _content_text(message.content, attached)
        if text:
            parts.append(f"Assistant: {text}" if message.role == "assistant" else text)
    if not parts and not attached:
        raise CommandError("the MCP server returned an empty prompt")
    return Message("user", "\n\n".join(parts), images=tuple(attached))


def _content_text(block: Any, attached: list[Image]) -> str:
    kind = getattr(block, "type", "")
    if kind == "text":
        return str(block.text)
    if kind == "image":
        if len(attached) == images.MAX_PER_PROMPT:
            return f"[image left out: over {images.MAX_PER_PROMPT} in one prompt]"
        try:
            attached.append(images.checked(block.mime_type, block.data))
        except ValueError as exc:
            return images.DROPPED.format(problem=exc)
        return ""
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        if text is not None:
            return f'<context ref="{resource.uri}">\n{text}\n</context>'
        return f"[attached binary resource {resource.uri}]"
    if kind == "resource_link":
        return f"[@{block.name}]({block.uri})"
    if kind == "audio":
        return "[audio attachment: not supported]"
    return f"[{kind or 'unknown'} content: not supported]"
