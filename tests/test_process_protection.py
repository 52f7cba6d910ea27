"""crow's own process is non-dumpable, so a command the model runs as the same user
cannot read crow's environment (the API keys) through /proc/<crow's pid>/environ."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import crow.startup

NOBODY = 65534
VICTIM = """
import sys
sys.path.insert(0, {folder!r})
import startup
if {protect}:
    assert startup.protect_process()
print("ready", flush=True)
sys.stdin.read()
"""


def _environ_as_nobody(folder: Path, protect: bool) -> subprocess.CompletedProcess[str]:
    """Start a process as `nobody` holding a secret, then read its environ as `nobody`."""
    as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    code = VICTIM.format(folder=str(folder), protect=protect)
    victim = subprocess.Popen(
        [*as_nobody, sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={"PATH": os.environ["PATH"], "SECRET_API_KEY": "sk-very-secret"},
    )
    try:
        assert victim.stdout is not None and victim.stdout.readline().strip() == "ready"
        return subprocess.run(
            [*as_nobody, "cat", f"/proc/{victim.pid}/environ"], capture_output=True, text=True, timeout=10
        )
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_a_same_user_process_cannot_read_the_protected_environment() -> None:
    # Not under pytest's tmp_path: its parents are 0700, and `nobody` must import from here.
    folder = Path(tempfile.mkdtemp(prefix="crow-protect-"))
    try:
        shutil.copy(crow.startup.__file__, folder / "startup.py")
        folder.chmod(0o755)
        (folder / "startup.py").chmod(0o644)
        _check(folder)
    finally:
        shutil.rmtree(folder)


def _check(folder: Path) -> None:
    control = _environ_as_nobody(folder, protect=False)
    assert "sk-very-secret" in control.stdout  # the leak this guards against
    protected = _environ_as_nobody(folder, protect=True)
    assert "sk-very-secret" not in protected.stdout
    assert "Permission denied" in protected.stderr


@pytest.mark.parametrize("command", ["serve", "run"])
def test_the_crow_command_protects_itself_before_serving(command: str) -> None:
    code = f"""
    import asyncio, ctypes, sys
    from crow import cli

    def instead_of_serving(coro):
        coro.close()
        print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))  # PR_GET_DUMPABLE
        sys.exit(0)

    asyncio.run = instead_of_serving
    cli.main({[command] if command == "serve" else [command, "hi"]!r})
    """
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"
