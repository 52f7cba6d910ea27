"""The npm packages the interop and conformance tests use, installed once into a cache folder.

Exact versions live in tests/interop/package.json and package-lock.json; they are installed
into ~/.cache/crow-interop/<hash> (CROW_INTEROP_CACHE overrides the folder), never into the
repository. `node_modules()` answers the folder, or a string saying why there is none (no
node/npm, or no registry): callers skip with it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from tests.support.locking import file_lock

INTEROP = Path(__file__).parent.parent / "interop"
LOCK_FILES = ("package.json", "package-lock.json")


def _cache_root() -> Path:
    if override := os.environ.get("CROW_INTEROP_CACHE"):
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "crow-interop"


def node_major(node: str = "node") -> int:
    out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
    try:
        return int(out.strip().lstrip("v").split(".")[0])
    except ValueError:
        return 0


@functools.cache
def node_modules() -> Path | str:
    """The installed packages, installed on first use and reused across runs; or why not."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        return "these tests need node and npm on PATH"
    if (major := node_major(node)) < 20:
        return f"these tests need Node 20 or newer, found {major}"
    digest = hashlib.sha256(b"".join((INTEROP / f).read_bytes() for f in LOCK_FILES)).hexdigest()[:16]
    root = _cache_root()
    target = root / digest
    if (target / ".installed").exists():
        return target / "node_modules"
    root.mkdir(parents=True, exist_ok=True)
    with file_lock(root / f"{digest}.lock"):  # parallel sessions install once
        if (target / ".installed").exists():
            return target / "node_modules"
        staging = root / f"{digest}.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        for f in LOCK_FILES:
            shutil.copy(INTEROP / f, staging / f)
        cmd = [npm, "install", "--no-audit", "--no-fund", "--prefix", str(staging)]
        cmd += ["--fetch-retries=1", "--fetch-retry-mintimeout=1000", "--fetch-retry-maxtimeout=5000"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=staging)
        except subprocess.TimeoutExpired:
            shutil.rmtree(staging, ignore_errors=True)
            return "npm install of the interop clients timed out (is the npm registry reachable?)"
        if proc.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            lines = proc.stderr.strip().splitlines()
            why = next((ln for ln in lines if " code " in ln or "errno" in ln), lines[-1] if lines else "")
            return f"npm install of the interop clients failed (is the npm registry reachable?): {why}"
        (staging / ".installed").write_text(" ".join(cmd))
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return target / "node_modules"
