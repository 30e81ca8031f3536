"""A Ray worker node lost in the middle of a trial: the trial FAILs with a reason, and a run
with no room left stops with a clear message, its profile exported.

The cluster is two Ray nodes on this machine, at its own address as any local Ray instance:
a head and a worker with one CPU each, so the two ranks of a trial land one per node."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.conftest import started_run

pytestmark = pytest.mark.integration

RAY = str(Path(sys.executable).parent / "ray")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pids_with(text: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if text.encode() in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def kill_all(text: str) -> None:
    for pid in pids_with(text):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def node_ip() -> str:
    """This machine's own address, as every local Ray instance uses it."""
    import ray._private.services as services

    return services.get_node_ip_address()


@pytest.fixture
def two_nodes():
    temp = tempfile.mkdtemp(prefix="atnl", dir="/tmp")  # short: Ray's socket paths are long
    port, worker_port = free_port(), free_port()
    common = ["--num-cpus", "1", "--disable-usage-stats"]
    env = {**os.environ, "RAY_AUTH_MODE": "token"}  # a joining node must present the token
    address = f"{node_ip()}:{port}"
    try:
        subprocess.run([RAY, "start", "--head", "--port", str(port), "--temp-dir", temp,
                        "--include-dashboard=false", *common],
                       check=True, capture_output=True, timeout=120, env=env)  # fmt: skip
        subprocess.run([RAY, "start", "--address", address, "--node-manager-port",
                        str(worker_port), *common],
                       check=True, capture_output=True, timeout=120, env=env)  # fmt: skip
        yield {"address": address, "worker_raylet": f"--node_manager_port={worker_port}",
               "env": env}  # fmt: skip
    finally:
        kill_all(temp)  # every process of this cluster names its session directory
        kill_all(f"--node_manager_port={worker_port}")
        shutil.rmtree(temp, ignore_errors=True)


def test_losing_a_node_fails_the_trial_and_stops_the_run_with_a_clear_message(two_nodes, run_env):
    p = started_run({**run_env, **two_nodes["env"]}, "--study", "quick", "--budget", "5m",
                    "--address", two_nodes["address"])  # fmt: skip
    try:
        time.sleep(1.5)  # the next trial has a rank on the worker node
        raylets = pids_with(two_nodes["worker_raylet"])
        assert raylets, "the worker node's raylet was not found"
        for pid in raylets:
            os.kill(pid, signal.SIGKILL)
        out = p.communicate(timeout=180)[0]
    finally:
        p.kill()
    assert p.returncode == 1, out
    assert "stopped early: the Ray cluster lost capacity" in out
    home = Path(run_env["AUTOTUNE_HOME"])
    trials = optuna.load_study(study_name="quick-mlp-gloo-2r",
                               storage=f"sqlite:///{home / 'autotune.db'}").trials  # fmt: skip
    assert trials[0].state == TrialState.COMPLETE
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    # The node died during a trial or between two (the pooled rank is found dead when the
    # next trial starts): either way that trial is the one that fails, and it is the last.
    hit = next(t for t in trials if t.state not in (TrialState.COMPLETE, TrialState.PRUNED))
    assert hit.state == TrialState.FAIL
    assert hit.user_attrs["reason"] == "node_lost"
    assert "its node was lost" in hit.user_attrs["reason_detail"]
    assert hit is trials[-1]  # no trial was started on a cluster without room for it
    assert (home / "profiles" / "quick-mlp-gloo-2r.yaml").exists()
