#!/usr/bin/env python3
"""A crow command hook: ask for compaction when the context is over a threshold.

    hooks:
      commands:
        - command: python3 examples/command_hooks/compact_over_threshold.py 0.7
          phases: [agent_stop]

The threshold is the first argument, else `CROW_COMPACT_AT`, else 0.8. A value up to 1 is
a fraction of the context window; a larger one is a number of tokens. Reads crow's JSON
payload on stdin; prints `{"action": "compact"}` when `usage.context_tokens` is over the
threshold, else `{}`. Standard library only.
"""

from __future__ import annotations

import json
import os
import sys

DEFAULT = 0.8


def threshold(value: str | None, window: int) -> float:
    limit = float(value) if value else DEFAULT
    return limit * window if limit <= 1 else limit


def main() -> None:
    payload = json.load(sys.stdin)
    usage = payload.get("usage") or {}
    tokens = int(usage.get("context_tokens") or 0)
    window = int(usage.get("context_window") or 128_000)
    arg = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("CROW_COMPACT_AT")
    limit = threshold(arg, window)
    if tokens > limit:
        print(f"context {tokens} > {limit:.0f} tokens: asking to compact", file=sys.stderr)
        json.dump({"action": "compact"}, sys.stdout)
    else:
        json.dump({}, sys.stdout)


if __name__ == "__main__":
    main()
