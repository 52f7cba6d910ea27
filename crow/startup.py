"""Process start-up settings for the `crow` command (not for scripts importing crow).

acp and mcp together define about a thousand pydantic models and ~100,000 objects that live
as long as the process. Two standard knobs make importing them much cheaper:

- the cyclic garbage collector is paused until the warm-up has imported everything, then
  the survivors are frozen out of future collections (`gc.freeze`): a full collection
  during the imports finds nothing to free and cost ~0.35 s here;
- pydantic builds a model's validator and serializer at its first use instead of at class
  creation (`defer_build`): crow uses a few dozen of those models (−0.2 s, −3 MB);
- while the warm-up thread imports, the protocol thread gets the GIL back within 0.5 ms
  instead of 5 ms, so a `session/new` arriving meanwhile is not held up by the imports.
"""

from __future__ import annotations

import gc
import linecache
import sys

_gc_paused = False
_switch_interval: float | None = None  # the interpreter's own, while ours is in force
WARM_UP_SWITCH_INTERVAL = 0.0005


def fast_imports() -> None:
    global _gc_paused, _switch_interval
    if gc.isenabled():
        gc.disable()
        _gc_paused = True
    if _switch_interval is None:
        _switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(WARM_UP_SWITCH_INTERVAL)
    import pydantic

    pydantic.BaseModel.model_config["defer_build"] = True


def imports_done() -> None:
    """Called once the warm-up has imported what a turn needs (idempotent)."""
    global _gc_paused, _switch_interval
    if _switch_interval is not None:
        sys.setswitchinterval(_switch_interval)
        _switch_interval = None
    if _gc_paused:
        _gc_paused = False
        gc.freeze()
        gc.enable()
        linecache.clearcache()


PR_SET_DUMPABLE = 4


def protect_process() -> bool:
    """Make this process non-dumpable: /proc/<pid>/environ and /proc/<pid>/mem become
    readable only with CAP_SYS_PTRACE, so a command the model runs as the same user (an
    unsandboxed `execute`) cannot read the API keys in crow's environment or memory. Not a
    defence against root. Children are unaffected: exec resets the flag. False when the
    call is unavailable (not Linux)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
