"""Every listening socket of a real local run is on loopback: the installed ``autotune``
command started in a fresh directory (its own local Ray instance, no ``--address``), and,
while trials run, the listening TCP sockets of its whole process tree (Ray's GCS, raylet and
agents, the driver, the rank processes' TCPStore and gloo) read from ``/proc``."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

AUTOTUNE = Path(sys.executable).with_name("autotune")
#: The run's trials (the baseline included): it ends on its own after them, its sockets read
#: from the baseline's result to its end (a Ctrl-C instead would wait for the trial it cuts).
TRIALS = 5
#: How long to keep reading the sockets at most, before Ctrl-C ends the run.
WATCH_S = 120.0


def _address(hex_address: str) -> tuple[str, int]:
    """``/proc/net/tcp{,6}``'s ``0100007F:1F90`` as ``("127.0.0.1", 8080)``."""
    ip, port = hex_address.split(":")
    raw = bytes.fromhex(ip)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1]), int(port, 16)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))  # four host-order words
    return socket.inet_ntop(socket.AF_INET6, words), int(port, 16)


def _listening_inodes() -> dict[str, tuple[str, int]]:
    """Socket inode -> (address, port) of every TCP socket in state LISTEN (``0A``)."""
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":
                    out[fields[9]] = _address(fields[1])
    return out


def _tree(root: int) -> list[int]:
    """``root`` and all its descendants, now."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:80]
    except OSError:
        return "?"


def listeners(root: int) -> set[tuple[str, str, int]]:
    """(process, address, port) of every listening TCP socket of ``root``'s process tree."""
    table = _listening_inodes()
    found = set()
    for pid in _tree(root):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            inode = link[len("socket:[") : -1] if link.startswith("socket:[") else None
            if inode in table:
                found.add((_name(pid), *table[inode]))
    return found


def loopback(address: str) -> bool:
    """127.0.0.0/8 or ::1, also written IPv4-mapped (``::ffff:127.0.0.1``: gRPC's sockets)."""
    ip = ipaddress.ip_address(address)
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback


def test_every_socket_a_local_run_listens_on_is_loopback(tmp_path):
    assert AUTOTUNE.exists(), f"the console script is not installed next to {sys.executable}"
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(AUTOTUNE_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    run = subprocess.Popen(
        [
            str(AUTOTUNE),
            "run",
            "--study",
            "quick",
            "--budget",
            "40s",
            "--n-trials",
            str(TRIALS),
            "--validate-top",
            "0",
        ],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: set[tuple[str, str, int]] = set()
    out = []
    try:
        for line in run.stdout:
            out.append(line)
            if "samples/s" in line:  # the baseline has a result: trials run from now on
                break
        until = time.monotonic() + WATCH_S
        while time.monotonic() < until and run.poll() is None:
            seen |= listeners(run.pid)
            time.sleep(0.25)
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGINT)  # the run stops its ranks and Ray
        try:
            out.append(run.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            run.kill()
            out.append(run.communicate()[0])
    assert any("samples/s" in line for line in out), "".join(out)[-3000:]
    ranks = {s for s in seen if "RankActor" in s[0]}
    assert seen and ranks, f"no listening socket of the run's ranks was seen: {sorted(seen)}"
    beyond = sorted(s for s in seen if not loopback(s[1]))
    assert beyond == [], "listening beyond loopback:\n" + "\n".join(map(str, beyond))
