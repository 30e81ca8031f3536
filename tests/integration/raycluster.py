"""A real multi-node Ray cluster on this machine, started with ``ray start`` as a user would
(a head and worker nodes at this machine's own address), and torn down with every process it
started."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

RAY = str(Path(sys.executable).parent / "ray")


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
    address = f"{node_ip()}:{port}"
    try:
        subprocess.run([RAY, "start", "--head", "--port", str(port), "--temp-dir", temp,
                        "--include-dashboard=false", "--num-cpus", str(cpus[0]),
                        "--disable-usage-stats"],
                       check=True, capture_output=True, timeout=120, env=env)  # fmt: skip
        for n, wp in zip(cpus[1:], worker_ports, strict=True):
            subprocess.run([RAY, "start", "--address", address, "--node-manager-port", str(wp),
                            "--num-cpus", str(n), "--disable-usage-stats"],
                           check=True, capture_output=True, timeout=120, env=env)  # fmt: skip
        yield {"address": address, "env": env,
               "worker_raylets": [f"--node_manager_port={wp}" for wp in worker_ports]}  # fmt: skip
    finally:
        kill_all(temp)  # every process of this cluster names its session directory
        for wp in worker_ports:
            kill_all(f"--node_manager_port={wp}")
        shutil.rmtree(temp, ignore_errors=True)
