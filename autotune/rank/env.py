"""What a rank process sees around its configuration: torchrun's variables, and where its
output goes during a trial. Both are set per trial, since a pooled process runs several."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from autotune.core.logfile import Capper

__all__ = ["log_path", "output_to", "torchrun_env"]


def log_path(log_dir: str, rank: int) -> str:
    """Where rank ``rank`` of a trial whose logs go to ``log_dir`` writes its output."""
    return os.path.join(log_dir, f"rank-{rank}.log")


@contextlib.contextmanager
def output_to(log_dir: str | None, rank: int) -> Iterator[None]:
    """This process's file descriptors 1 and 2, which its DataLoader workers inherit and NCCL
    writes to, into ``log_dir/rank-<rank>.log`` for the trial, and back afterwards. Where the
    directory cannot be made (a rank on another node), or the log's name is a link (planted:
    it is not written through), the output stays where it was. The log is opened with
    ``O_APPEND`` and capped (``autotune.core.logfile``: checked once a second
    while the trial runs, and when it ends)."""
    import sys

    fd, path = None, ""
    if log_dir:
        with contextlib.suppress(OSError):
            os.makedirs(log_dir, exist_ok=True)
            path = log_path(log_dir, rank)
            # never through a link planted where the log goes (it would write another's file)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    if fd is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    capper = Capper(path)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        capper.close()  # the last check, once this process no longer writes to the log


def torchrun_env(
    rank: int,
    world_size: int,
    local_rank: int,
    local_world_size: int,
    backend: str,
    master_addr: str,
    master_port: int,
) -> dict[str, str]:
    """The variables torchrun gives a worker, for the process group this trial creates, so
    that a trainer's code that reads them (``LOCAL_RANK`` most often) runs in a trial as it
    runs under torchrun. ``LOCAL_RANK`` is what torchrun makes it, the index of the rank's
    device: on CPU its index among the trial's ranks on the node; with nccl 0, since Ray
    shows each rank only its own GPU (``cuda:0``, which ``rank.run_rank`` selects)."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": "0" if backend == "nccl" else str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }
