"""A model request's body as bytes: what httpx's `json=` gives (compact, non-ASCII as is, no
NaN), with the tools' JSON encoded once per tool, not at every call.

A session's tools are most of a request (crow's own fourteen: ~9 KB of a 10 KB body in a
ten-turn chat); converting and encoding them on every model call took ~7% of crow's CPU at
50 busy sessions.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from crow.llm.base import ToolSpec

dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


class RawJSON:
    """JSON text a body holds as it is (`encode_body` splices it in)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"RawJSON({self.text[:60]!r})"


def encode_body(body: Mapping[str, Any]) -> bytes:
    if not all(isinstance(k, str) for k in body):  # a hook's extra keys: as json.dumps writes them
        plain = {k: json.loads(v.text) if isinstance(v, RawJSON) else v for k, v in body.items()}
        return dumps(plain).encode()
    items = (f"{dumps(k)}:{v.text if isinstance(v, RawJSON) else dumps(v)}" for k, v in body.items())
    return ("{" + ",".join(items) + "}").encode()


class ToolTexts:
    """Each tool as a provider writes it (`convert`), as JSON text, kept per name, description
    and parameters object: a hook that changes a tool makes a new ToolSpec (it is frozen;
    its parameters are not changed in place), and one that rewrites only the description
    each turn (`task`'s agent list) hits while the text is the same."""

    LIMIT = 4096  # tools kept (each session has its own specs); past it, the cache starts over

    def __init__(self, convert: Callable[[ToolSpec], dict[str, Any]]) -> None:
        self._convert = convert
        self._texts: dict[tuple[str, str, int], tuple[Mapping[str, Any], str]] = {}

    def __call__(self, tools: Sequence[ToolSpec]) -> list[str]:
        texts = []
        for tool in tools:
            key = (tool.name, tool.description, id(tool.parameters))
            hit = self._texts.get(key)
            if hit is None or hit[0] is not tool.parameters:  # the id of one that is gone
                if len(self._texts) >= self.LIMIT:
                    self._texts.clear()
                hit = self._texts[key] = (tool.parameters, dumps(self._convert(tool)))
            texts.append(hit[1])
        return texts
