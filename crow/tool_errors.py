"""What the model reads when a tool call fails: the argument, what was wrong, what to send.

Every failed call's text passes through `for_model()` once, whatever server it came from:
the MCP Python SDK's "Error executing tool NAME: " prefix is dropped (crow already marks
the result an error), and a pydantic validation dump (one block per error with its
documentation URL) becomes one line per argument. `check_arguments()` runs before a call:
a missing required argument, or one the tool's schema does not list, is answered without
calling the server, naming what the tool takes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_SDK_PREFIX = re.compile(r"^Error executing tool [^:\s]+(?:: |$)")
_DUMP_HEAD = re.compile(r"^\d+ validation errors? for \S+\n")
# One error of a pydantic dump: the location line, then "  message [type=..., input_value=...]".
_DUMP_ERROR = re.compile(
    r"^(?P<loc>\S[^\n]*)\n  (?P<msg>[^\n]*?)(?: \[type=(?P<type>[\w.]+)"
    r"(?:, input_value=(?P<value>.*?), input_type=\w+)?\])?$",
    re.MULTILINE,
)
_URL_LINE = re.compile(r"^ +For further information visit \S+$\n?", re.MULTILINE)
_SHOWN = 60  # characters of a rejected value quoted back


def for_model(name: str, text: str, schema: Mapping[str, Any] | None = None) -> str:
    """The error text of a failed call of tool `name`, as the model should read it."""
    text = _SDK_PREFIX.sub("", text.strip(), count=1)
    if not text:
        return f"{name} failed unexpectedly; the details are in the tool server's log"
    head = _DUMP_HEAD.match(text)
    if head is None:
        return text
    lines = [_problem(m) for m in _DUMP_ERROR.finditer(_URL_LINE.sub("", text[head.end() :]))]
    if not lines:
        return text
    return _invalid(name, lines, schema)


def check_arguments(name: str, args: Mapping[str, Any], schema: Mapping[str, Any]) -> str | None:
    """Why `args` cannot be right for the tool's input schema (missing or unknown names),
    or None. Types are left to the server, which may coerce ("5" for an integer)."""
    props = schema.get("properties")
    if not isinstance(props, Mapping):
        return None
    lines = [f"- `{arg}`: missing; it is required" for arg in _required(schema) if arg not in args]
    if not schema.get("additionalProperties"):  # absent or false: a name it does not list
        lines += [f"- `{arg}`: {name} has no such argument; leave it out" for arg in args if arg not in props]
    return _invalid(name, lines, schema) if lines else None


def _invalid(name: str, lines: list[str], schema: Mapping[str, Any] | None) -> str:
    text = f"{name} was not run: its arguments are wrong.\n" + "\n".join(lines)
    if schema is not None and (usage := signature(schema)):
        text += f"\nSend: {usage}"
    return text


def _problem(m: re.Match[str]) -> str:
    where = _location(m["loc"])
    kind, msg, value = m["type"] or "", m["msg"].rstrip("."), m["value"]
    if kind == "missing":
        return f"- `{where}`: missing; it is required"
    if kind == "extra_forbidden":
        return f"- `{where}`: not an accepted field; leave it out"
    shown = "" if value is None else f" (got {value if len(value) <= _SHOWN else value[:_SHOWN] + '…'})"
    return f"- `{where}`: {msg[:1].lower() + msg[1:]}{shown}"


def _location(loc: str) -> str:
    """`todos.0.status` -> `todos[0].status`."""
    out = ""
    for part in loc.split("."):
        out += f"[{part}]" if part.isdigit() else (f".{part}" if out else part)
    return out


def _required(schema: Mapping[str, Any]) -> list[str]:
    required = schema.get("required")
    return [r for r in required if isinstance(r, str)] if isinstance(required, list) else []


def signature(
    schema: Mapping[str, Any],
    root: Mapping[str, Any] | None = None,
    depth: int = 0,
    refs: frozenset[str] = frozenset(),
) -> str:
    """`{"path": string, "offset"?: integer}`: what a tool takes, in one line (objects
    nested two deep are spelled out, deeper ones say `object`)."""
    props = schema.get("properties")
    if not isinstance(props, Mapping) or not props:
        return ""
    root = schema if root is None else root
    required = set(_required(schema))
    parts = [
        f'"{arg}"{"" if arg in required else "?"}: {_type(spec, root, depth, refs)}'
        for arg, spec in props.items()
    ]
    return "{" + ", ".join(parts) + "}"


def _type(spec: Any, root: Mapping[str, Any], depth: int, refs: frozenset[str]) -> str:
    """`refs`: the definitions being spelled out; one met again (a recursive type such as a
    JSON value) reads `any`, else spelling it out never ends."""
    if not isinstance(spec, Mapping):
        return "any"
    ref = spec.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):  # a local definition, e.g. "#/$defs/Todo"
        if ref in refs:
            return "any"
        target: Any = root
        for key in ref[2:].split("/"):
            target = target.get(key) if isinstance(target, Mapping) else None
        return _type(target, root, depth, refs | {ref}) if isinstance(target, Mapping) else "object"
    if isinstance(spec.get("enum"), list):
        return " | ".join(repr(v) if isinstance(v, str) else str(v) for v in spec["enum"])
    options = spec.get("anyOf") or spec.get("oneOf")
    if isinstance(options, list):
        return " | ".join(_type(o, root, depth, refs) for o in options)
    kind = spec.get("type")
    if kind == "array":
        items = spec.get("items")
        return f"{_type(items, root, depth, refs)}[]" if isinstance(items, Mapping) and items else "array"
    if kind == "object" and depth < 2 and (fields := signature(spec, root, depth + 1, refs)):
        return fields
    return kind if isinstance(kind, str) else "object"
