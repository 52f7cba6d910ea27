"""Permission rules: what deciding a tool call costs with a realistic rule list (35 rules)
against the same permissions hook with no rules, both in yolo mode (nothing asks).
Target: rules add < 0.1 ms to a tool call."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from bench.common import Ctx, Figure, median, ms

G = "rules"
RULES = {
    "allow": [
        *(f"execute({p} *)" for p in ("git status", "git diff", "git log", "ls", "cat", "grep", "rg",
                                      "pytest", "npm test", "cargo check")),
        "edit_file(/src/**)", "write_file(/src/**)", "edit_file(/tests/**)", "read_file", "shout",
    ],
    "ask": ["execute(git push *)", "execute(npm publish *)", "write_file(/.github/**)",
            "edit_file(*.lock)", "read_file(/.env)"],
    "deny": [
        *(f"execute({p})" for p in ("rm -rf *", "sudo *", "curl * | sh", "git push --force*",
                                    "dd *", "mkfs*", "chmod -R 777 *", "shutdown*")),
        "write_file(/.git/**)", "edit_file(/.git/**)", "read_file(**/id_rsa*)", "write_file(**/.env)",
        "edit_file(**/.env)", "read_file(/secrets/**)", "whisper",
    ],
}  # fmt: skip
CALLS = [
    ("execute", {"command": "git status -s && ls -la src | grep app"}),
    ("execute", {"command": "echo $(cat VERSION) > out.txt"}),
    ("edit_file", {"path": "./src/pkg/../app.py", "old_text": "a", "new_text": "b"}),
    ("read_file", {"path": "docs/guide.md"}),
    ("shout", {"text": "hi"}),
]


async def run(ctx: Ctx) -> list[Figure]:
    from builtin_hooks.permissions import PermissionsHook
    from crow.config import Config, PermissionRules
    from crow.messages import ToolCall
    from crow.session import Session

    ws = ctx.home("ws")
    hook = PermissionsHook()
    calls = [ToolCall(f"c{i}", name, args) for i, (name, args) in enumerate(CALLS)]

    def context(rules: PermissionRules) -> Any:
        session = Session("bench", ws, mode="yolo", config=Config(permissions=rules))
        return SimpleNamespace(session=session)

    with_rules, without = context(PermissionRules(**RULES)), context(PermissionRules())
    n = ctx.reps(3000, 500)
    a: list[float] = []
    b: list[float] = []
    for i in range(n + 50):
        call = calls[i % len(calls)]
        for c, sink in ((with_rules, a), (without, b)) if i % 2 else ((without, b), (with_rules, a)):
            t0 = time.perf_counter()
            await hook.check(c, call)
            if i >= 50:
                sink.append(time.perf_counter() - t0)
    n_rules = sum(map(len, RULES.values()))
    return [
        Figure(G, f"permissions check, {n_rules} rules (5 kinds of call)", ms(median(a)),
               baseline=ms(median(b)), baseline_name="no rules", target="adds < 0.1 ms",
               check=("diff", "<", 0.1), samples=n),
    ]  # fmt: skip
