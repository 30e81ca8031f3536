"""Script mode, script side: what ``Profile.wrap`` adds when a trial of ``autotune run ... --
CMD`` runs the user's script (``autotune.script.trial`` is the driver's side).

When ``AUTOTUNE_REPORT_DIR`` is set, ``install`` registers a forward pre-hook on the wrapped
model: each forward pass appends a line ``t <time.perf_counter()>`` to
``$AUTOTUNE_REPORT_DIR/rank-<RANK>.steps``, and every ``MEMORY_EVERY``-th (the first
included) also ``m <MiB>``, the rank's peak memory so far: CUDA's peak allocated memory when
the input is on a GPU, else the process's peak resident set (a trial's processes are new,
so it is the trial's own); ``report_loss`` appends ``l <loss>``. A line is
written whole and flushed at once, so the driver reads complete lines while the script runs.
Without the variable (the real job, under ``autotune launch``) nothing is installed and
``report_loss`` does nothing.
"""

from __future__ import annotations

import os
import resource
import time
from typing import Any, TextIO

__all__ = ["MEMORY_EVERY", "install", "report_loss"]

#: Forward passes between two peak-memory lines (one ``getrusage`` or CUDA query each).
MEMORY_EVERY = 8

_OUT: dict[str, TextIO] = {}


def _file() -> TextIO | None:
    where = os.environ.get("AUTOTUNE_REPORT_DIR")
    if not where:
        return None
    if where not in _OUT:
        rank = os.environ.get("RANK")
        if rank is None:
            import torch.distributed as dist

            rank = str(dist.get_rank()) if dist.is_initialized() else "0"
        _OUT[where] = open(  # noqa: SIM115 - open for the life of the process
            os.path.join(where, f"rank-{int(rank)}.steps"), "a", buffering=1
        )
    return _OUT[where]


def install(model: Any) -> bool:
    """Time each forward pass of ``model`` for the driver; True when installed."""
    out = _file()
    if out is None:
        return False

    count = 0

    def stamp(module: Any, args: Any) -> None:  # on the script's hot path: one write
        nonlocal count
        out.write(f"t {time.perf_counter()!r}\n")
        if count % MEMORY_EVERY == 0:
            out.write(f"m {_peak_mb(args):.1f}\n")
        count += 1

    model.register_forward_pre_hook(stamp)
    return True


def _peak_mb(args: Any) -> float:
    """The rank's peak memory so far in MiB: CUDA's peak allocated when the forward's first
    input is on a GPU, else the process's peak resident set (Linux reports KiB)."""
    first = args[0] if isinstance(args, tuple) and args else None
    if getattr(first, "is_cuda", False):
        import torch

        return torch.cuda.max_memory_allocated(first.device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def report_loss(loss: Any) -> None:
    """Hand a step's loss to the driver (for the NaN check and the numerics guard)."""
    out = _file()
    if out is not None:
        value = loss.detach() if hasattr(loss, "detach") else loss  # a tensor of the graph
        out.write(f"l {float(value)!r}\n")
