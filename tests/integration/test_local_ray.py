"""The local Ray instance that ``connect(None)`` starts, in a driver process of its own (the
session's shared instance lives in the pytest process): it takes only its own token, keeps its
files in a private temp dir, writes nothing to ``~/.ray``, and its ``close`` - or a SIGTERM
while it starts - ends what it started and nothing else."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from autotune.launch.reaper import OWNER_ENV, Reaper, read_proc
from tests.conftest import REPO, wait_for, with_env
from tests.integration.test_run_cli import group_of

pytestmark = [pytest.mark.integration, pytest.mark.waits]

#: The driver: argv[1] a file its instance's actor holds open ("" for none), argv[2] the
#: program of a child of its own it starts first (a user's, not marked), argv[3] "nobody" for
#: a child run as nobody that carries the run's mark. It prints what it started, closes on a
#: line of input, prints its environment then, and exits on a second line.
DRIVER = """\
import json, os, signal, subprocess, sys
from autotune.core.errors import raise_terminated
from autotune.launch.cluster import OWNER_ENV, connect

HOLD = "import sys, time; f = open(sys.argv[1], 'rb'); time.sleep(600)"
hold, decoy, nobody = (sys.argv[1:] + ["", "", ""])[:3]
signal.signal(signal.SIGTERM, raise_terminated)  # as `autotune run` does
shown = {}
if decoy:
    shown["decoy"] = subprocess.Popen([decoy, "-c", HOLD, hold], stdout=subprocess.DEVNULL).pid
conn = None
try:
    print("connecting", flush=True)
    conn = connect(None)
    signal.signal(signal.SIGTERM, raise_terminated)
    import ray
    if hold:
        @ray.remote
        class Reader:
            def __init__(self, path):
                self.f = open(path, "rb")
            def pid(self):
                return os.getpid()
        shown["actor"] = ray.get((keep := Reader.remote(hold)).pid.remote())
    if nobody:
        shown["nobody"] = subprocess.Popen(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "sleep", "600"],
            env={**os.environ, OWNER_ENV: conn.owner}, stdout=subprocess.DEVNULL).pid
    print(json.dumps({"owner": conn.owner, "session_dir": conn.session_dir,
                      "address": ray.get_runtime_context().gcs_address, **shown,
                      **{k: os.environ.get(k) for k in ("RAY_TMPDIR", "RAY_AUTH_TOKEN")}}),
          flush=True)
    sys.stdin.readline()
except KeyboardInterrupt:  # SIGTERM (Terminated), as `autotune run` ends on it
    signal.alarm(0)  # Ray's failure signal handler may have armed one as it saw the SIGTERM
    if conn is not None:
        conn.close()
    print("terminated, closed", flush=True)
    os._exit(143)
conn.close()
names = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_TMPDIR", OWNER_ENV)
print(json.dumps({k: os.environ.get(k) for k in names}), flush=True)
sys.stdin.readline()
"""

#: A second driver joining the instance at argv[1]: it runs a task there and prints its result.
CLIENT = """\
import sys
import ray
from autotune.core.compat import loopback_node_ip
with loopback_node_ip():
    ray.init(address=sys.argv[1], logging_level="ERROR")
print(ray.get(ray.remote(lambda: "ran there").remote()))
"""


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", OWNER_ENV))}
    home.mkdir(exist_ok=True)
    return {**env, "HOME": str(home), "PYTHONPATH": str(REPO), **extra}


def start_driver(env: dict[str, str], *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, *args],
        env=env,
        cwd=REPO,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        **kw,
    )


def started(driver: subprocess.Popen) -> dict:
    """What the driver printed once its instance is up."""
    assert driver.stdout.readline() == "connecting\n"
    line = driver.stdout.readline()
    assert line.startswith("{"), line + driver.communicate(timeout=60)[0]
    return json.loads(line)


def marked_with(value_prefix: str) -> set[int]:
    """The live processes whose environment carries ``OWNER_ENV`` with a value starting so."""
    return with_env(OWNER_ENV, value_prefix)


def end(pid: int) -> None:
    """End a process this test started (through the driver), if it still runs."""
    p = read_proc(pid)
    if p is not None and not p.zombie:
        Reaper("-").send(pid, p.start, signal.SIGKILL)


def test_a_local_instance_takes_only_its_own_token_and_keeps_its_files_private(tmp_path):
    """H-R08: a local instance refuses a second driver of any local user that has no token or
    a wrong one, and runs the work of one with its token; its files are in a temp dir of its
    own (mode 0700, the user's), not the shared /tmp/ray; nothing is written to ~/.ray; after
    close the dir is gone and the environment is as before, also a RAY_AUTH_MODE=disabled
    the user had set (the local instance uses its token all the same)."""
    home = tmp_path / "home"
    driver = start_driver(clean_env(home, RAY_AUTH_MODE="disabled"))
    try:
        up = started(driver)
        temp = Path(up["RAY_TMPDIR"])
        assert temp.stat().st_mode & 0o777 == 0o700 and temp.stat().st_uid == os.getuid()
        assert up["session_dir"].startswith(f"{temp}/ray/session_")
        assert len(up["RAY_AUTH_TOKEN"]) == 64

        def client(**auth: str) -> subprocess.Popen:
            return subprocess.Popen(
                [sys.executable, "-c", CLIENT, up["address"]],
                cwd=REPO,
                text=True,
                env=clean_env(tmp_path / "client-home", **auth),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )

        wrong = client(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 64)
        none = client()
        for refused in (wrong, none):
            out, err = refused.communicate(timeout=180)
            assert refused.returncode != 0 and "ran there" not in out, out + err
            assert "token" in err.lower(), err
        right = client(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=up["RAY_AUTH_TOKEN"])
        out, err = right.communicate(timeout=180)
        assert right.returncode == 0 and out.strip() == "ran there", out + err

        driver.stdin.write("\n")
        driver.stdin.flush()
        after = json.loads(driver.stdout.readline())
        assert after == {
            "RAY_AUTH_MODE": "disabled",
            "RAY_AUTH_TOKEN": None,
            "RAY_TMPDIR": None,
            OWNER_ENV: None,
        }
        assert not temp.exists()
        assert list(home.iterdir()) == [], "nothing written in the user's home (~/.ray)"
    finally:
        driver.kill()
        driver.communicate()


def test_close_ends_the_instances_processes_and_no_one_elses(tmp_path):
    """H-R09: while a run's instance reads the user's dataset (in a directory named like a Ray
    session), the user's own python from a conda env named ``ray`` holds the same file, once
    as the driver's child and once on its own; run as root, a child of the driver runs as
    ``nobody`` with the run's mark. After close no process of the instance is left, and all
    of those still run."""
    data = tmp_path / "data" / "session_2026-11-25_06-45-09_749085_100"
    data.mkdir(parents=True)
    dataset = data / "train.bin"
    dataset.write_bytes(b"\0" * 16)
    python = tmp_path / "envs" / "ray" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    root = os.geteuid() == 0 and os.path.exists("/usr/bin/setpriv")
    hold = "import sys, time; f = open(sys.argv[1], 'rb'); time.sleep(600)"
    apart = subprocess.Popen([str(python), "-c", hold, str(dataset)])
    args = [str(dataset), str(python), "nobody" if root else ""]
    driver = start_driver(clean_env(tmp_path / "home"), *args)
    up: dict = {}
    try:
        up = started(driver)
        instance = marked_with(up["owner"]) - {up.get("nobody")}
        assert up["actor"] in instance and len(instance) >= 4  # GCS, raylet, agents, workers
        driver.stdin.write("\n")
        driver.stdin.flush()
        assert json.loads(driver.stdout.readline())[OWNER_ENV] is None  # closed
        assert marked_with(up["owner"]) == ({up["nobody"]} if root else set())
        assert not [pid for pid in instance if (p := read_proc(pid)) and not p.zombie]
        users = [apart.pid, up["decoy"], *([up["nobody"]] if root else [])]
        assert all((p := read_proc(pid)) and not p.zombie for pid in users), users
    finally:
        driver.kill()
        driver.communicate()
        apart.kill()
        apart.wait()
        for key in ("decoy", "nobody"):
            if key in up:
                end(up[key])


def left_in(tmp: Path) -> list[str]:
    """What is left below ``tmp``: each path, with how many seconds before now it last changed
    (whether it was written after the driver removed its temp dir)."""
    now, out = time.time(), []
    for p in tmp.rglob("*"):
        with contextlib.suppress(OSError):  # removed meanwhile
            out.append(f"{p.relative_to(tmp)} ({now - p.lstat().st_mtime:.1f} s)")
    return out


@pytest.mark.parametrize("after_s", [1.0, 2.0, 3.0, 4.0])
def test_sigterm_while_the_local_instance_starts_leaves_nothing(tmp_path, after_s):
    """H-R10: SIGTERM 1 to 4 s into ``connect`` (the raylet starting its agents, Ray's own
    SIGTERM handler in place) stops the driver with 143 and leaves no process of the instance
    and no temp dir."""
    # a short TMPDIR of the test's own, so that the instance's temp dir is found under it
    tmp = Path(tempfile.mkdtemp(prefix="at", dir="/tmp"))
    try:
        driver = start_driver(clean_env(tmp_path / "home", TMPDIR=str(tmp)), start_new_session=True)
        try:
            assert driver.stdout.readline() == "connecting\n"
            time.sleep(after_s)
            driver.send_signal(signal.SIGTERM)
            out = driver.communicate(timeout=120)[0]
        finally:
            driver.kill()
        assert group_of(driver.pid) == [], out
        assert not marked_with(f"{driver.pid}-"), out
        assert wait_for(lambda: list(tmp.iterdir()) == [], 5), left_in(tmp)
        # Ray's SIGTERM handler raises SystemExit, which Python drops when the signal lands in
        # an at-fork callback of Ray's own process starts ("Exception ignored in ..."): then
        # the start goes on, and the driver ends as it does without the signal.
        stopped = driver.returncode == 143 and out.endswith("terminated, closed\n")
        dropped = driver.returncode == 0 and f'"{OWNER_ENV}": null' in out
        assert stopped or dropped, out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
