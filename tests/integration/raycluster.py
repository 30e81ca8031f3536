"""A real multi-node Ray cluster on this machine, started with ``ray start`` as a user would
(a head and worker nodes at this machine's own address), and torn down with every process it
started."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

RAY = str(Path(sys.executable).parent / "ray")


def check_run_stopped_by_node_loss(p: subprocess.Popen, out: str, home: Path, study: str) -> None:
    """What a run whose worker node was lost mid-study must leave: exit 1 with the reason, the
    trial on that node FAIL ``node_lost`` and the last one, nothing RUNNING, the profile."""
    import optuna
    from optuna.trial import TrialState

    assert p.returncode == 1, out
    assert "stopped early: the Ray cluster lost capacity" in out
    assert "cannot place 2 ranks again within --node-wait 5s" in out
    trials = optuna.load_study(study_name=study, storage=f"sqlite:///{home / 'autotune.db'}").trials
    assert trials[0].state == TrialState.COMPLETE
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    # The node died during a trial or between two (the pooled rank is found dead when the
    # next trial starts): either way that trial is the one that fails, and it is the last.
    states = [(t.number, t.state.name, t.user_attrs.get("reason")) for t in trials]
    hit = next((t for t in trials if t.state not in (TrialState.COMPLETE, TrialState.PRUNED)), None)
    assert hit is not None, (states, out)
    assert hit.state == TrialState.FAIL, [(t.number, t.state) for t in trials]
    assert hit.user_attrs["reason"] == "node_lost", hit.user_attrs
    assert "its node was lost" in hit.user_attrs["reason_detail"]
    assert hit is trials[-1]  # no trial was started on a cluster without room for it
    assert (home / "profiles" / f"{study}.yaml").exists()


def free_port() -> int:
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


@contextlib.contextmanager
def ray_cluster(cpus: list[int]) -> Iterator[dict]:
    """Nodes with ``cpus[i]`` CPUs each (the first is the head). Yields the address, each
    worker node's raylet marker (``--node_manager_port=N``, for killing it) and the env a
    driver needs (token authentication)."""
    temp = tempfile.mkdtemp(prefix="atnl", dir="/tmp")  # short: Ray's socket paths are long
    port = free_port()
    worker_ports = [free_port() for _ in cpus[1:]]
    env = {**os.environ, "RAY_AUTH_MODE": "token"}  # a joining node must present the token
    if not any(k in env for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")):
        # a token of the cluster's own: a test process that started Ray in process carries
        # one in its environment, but a test run alone (or first) has none, and `ray start`
        # refuses token authentication without one
        env["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    address = f"{node_ip()}:{port}"
    try:
        subprocess.run(
            [
                RAY,
                "start",
                "--head",
                "--port",
                str(port),
                "--temp-dir",
                temp,
                "--include-dashboard=false",
                "--num-cpus",
                str(cpus[0]),
                "--disable-usage-stats",
            ],
            check=True,
            capture_output=True,
            timeout=120,
            env=env,
        )
        for n, wp in zip(cpus[1:], worker_ports, strict=True):
            subprocess.run(
                [
                    RAY,
                    "start",
                    "--address",
                    address,
                    "--node-manager-port",
                    str(wp),
                    "--num-cpus",
                    str(n),
                    "--disable-usage-stats",
                ],
                check=True,
                capture_output=True,
                timeout=120,
                env=env,
            )
        yield {
            "address": address,
            "env": env,
            "worker_raylets": [f"--node_manager_port={wp}" for wp in worker_ports],
        }
    finally:
        kill_all(temp)  # every process of this cluster names its session directory
        for wp in worker_ports:
            kill_all(f"--node_manager_port={wp}")
        shutil.rmtree(temp, ignore_errors=True)
