"""Conformance: every message crow writes, checked against the official ACP JSON schema.

The schema is the one shipped in the npm package `@agentclientprotocol/sdk` (2.4.0, schema
1.25; installed by `tests.support.npm`): `schema/v1/schema.json`, and for methods that are
only in the unstable surface (`session/fork`) `schema.unstable.json`; likewise a
`session/update` whose update kind only the unstable schema has (`subagent_update`) is
checked against the unstable definitions, every other one against the stable. `WireLog` is a stream
observer for the Python client's connection (`tests.conftest.spawn_crow` adds one to every
crow it spawns); `violations()` names each message that does not validate.

What is checked: crow's requests to the client (params; with an id) and its notifications
(params; without one), each a method the schema lets an agent send; its answers to the
client's requests: each to a pending request, once, with exactly one of result (checked by
the request's method) and error (a JSON-RPC error; id null only for what had no id).
Extension methods (`_…`) are crow's own: only their envelope is checked.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from tests.support import npm

SDK = "@agentclientprotocol/sdk"


@functools.cache
def schemas() -> tuple[dict[str, Any], dict[str, Any]] | str:
    """(stable, unstable) schema documents, or why they are not available."""
    found = npm.node_modules()
    if isinstance(found, str):
        return found
    folder = found / SDK / "schema" / "v1"
    return tuple(json.loads((folder / name).read_text()) for name in ("schema.json", "schema.unstable.json"))  # type: ignore[return-value]


@functools.cache
def _validator(definition: str, unstable: bool = False) -> Draft202012Validator | None:
    docs = schemas()
    assert not isinstance(docs, str)
    for doc in docs[1:] if unstable else docs:
        if definition in doc["$defs"]:
            return Draft202012Validator({"$ref": f"#/$defs/{definition}", "$defs": doc["$defs"]})
    return None


@functools.cache
def _by_method() -> dict[tuple[str, str], tuple[str, str]]:
    """(kind, method) -> (definition name, x-side), from the x-method marks; kind is
    "request", "notification" or "response", from the definition's name."""
    docs = schemas()
    assert not isinstance(docs, str)
    found: dict[tuple[str, str], tuple[str, str]] = {}
    for doc in reversed(docs):  # the stable schema wins where both define a method
        for name, d in doc["$defs"].items():
            method, side = d.get("x-method"), d.get("x-side")
            if not method:
                continue
            kind = next(k for k in ("request", "response", "notification") if name.endswith(k.title()))
            found[(kind, method)] = (name, side)
    return found


# Who handles a message crow may send: the client, or either end ($/cancel_request).
SENDABLE = ("client", "protocol")


@functools.cache
def _stable_update_kinds() -> frozenset[str]:
    docs = schemas()
    assert not isinstance(docs, str)
    variants = docs[0]["$defs"]["SessionUpdate"]["oneOf"]
    return frozenset(v["properties"]["sessionUpdate"]["const"] for v in variants)


def _unstable_only(method: str, params: Any) -> bool:
    """A `session/update` of a kind only the unstable schema defines."""
    if method != "session/update" or not isinstance(params, dict):
        return False
    update = params.get("update")
    kind = update.get("sessionUpdate") if isinstance(update, dict) else None
    return isinstance(kind, str) and kind not in _stable_update_kinds()


def check(definition: str, value: Any, *, unstable: bool = False) -> list[str]:
    """Why `value` is not a valid `definition` (empty when it is); `unstable`: by the
    unstable schema's definitions."""
    validator = _validator(definition, unstable)
    if validator is None:
        return [f"no definition {definition!r} in the schema"]
    return [f"{definition}: {e.message} at {list(e.absolute_path)}" for e in validator.iter_errors(value)]


class WireLog:
    """Every message on one connection, as (direction, message); direction is "in" for what
    crow wrote, "out" for what the client wrote. An `acp` stream observer."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: Any) -> None:
        direction = "in" if event.direction.value == "incoming" else "out"
        self.messages.append((direction, event.message))

    def violations(self) -> list[str]:
        return violations(self.messages)


def violations(messages: Iterable[tuple[str, dict[str, Any]]]) -> list[str]:
    """Each message crow wrote that the schema refuses, with the reason."""
    asked: dict[Any, str] = {}  # the client's request ids -> method
    found: list[str] = []
    for direction, msg in messages:
        if not isinstance(msg, dict):  # the client's reader passes on any JSON value
            found.append(f"not a JSON-RPC object: {json.dumps(msg)[:600]}")
            continue
        method, has_id = msg.get("method"), "id" in msg
        if direction == "out":
            if method is not None and has_id:
                asked[msg["id"]] = method
            continue
        problems: list[str] = []
        if msg.get("jsonrpc") != "2.0":
            problems.append("jsonrpc is not '2.0'")
        if method is not None:
            if method.startswith("_"):
                pass  # crow's own extension
            else:  # a request needs an id and a notification must have none
                kind = "request" if has_id else "notification"
                definition, side = _by_method().get((kind, method), (None, None))
                if definition is None or side not in SENDABLE:
                    problems.append(f"crow sent {method!r} as a {kind}: not an agent's to send")
                else:
                    params = msg.get("params")
                    problems += check(definition, params, unstable=_unstable_only(method, params))
        elif has_id or "result" in msg or "error" in msg:
            if ("result" in msg) == ("error" in msg):
                problems.append("an answer carries exactly one of result and error")
            # Each request is answered once; null answers what had no usable id (parse error).
            rid = msg.get("id")
            answered = asked.pop(rid, None) if isinstance(rid, str | int) else None
            if answered is None and (rid is not None or "result" in msg):
                problems.append("an answer to no pending request (an unknown id, or answered already)")
            if "error" in msg:
                problems += check("Error", msg["error"])
            elif answered is not None and not answered.startswith("_"):
                definition, _ = _by_method().get(("response", answered), (None, None))
                if definition is None:
                    problems.append(f"no response definition for {answered!r}")
                else:
                    problems += check(definition, msg.get("result"))
        else:
            problems.append("neither a request, a notification nor an answer")
        if problems:
            shown = json.dumps(msg)[:600]
            found.extend(f"{p}\n    in {shown}" for p in problems)
    return found


def schema_file() -> Path | None:
    found = npm.node_modules()
    return None if isinstance(found, str) else found / SDK / "schema" / "v1" / "schema.json"
