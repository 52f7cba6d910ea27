"""The container's make-up (spec.py) and whose containers are orphans (owner.py): no engine."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from crow.config import BackendConfig
from mcp_servers.filesystem.container.owner import (
    HOST,
    PID,
    SESSION,
    STARTED,
    orphans,
    owner_alive,
    owner_labels,
)
from mcp_servers.filesystem.container.spec import REAPER, create_body, root_pairs


def test_other_roots_appear_under_mnt_by_name_and_same_names_are_numbered(tmp_path: Path) -> None:
    roots = [tmp_path / "ws", tmp_path / "a" / "lib", tmp_path / "b" / "lib", Path("/")]
    assert [str(inside) for _, inside in root_pairs(roots, "/workspace")] == [
        "/workspace", "/mnt/lib", "/mnt/lib-2", "/mnt/root",
    ]  # fmt: skip


def test_the_body_carries_only_backend_env_the_labels_and_the_limits(tmp_path: Path) -> None:
    config = BackendConfig(
        type="docker", image="img:1", network=False, cpus=1.5, memory="512m", user="1000",
        mounts=["/data:/data:ro"], env={"GREETING": "hello"},
    )  # fmt: skip
    (tmp_path / "ws" / "secret").mkdir(parents=True)
    (tmp_path / "ws" / "key").write_text("k")
    pairs = root_pairs([tmp_path / "ws", tmp_path / "other"], "/workspace")
    hidden = [tmp_path / "ws" / "secret", tmp_path / "ws" / "key", tmp_path / "elsewhere"]
    body = create_body(config, owner_labels("s1"), pairs, mount=True, hidden=hidden)
    assert body["Image"] == "img:1" and body["Cmd"] == ["python3", "-c", REAPER]
    assert body["Env"] == ["GREETING=hello"] and body["User"] == "1000" and body["WorkingDir"] == "/workspace"
    assert body["Labels"][SESSION] == "s1" and body["Labels"][PID] == str(os.getpid())
    host = body["HostConfig"]
    assert host["NetworkMode"] == "none" and host["NanoCpus"] == 1_500_000_000 and host["Memory"] == 512 << 20
    assert host["Binds"] == [
        "/data:/data:ro", f"{tmp_path}/ws:/workspace", f"{tmp_path}/other:/mnt/other", "/dev/null:/workspace/key:ro",
    ]  # fmt: skip
    assert host["Tmpfs"] == {"/workspace/secret": "ro,size=4k"}
    copied = create_body(config, owner_labels("s1"), pairs, mount=False)
    assert copied["HostConfig"]["Binds"] == ["/data:/data:ro"] and "Tmpfs" not in copied["HostConfig"]
    assert (
        "NetworkMode"
        not in create_body(BackendConfig(type="docker", image="i"), {}, pairs, mount=True)["HostConfig"]
    )


def test_the_reaper_reaps_and_stops_at_sigterm() -> None:
    # As PID 1 would: children that end (re-parented to it in a container) are reaped, not
    # left as zombies; SIGTERM ends it.
    code = "import subprocess, sys\nsubprocess.Popen(['sleep', '0.3'])\nexec(sys.argv[1])"
    proc = subprocess.Popen([sys.executable, "-c", code, REAPER])
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    deadline = time.monotonic() + 30
    for started in (True, False):  # the child runs, then is gone: a zombie stays listed until reaped
        while bool(children.read_text().split()) != started:
            assert time.monotonic() < deadline, "the child was never reaped"
            time.sleep(0.01)
    assert proc.poll() is None
    proc.terminate()
    assert proc.wait(timeout=10) == 0


def test_a_container_is_an_orphan_only_when_its_crow_on_this_host_ended() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    here, me = socket.gethostname(), owner_labels("x")
    listed = [
        {"Id": "mine", "Labels": me},
        {"Id": "dead", "Labels": {**me, PID: str(dead.pid), STARTED: "1"}},
        {"Id": "reused", "Labels": {**me, STARTED: "1"}},  # my pid, another start: a reused pid
        {"Id": "elsewhere", "Labels": {**me, PID: str(dead.pid), HOST: "another-" + here}},
        {"Id": "unlabelled", "Labels": {SESSION: "y", HOST: here}},
    ]
    assert orphans(listed) == ["dead", "reused"]
    assert owner_alive(me) and not owner_alive({PID: str(dead.pid), STARTED: ""})
