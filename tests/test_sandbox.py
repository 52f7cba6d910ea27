"""The bubblewrap sandbox `execute` runs in (mcp_servers/filesystem/sandbox.py), with real bwrap.

Each escape is tried as a hostile model would, and checked from outside the sandbox."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from crow.config import EnvironmentPolicy
from crow.environment import child_environment, compute_environment
from mcp_servers.filesystem.backend import LocalBackend
from mcp_servers.filesystem.execute import ExecResult
from mcp_servers.filesystem.sandbox import Sandbox, find_bwrap

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(sys.platform != "linux", reason="bubblewrap is Linux-only"),
]


@pytest.fixture
def outside() -> Iterator[Path]:
    """A host folder outside /tmp (which the sandbox replaces) and outside the workspace."""
    path = Path(tempfile.mkdtemp(prefix="crow-sandbox-test-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def home(outside: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake $HOME with credentials in it (outside /tmp, as a real one is)."""
    h = outside / "home"
    (h / ".ssh").mkdir(parents=True)
    (h / ".ssh" / "id_rsa").write_text("PRIVATE-KEY-MATERIAL\n")
    (h / ".config" / "gh").mkdir(parents=True)
    (h / ".config" / "gh" / "hosts.yml").write_text("oauth_token: GH-TOKEN\n")
    (h / ".netrc").write_text("machine x login u password NETRC-PASSWORD\n")
    (h / "notes.txt").write_text("ordinary\n")
    monkeypatch.setenv("HOME", str(h))
    return h


def backend(root: Path, *, hidden: tuple[Path, ...] = (), network: bool = True) -> LocalBackend:
    assert find_bwrap() is not None, "these tests need bubblewrap installed (apt-get install bubblewrap)"
    env = compute_environment(EnvironmentPolicy(), os.environ)  # $HOME as the test set it
    return LocalBackend(root, Sandbox.create([root], hidden=hidden, network=network), env)


async def run(b: LocalBackend, command: str) -> ExecResult:
    return await b.run(command, b.root, 20)


async def test_the_workspace_is_writable_and_nothing_else_is(workspace: Path, outside: Path) -> None:
    b = backend(workspace)
    result = await run(b, f"echo inside > made.txt && echo x > {outside}/escaped; touch /usr/escaped")
    assert (workspace / "made.txt").read_text() == "inside\n"
    assert not (outside / "escaped").exists() and not Path("/usr/escaped").exists()
    assert result.output.count("Read-only file system") == 2, result.output
    # control: the same write without the sandbox lands, so the test can fail
    plain = LocalBackend(workspace)
    await plain.run(f"echo x > {outside}/escaped", workspace, 20)
    assert (outside / "escaped").exists()


async def test_proc_ppid_root_does_not_lead_out(workspace: Path, outside: Path) -> None:
    b = backend(workspace)
    result = await run(
        b,
        f"for p in $PPID 1; do echo x > /proc/$p/root{outside}/pwn-$p; done; "
        "ls /proc | grep -c '^[0-9]'; mount -o remount,rw / && echo REMOUNTED",
    )
    assert list(outside.iterdir()) == [], result.output
    assert "REMOUNTED" not in result.output
    # only the sandbox's own few processes are visible
    count = int([line for line in result.output.splitlines() if line.isdigit()][-1])
    assert count < 10, result.output


async def test_credentials_and_crow_home_are_hidden(workspace: Path, home: Path, outside: Path) -> None:
    crow_home = outside / "crow-home"
    crow_home.mkdir()
    (crow_home / "crow.db").write_text("SESSION-STORE\n")
    b = backend(workspace, hidden=(crow_home,))
    result = await run(
        b,
        f"cat ~/.ssh/id_rsa ~/.config/gh/hosts.yml ~/.netrc {crow_home}/crow.db; "
        f"echo listing; ls -A ~/.ssh {crow_home}; cat ~/notes.txt; echo x > ~/.ssh/planted",
    )
    for secret in ("PRIVATE-KEY-MATERIAL", "GH-TOKEN", "NETRC-PASSWORD", "SESSION-STORE"):
        assert secret not in result.output, result.output
    listing = result.output.split("listing", 1)[1]
    assert "id_rsa" not in listing and "crow.db" not in listing, listing
    assert "ordinary" in result.output  # the rest of $HOME stays readable
    assert sorted(p.name for p in (home / ".ssh").iterdir()) == ["id_rsa"]  # the tmpfs took the write


async def test_a_root_inside_a_hidden_folder_stays_writable_and_a_hidden_folder_inside_a_root_hidden(
    home: Path,
) -> None:
    inner = home / ".config" / "gh" / "repo"  # a workspace below a hidden folder
    inner.mkdir()
    result = await run(backend(inner), "echo ok > f && cat ../hosts.yml")
    assert (inner / "f").read_text() == "ok\n" and "GH-TOKEN" not in result.output
    # crow started in $HOME itself: the workspace is writable, ~/.ssh inside it still hidden
    result = await run(backend(home), "echo ok > top.txt; cat .ssh/id_rsa")
    assert (home / "top.txt").read_text() == "ok\n"
    assert "PRIVATE-KEY-MATERIAL" not in result.output


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "30"])
    yield proc
    proc.kill()
    proc.wait()


async def test_processes_outside_cannot_be_signalled(
    workspace: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    result = await run(backend(workspace), f"kill -9 {sleeper.pid}; echo rc=$?")
    assert "rc=1" in result.output, result.output
    assert sleeper.poll() is None, "the sleeper outside the sandbox was killed"
    # control: unsandboxed, the same command kills it
    await LocalBackend(workspace).run(f"kill -9 {sleeper.pid}", workspace, 20)
    code = await anyio.to_thread.run_sync(sleeper.wait, 5)
    assert code == -signal.SIGKILL


@pytest.fixture
def listener() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP server on the host's 127.0.0.1 recording what it receives."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    got: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                got.append(conn.recv(100))

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1], got
    srv.close()


async def test_network_false_blocks_the_host_loopback(
    workspace: Path, listener: tuple[int, list[bytes]]
) -> None:
    port, got = listener
    command = f"echo hello > /dev/tcp/127.0.0.1/{port} && echo SENT"
    blocked = await run(backend(workspace, network=False), command)
    assert "SENT" not in blocked.output and got == []
    allowed = await run(backend(workspace, network=True), command)  # the default: network on
    assert "SENT" in allowed.output, allowed.output


@pytest.fixture
def run_socket() -> Iterator[Path]:
    """A listening Unix socket under /run, where system daemons keep theirs (D-Bus, the
    resolver, nscd, container engines): each a way out that needs no network."""
    path = Path("/run") / f"crow-test-{os.getpid()}.sock"
    srv = socket.socket(socket.AF_UNIX)
    try:
        srv.bind(str(path))
    except OSError as exc:
        srv.close()
        pytest.skip(f"cannot make a socket in /run here: {exc}")
    srv.listen(1)
    yield path
    srv.close()
    path.unlink(missing_ok=True)


async def test_network_false_hides_the_system_daemons_sockets(workspace: Path, run_socket: Path) -> None:
    # The base interpreter, not the venv's: a checkout (and its venv) under /tmp is hidden
    # by the sandbox's private /tmp.
    python = os.path.realpath(sys.executable)
    command = (
        f'{python} -c "import socket; s = socket.socket(socket.AF_UNIX); '
        f"s.connect('{run_socket}'); print('CONNECTED')\""
    )
    blocked = await run(backend(workspace, network=False), command)
    assert "CONNECTED" not in blocked.output, blocked.output
    allowed = await run(backend(workspace, network=True), command)  # control: reachable with the network on
    assert "CONNECTED" in allowed.output, allowed.output


async def test_network_false_keeps_the_symlinks_in_run(workspace: Path, tmp_path: Path) -> None:
    # NixOS reaches every program through /run/current-system: an empty /run must keep it.
    target = tmp_path / "system"
    (target / "bin").mkdir(parents=True)
    (target / "bin" / "hello").write_text("from the system\n")
    link = Path("/run") / f"crow-test-system-{os.getpid()}"
    try:
        link.symlink_to(target)
    except OSError as exc:
        pytest.skip(f"cannot make a symlink in /run here: {exc}")
    try:
        sandbox = Sandbox.create([workspace, tmp_path], network=False)  # tmp_path: /tmp is private
        b = LocalBackend(workspace, sandbox, compute_environment(EnvironmentPolicy(), os.environ))
        result = await run(b, f"cat {link}/bin/hello")
    finally:
        link.unlink()
    assert "from the system" in result.output, result.output


async def test_tmp_is_private(workspace: Path, tmp_path: Path) -> None:
    marker = Path(tempfile.mkdtemp()) / "host-secret"
    marker.write_text("HOST-TMP\n")
    try:
        result = await run(backend(workspace), f"cat {marker}; echo mine > /tmp/sandbox-file; ls /tmp")
        assert "HOST-TMP" not in result.output
        assert not Path("/tmp/sandbox-file").exists()
    finally:
        shutil.rmtree(marker.parent)


async def test_background_jobs_die_with_the_command(workspace: Path) -> None:
    marker = f"{os.getpid()}{id(workspace)}"
    result = await run(backend(workspace), f"sleep {marker} & echo started")
    assert "started" in result.output
    ps = await anyio.run_process(["pgrep", "-f", f"sleep {marker}"], check=False)
    assert ps.stdout.strip() == b""


async def test_a_cancel_right_after_the_start_leaves_no_process(workspace: Path) -> None:
    """Cancelled as soon as bwrap is spawned, many times: nothing the sandbox starts may
    survive (with bwrap's --new-session the sandboxed init left the command's process group,
    and a kill landing before its parent-death signal was set orphaned it)."""
    b = backend(workspace)
    marker = f"{os.getpid()}{id(b)}"
    for i in range(40):
        with anyio.CancelScope() as scope:
            scope.cancel()  # lands at the first wait after the (shielded) spawn
            await b.run(f"sleep 1{marker}{i} & sleep 1{marker}{i}", workspace, 20)
        await anyio.sleep(i % 4 * 0.001)  # vary the moment a little
    await anyio.sleep(0.3)
    ps = await anyio.run_process(["pgrep", "-f", f"sleep 1{marker}"], check=False)
    assert ps.stdout.strip() == b"", "sandboxed processes outlived a cancel"


NO_TTY_CHECK = """
import anyio, os, sys
from pathlib import Path
from crow.config import EnvironmentPolicy
from crow.environment import compute_environment
from mcp_servers.filesystem.backend import LocalBackend
from mcp_servers.filesystem.sandbox import Sandbox

os.close(os.open("/dev/tty", os.O_RDWR))  # this process has a controlling terminal
print("parent has a terminal", flush=True)
root = Path(sys.argv[1])
env = compute_environment(EnvironmentPolicy(), os.environ)
b = LocalBackend(root, Sandbox.create([root]), env)
result = anyio.run(b.run, "(: </dev/tty) 2>&1 || echo no-terminal", root, 20)
print(result.output, flush=True)
"""


def test_a_sandboxed_command_has_no_controlling_terminal(workspace: Path) -> None:
    """crow has a terminal (crow run); the command it starts must not (no TIOCSTI into it):
    each command starts in a session of its own."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # the child, with the pty as its controlling terminal
        os.execv(sys.executable, [sys.executable, "-c", NO_TTY_CHECK, str(workspace)])
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.waitpid(pid, 0)
    os.close(fd)
    text = out.decode(errors="replace")
    assert "parent has a terminal" in text and "no-terminal" in text, text


async def test_commands_get_the_environment_policy(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_TEST_API_KEY", "sk-leak")
    from crow.config import Config

    b = LocalBackend(workspace, Sandbox.create([workspace]), child_environment(Config()))
    result = await run(b, "env")
    assert "PATH=" in result.output and "sk-leak" not in result.output


async def test_the_standalone_server_applies_the_default_policy_and_its_sandbox(
    workspace: Path, outside: Path, listener: tuple[int, list[bytes]]
) -> None:
    port, got = listener
    from mcp import ClientSession, StdioServerParameters, stdio_client

    env = {**os.environ, "OPENAI_API_KEY": "sk-standalone-SECRET", "SOME_TOKEN": "tok-SECRET"}
    argv = ["-m", "crow", "mcp", "filesystem", "--root", str(workspace), "--sandbox", "bwrap", "--no-network"]
    params = StdioServerParameters(command=sys.executable, args=argv, env=env)
    with open(os.devnull, "w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            command = f"env; echo x > {outside}/escaped; echo hi > /dev/tcp/127.0.0.1/{port} && echo SENT"
            result = await session.call_tool("execute", {"command": command})
    text = result.content[0].text  # type: ignore[union-attr]
    assert "PATH=" in text and "SECRET" not in text, text
    assert not (outside / "escaped").exists()
    assert "SENT" not in text and got == []


async def test_each_session_gets_the_sandbox_and_policy_of_its_own_config(
    tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sessions of one process, two configs: the hook reads `session.config`."""
    from builtin_hooks.filesystem import FilesystemHook
    from crow.config import Config
    from crow.inprocess import DirectClient
    from crow.session import Session

    monkeypatch.setenv("PER_SESSION_VAR", "visible")
    hook = FilesystemHook()
    configs = {
        "boxed": Config(home=tmp_path / "h1", environment=EnvironmentPolicy(exclude=["PER_SESSION_*"])),
        "open": Config(home=tmp_path / "h2", sandbox="off"),
    }
    out: dict[str, str] = {}
    for name, config in configs.items():
        ws = tmp_path / name
        ws.mkdir()
        (spec,) = hook.tool_servers(Session(id=name, cwd=ws, config=config))
        command = f"echo {name} > {outside}/{name}; echo var=$PER_SESSION_VAR"
        result = await DirectClient(spec.server).call_tool("execute", {"command": command})
        out[name] = result.content[0].text
    assert not (outside / "boxed").exists() and (outside / "open").exists()
    assert "var=visible" in out["open"] and "var=visible" not in out["boxed"]


SECRET = "HOST-PROCESS-SECRET-4921"


@pytest.fixture
def capless_sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process with a secret in its environment and no capabilities, as the user's own
    editor runs (a root process that has them is shielded from a capless reader anyway)."""
    argv = ["setpriv", "--bounding-set", "-all", "--inh-caps", "-all", "sleep", "30"]
    proc = subprocess.Popen(argv, env={**os.environ, "CROW_TEST_SECRET": SECRET})
    yield proc
    proc.kill()
    proc.wait()


async def test_a_workspace_at_the_filesystem_root_still_gets_a_private_proc_and_dev(
    capless_sleeper: subprocess.Popen[bytes],
) -> None:
    # An editor with no folder open may start a session in "/": the writable bind of the whole
    # host must not cover the sandbox's own /proc (else every process of the user, the editor
    # with the API keys in its environment, shows in /proc/PID/environ) and /dev.
    b = LocalBackend(Path("/"), Sandbox.create(["/"]), compute_environment(EnvironmentPolicy(), os.environ))
    result = await b.run(
        f"cat /proc/{capless_sleeper.pid}/environ; cat /proc/[0-9]*/environ | tr '\\0' '\\n' | grep -c CROW_TEST; "
        "echo procs=$(ls /proc | grep -c '^[0-9]') devs=$(ls /dev | wc -l)",
        Path("/"),
        20,
    )
    assert SECRET not in result.output, result.output
    counts = dict(w.split("=") for w in result.output.split() if w.startswith(("procs=", "devs=")))
    assert int(counts["procs"]) < 10 and int(counts["devs"]) < 30, result.output
