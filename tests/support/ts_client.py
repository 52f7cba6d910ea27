"""Drive crow with the official TypeScript ACP SDK (tests/interop/acp_script.mjs): a script of
requests in, everything the SDK accepted (results, errors, updates, crow's requests) out.
The SDK validates each message it receives, so a step that passes here passes a client
written elsewhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import npm

SCRIPT = Path(__file__).parent.parent / "interop" / "acp_script.mjs"
CROW_CMD = [sys.executable, "-m", "crow"]


def run_script(
    script: dict[str, Any], env: dict[str, str], cwd: Path, *crow_args: str, timeout: float = 90, url: str = ""
) -> dict[str, Any]:
    """Run `script` against a fresh crow (its environment `env`), or against the crow serving
    WebSocket `url` (the token in env's ACP_WS_TOKEN); skips without node/npm."""
    modules = npm.node_modules()
    if isinstance(modules, str):
        pytest.skip(modules)
    path = cwd.parent / f"acp-script-{abs(hash(json.dumps(script, sort_keys=True)))}.json"
    path.write_text(json.dumps(script))
    env = {**env, "ACP_SDK_NODE_MODULES": str(modules)}
    node = ["node", "--experimental-websocket"] if url and npm.node_major() < 22 else ["node"]
    proc = subprocess.run(
        [*node, str(SCRIPT), str(path), "--", *([url] if url else [*CROW_CMD, *crow_args])],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no summary from the TypeScript client; stderr:\n{proc.stderr[-3000:]}"
    out = json.loads(lines[-1])
    assert out["handlerErrors"] == [], f"{out['handlerErrors']}\nstderr:\n{proc.stderr[-3000:]}"
    return out


def kinds(out: dict[str, Any]) -> list[str]:
    return [u["update"]["sessionUpdate"] for u in out["updates"]]
