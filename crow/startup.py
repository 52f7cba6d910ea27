"""Process settings of the `crow` command (serve and run), never of a program that imports
crow: each one changes the whole process. `cli.main` calls `configure_process()` before the
heavy imports, and `imports_done()` when the agent's warm-up has ended (`Agent.on_ready`).

acp and mcp together define about a thousand pydantic models and ~100,000 objects that live
as long as the process; the knobs below make importing them cheaper. Each gain was measured
by leaving that one knob out of `crow` (medians of 9-10 interleaved spawns on the shared
2-core machine, 2026-11-25, under load: absolute times about 2.4x the quiet ones).
"""

from __future__ import annotations

import gc
import linecache
import sys
from typing import Any

_gc_paused = False
_switch_interval: float | None = None  # the interpreter's own, while ours is in force
_crow_command = False  # configure_process ran: this process is the `crow` command
WARM_UP_SWITCH_INTERVAL = 0.0005
PR_SET_DUMPABLE = 4
M_MMAP_THRESHOLD = -3
# Objects allocated (net) between young collections; Python's default is 700. See imports_done.
YOUNG_GC_THRESHOLD = 10_000


def configure_process() -> None:
    protect_process()  # security, not speed: see its docstring
    return_large_blocks_to_os()  # memory: without it, +15..59 MB RSS kept after 3 MB frames
    fast_imports()  # time: see its comments


def fast_imports() -> None:
    global _gc_paused, _switch_interval
    # The cyclic GC paused until the warm-up has imported everything, then the survivors
    # frozen out of future collections: a full collection during the imports finds nothing
    # to free. Without it: spawn -> first prompt answered 2503 vs 2401 ms (earlier, quiet:
    # +0.35 s).
    if gc.isenabled():
        gc.disable()
        _gc_paused = True
    # While the warm-up thread imports, the protocol thread gets the GIL back within 0.5 ms
    # instead of 5 ms: a `session/new` sent 150 ms after `initialize`, during the MCP
    # import, answered in 8.6 ms with it, 24.7 ms without.
    if _switch_interval is None:
        _switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(WARM_UP_SWITCH_INTERVAL)
    # Validators and serializers built at a model's first use, not at class creation: crow
    # uses a few dozen of acp's and mcp's models. Without it: peak RSS after the first
    # prompt 82.1 vs 79.3 MB (the 80 MB target), initialize 1258 vs 1148 ms.
    import pydantic

    pydantic.BaseModel.model_config["defer_build"] = True
    # httpx imports its command-line client (click, pygments, rich) whenever they are
    # installed, and rich is, for crow's terminal front end: refused here, `import httpx`
    # takes 68 vs 145 ms and 22 vs 28 MB peak RSS (a bare interpreter, 3 runs each).
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    # mcp's server side imports sse_starlette, which imports uvicorn (and with it click and
    # multiprocessing) only to hook uvicorn's shutdown, and carries on without it. crow runs
    # no uvicorn: refused, peak RSS after the first prompt is ~3 MB lower (80.0 -> 77.x).
    sys.modules.setdefault("uvicorn", None)  # type: ignore[arg-type]
    global _crow_command
    _crow_command = True


def mcp_imported() -> None:
    """Called once the MCP SDK is imported (`crow.tools.import_mcp`). Each `MCPServer`
    configures logging with rich: it imports rich and builds a handler that
    `logging.basicConfig` then drops, since the `crow` command's handler is in place.
    Skipped in the `crow` command: the first in-process server starts in 10.5 vs 32 ms,
    and an editor's crow never loads rich (tests/test_startup.py)."""
    if _crow_command:
        import mcp.server.mcpserver.server as mcp_server

        mcp_server.configure_logging = lambda *args, **kwargs: None


def imports_done() -> None:
    """Called once the warm-up has imported what a turn needs (idempotent)."""
    global _gc_paused, _switch_interval
    if _switch_interval is not None:
        sys.setswitchinterval(_switch_interval)
        _switch_interval = None
    if _crow_command:
        untraced_acp()
    if _gc_paused:
        _gc_paused = False
        gc.freeze()
        # Sessions are built after the freeze: at 50 busy sessions a turn's short-lived
        # objects set off a young collection every ~0.3 ms and a full one (~60 ms, every
        # session's objects) once or twice per 500 turns; GC took 10-15% of crow's CPU.
        # Young collections ~14x rarer: 500 turns over one WebSocket cost ~930 instead of
        # ~1,050 ms of CPU (interleaved runs), no full collection; each collection is still
        # a few ms, and at most ~10,000 more dead objects wait for one.
        gc.set_threshold(YOUNG_GC_THRESHOLD, *gc.get_threshold()[1:])
        gc.enable()
        linecache.clearcache()


def untraced_acp() -> None:
    """The ACP SDK opens an OpenTelemetry span per message it handles whenever the
    opentelemetry API is installed (mcp installs it), a no-op span when no tracer provider
    is configured: ~4% of crow's CPU at 50 busy sessions. Without a configured provider
    (`opentelemetry-instrument` sets one before crow starts), the SDK is told there is no
    tracer; with one, its spans are kept."""
    telemetry = sys.modules.get("acp.telemetry")
    if telemetry is None or getattr(telemetry, "TRACER", None) is None:
        return
    from opentelemetry import trace

    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        telemetry.TRACER = None


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)  # this process's own symbols: no library search


def protect_process() -> bool:
    """Make this process non-dumpable: /proc/<pid>/environ and /proc/<pid>/mem become
    readable only with CAP_SYS_PTRACE, so a command the model runs as the same user (an
    unsandboxed `execute`) cannot read the API keys in crow's environment or memory. Not a
    defence against root. Children are unaffected: exec resets the flag. False when the
    call is unavailable (not Linux)."""
    try:
        return _libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def return_large_blocks_to_os() -> bool:
    """Fix glibc's mmap threshold at 128 KiB. By default it rises to the size of the largest
    block freed so far, after which multi-megabyte buffers (big prompts, tool output, frames)
    come from the heap and stay in RSS after they are freed; the fault drill saw +15..59 MB
    after a storm of 3 MB frames, and 0 MB with the threshold fixed. False when not glibc."""
    try:
        libc = _libc()
        if not hasattr(libc, "gnu_get_libc_version"):  # M_MMAP_THRESHOLD is a glibc setting
            return False
        return bool(libc.mallopt(M_MMAP_THRESHOLD, 128 * 1024))
    except (OSError, AttributeError):
        return False
