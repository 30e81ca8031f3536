"""The link's all-reduces of a script's first measurement (``autotune.rank.link``): two real
gloo processes on loopback, and the store rank 0 opens listening on its address only
(docs/security.md, H-S25)."""

from __future__ import annotations

import multiprocessing as mp
import socket
import time
from pathlib import Path


def _rank(rank: int, port: int, q) -> None:
    from autotune.rank.link import sweep

    q.put(
        (
            rank,
            sweep(
                rank=rank,
                world_size=2,
                addr="127.0.0.1",
                port=port,
                backend="gloo",
                sizes=[1024, 1 << 18],
                repeats=2,
            ),
        )
    )


def _listening(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp{,6} write them) listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.rsplit(":", 1)
            if state == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                found.add(addr)
    return found


def test_h_s25_the_sweep_runs_and_its_store_listens_on_its_address_only():
    """H-S25."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    q = mp.get_context("spawn").Queue()
    first = mp.get_context("spawn").Process(target=_rank, args=(0, port, q))
    first.start()
    try:
        deadline = time.monotonic() + 60
        while not _listening(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _listening(port) == {"0100007F"}, _listening(port)  # 127.0.0.1, nothing else
        second = mp.get_context("spawn").Process(target=_rank, args=(1, port, q))
        second.start()
        got = dict([q.get(timeout=60), q.get(timeout=60)])
        second.join(30)
    finally:
        first.join(30)
        first.kill()
    assert got[0] == got[1]  # every rank returns the slowest rank's figures
    assert [b for b, _ in got[0]] == [1024, 1 << 18]
    assert all(0 < s < 10 for _, s in got[0])
