"""Process start-up settings of the `crow` command (crow/startup.py), checked in a fresh
interpreter: they change process-wide state."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.llm_server import Reply, ScriptedLLM


def run_python(code: str, env: dict[str, str] | None = None) -> None:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 0, out.stderr


def test_gc_is_paused_for_the_imports_then_frozen_and_back_on() -> None:
    run_python(
        """
        import gc, linecache, sys
        from crow.startup import WARM_UP_SWITCH_INTERVAL, YOUNG_GC_THRESHOLD, fast_imports, imports_done
        before = sys.getswitchinterval()
        young, *older = gc.get_threshold()
        fast_imports()
        assert not gc.isenabled()
        assert sys.getswitchinterval() == WARM_UP_SWITCH_INTERVAL < before
        import acp  # reads acp/schema.py into linecache (attribute docstrings)
        assert linecache.cache
        imports_done()
        assert gc.isenabled() and gc.get_freeze_count() > 10_000
        assert gc.get_threshold() == (YOUNG_GC_THRESHOLD, *older) and YOUNG_GC_THRESHOLD > young
        assert not linecache.cache
        assert sys.getswitchinterval() == before
        imports_done()  # idempotent
        assert gc.isenabled()
        """
    )


def test_acp_opens_no_spans_unless_tracing_is_configured() -> None:
    run_python(
        """
        from crow.startup import fast_imports, imports_done
        fast_imports()
        import acp.telemetry
        assert acp.telemetry.TRACER is not None  # the opentelemetry API is installed (mcp's)
        imports_done()
        assert acp.telemetry.TRACER is None
        """
    )
    run_python(
        """
        from opentelemetry import trace
        trace.set_tracer_provider(trace.NoOpTracerProvider())  # what a configured one looks like
        from crow.startup import fast_imports, imports_done
        fast_imports()
        import acp.telemetry
        imports_done()
        assert acp.telemetry.TRACER is not None
        """
    )


def test_gc_left_alone_when_the_caller_had_it_off() -> None:
    run_python(
        """
        import gc
        gc.disable()
        frozen = gc.get_freeze_count()  # not 0 at start on every Python (3.12.1: 375)
        threshold = gc.get_threshold()
        from crow.startup import fast_imports, imports_done
        fast_imports()
        imports_done()
        assert not gc.isenabled() and gc.get_freeze_count() == frozen
        assert gc.get_threshold() == threshold
        """
    )


def test_models_build_at_first_use_and_still_validate() -> None:
    run_python(
        """
        from crow.startup import fast_imports
        fast_imports()
        import pydantic
        from pydantic._internal._mock_val_ser import MockValSer

        class Point(pydantic.BaseModel):
            x: int

        assert isinstance(Point.__pydantic_validator__, MockValSer)  # not built yet
        assert Point(x="3").x == 3
        try:
            Point(x="three")
        except pydantic.ValidationError:
            pass
        else:
            raise AssertionError("validation did not run")
        """
    )


def test_a_failed_warm_up_still_turns_the_gc_back_on(tmp_path) -> None:  # type: ignore[no-untyped-def]
    run_python(
        f"""
        import asyncio, gc
        from crow.startup import fast_imports, imports_done
        fast_imports()
        from crow.agent import Agent
        from crow.config import Config
        from crow.errors import CrowError

        config = Config(home={str(tmp_path)!r})
        config.hooks.extra = ["no_such_module_anywhere:Hook"]

        async def main():
            async with Agent(config) as agent:
                agent.on_ready(imports_done)  # as the `crow` command does
                for _ in range(2):  # the plugin's error, to every waiter
                    try:
                        await agent.ready()
                    except CrowError as exc:
                        assert "no_such_module_anywhere" in str(exc), exc
                    else:
                        raise AssertionError("the broken hook was accepted")
            assert gc.isenabled()

        asyncio.run(main())
        """
    )


def test_a_program_using_agent_gets_no_process_wide_settings(llm: ScriptedLLM, tmp_path: Path) -> None:
    """The knobs are the `crow` command's: an Agent in a program (warm-up, a turn, close)
    leaves the GC, the switch interval, pydantic's defaults and libc alone."""
    llm.push(Reply(text="hello"))
    env = {**os.environ, "OPENAI_BASE_URL": llm.base_url, "OPENAI_API_KEY": "test-key"}
    run_python(
        f"""
        import asyncio, ctypes, gc, sys
        looked_up = []
        lookup = ctypes.CDLL.__getattr__

        def spy(self, name):
            looked_up.append(name)
            return lookup(self, name)

        ctypes.CDLL.__getattr__ = spy  # every libc function crow would call
        import pydantic
        from crow.agent import Agent
        from crow.config import Config
        from crow.messages import human

        before = (gc.isenabled(), gc.get_freeze_count(), sys.getswitchinterval())

        async def ignore(event):
            pass

        async def main():
            async with Agent(Config(model="openai:scripted", home={str(tmp_path / "home")!r})) as agent:
                session = agent.create_session({str(tmp_path)!r})
                result = await agent.run_turn(session, human("hi"), ignore)
            assert result.stop_reason == "end_turn", result

        asyncio.run(main())
        assert (gc.isenabled(), gc.get_freeze_count(), sys.getswitchinterval()) == before
        assert "defer_build" not in pydantic.BaseModel.model_config
        assert not {{"mallopt", "prctl"}} & set(looked_up), looked_up
        """,
        env,
    )
    assert len(llm.requests) == 1


def test_the_crow_command_sets_them_before_serving() -> None:
    run_python(
        """
        import asyncio, ctypes, gc, sys
        looked_up = []
        lookup = ctypes.CDLL.__getattr__

        def spy(self, name):
            looked_up.append(name)
            return lookup(self, name)

        ctypes.CDLL.__getattr__ = spy
        from crow import cli
        from crow.startup import WARM_UP_SWITCH_INTERVAL

        def instead_of_serving(coro):
            coro.close()
            import pydantic

            assert not gc.isenabled() and sys.getswitchinterval() == WARM_UP_SWITCH_INTERVAL
            assert pydantic.BaseModel.model_config["defer_build"] is True
            assert {"mallopt", "prctl"} <= set(looked_up), looked_up
            sys.exit(0)

        asyncio.run = instead_of_serving
        cli.main(["serve"])
        """
    )


@pytest.mark.anyio
async def test_the_acp_path_never_imports_the_terminal_front_end(
    llm: ScriptedLLM, tmp_path: Path
) -> None:
    """rich and prompt_toolkit are crow's dependencies for the terminal only: an editor's
    crow (pipes, ACP) never pays for importing them, through a whole prompt."""
    import acp

    from tests.conftest import crow_env, spawn_crow

    llm.push(Reply(text="hi"))
    err = tmp_path / "importtime.log"
    env = crow_env(llm, tmp_path / "home", PYTHONPROFILEIMPORTTIME="1")
    async with spawn_crow(env, stderr_path=err) as (conn, _proc, _client):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
        await conn.prompt(session_id=sid, prompt=[acp.text_block("hello")])
    imported = {line.rsplit("|", 1)[-1].strip() for line in err.read_text().splitlines() if "|" in line}
    assert "crow.acp.server" in imported  # the log is the import log
    front_end = {m for m in imported if m.split(".")[0] in ("rich", "prompt_toolkit") or m.startswith("crow.tui")}
    assert not front_end
    # nor a web server: mcp's sse_starlette tries uvicorn only to hook its shutdown (the
    # refused attempt is logged as "uvicorn.main"; what uvicorn would bring is not)
    assert not {m for m in imported if m.split(".")[0] in ("click", "multiprocessing")}
    assert "uvicorn.config" not in imported
