"""The link between a trial's ranks, measured by autotune's own processes: one all-reduce of each
of a few message sizes, timed, for the alpha-beta fit of the first measurement in script mode
(``autotune.limit.evidence.fit_alpha_beta``: seconds = alpha + bytes x per-byte).

``sweep`` runs in one process per rank on the trial's placement
(``autotune.script.first_measurement`` starts them as Ray tasks in the script's bundles): it
joins a process group of its own (a TCP store on the first node's address, the study's
backend), all-reduces each size once unmeasured and then ``repeats`` times, and returns each
size's median over the repeats, the slowest rank's (every rank returns the same). Nothing of
the user's job runs here.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from datetime import timedelta

from autotune.rank.session import listening_store

__all__ = ["sweep"]

#: How long the ranks may take to find each other.
JOIN_TIMEOUT_S = 60.0


def sweep(
    *,
    rank: int,
    world_size: int,
    addr: str,
    port: int,
    backend: str,
    sizes: Sequence[int],
    repeats: int,
) -> list[tuple[int, float]]:
    """(bytes, seconds) of one all-reduce of each of ``sizes`` (fp32 elements), the slowest
    rank's median over ``repeats``."""
    import torch
    import torch.distributed as dist

    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", 0)  # the one GPU Ray shows this process
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=JOIN_TIMEOUT_S)
    if rank == 0:  # listening on the first node's address only, not every interface
        store = listening_store(addr, port, timeout)
    else:
        store = dist.TCPStore(addr, port, world_size, False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
    try:
        out = []
        for size in sizes:
            x = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
            times = []
            for i in range(repeats + 1):
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(x)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                if i:  # the first is not measured
                    times.append(time.perf_counter() - t0)
            slowest = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            out.append((x.numel() * 4, float(slowest.item())))
        return out
    finally:
        dist.destroy_process_group()
