"""Sessions kept for the next run of their configuration, in one rank's process.

The checks after the search (re-validation, its further rounds, the ablation) measure the same
few configurations in turn, round after round, in the warm pool's processes. Built anew for
each run, a session spends its set-up (the model, DDP, optimizer, DataLoader), its discarded
steps and, for a compiled model, its compilation (1.2-1.5 s on the default workload) on every
run: about a quarter of such a run's seconds, half of a compiled one's. Kept, a configuration's
next run measures on the session it already has, after ``REARM_STEPS`` discarded step (the
other configurations ran on this process in between) and the windows' own settle rule.

A run asks for it with ``RankSpec.keep``, the key of its configuration:
- a session kept under that key is measured again (``Session.rearm``);
- else one is built, measured as every run is, and kept;
- the kept sessions share one process group, made by the first and destroyed with the last
  (``release``): every run that keeps runs in one pool's processes (one environment), so the
  NCCL variables a process group reads are the same for all;
- a run without a key (a search trial, a limit probe, a traced run) releases them all first:
  its process group would be the second, and its memory is its own.

Memory: another session is built beside kept ones only where every rank's node has room for it
twice over, for each of the node's ranks (``_room``: the largest kept session's footprint,
from the node's available memory or the GPU's free memory); where any rank's has not, the
least recently used kept session goes first, on every rank alike (the ranks agree over the
kept process group). A new session is kept after its run only where there is still such room
and fewer than ``MOST_KEPT`` are kept; else it goes when its run ends. So where a comparison
has more configurations than fit, those kept stay kept and the others are built for each run
(letting the least recently used go instead would miss on every run of a round-robin).
Compiled models of one workload share their graphs (on the default workload five compiled
configurations kept side by side compiled no graph after the first two, and none in any
later run's windows), so letting one go leaves the graphs to the others; they are cleared
(``torch.compiler.reset``) when every kept session goes.

A failure in a kept run fails it as any run fails: the launcher then kills the processes, and
the kept sessions with them.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from autotune.core.rank_io import REARM_STEPS, RankSpec
from autotune.rank.session import (
    LAST_GROUP,
    Session,
    build,
    init_group,
    prepare_process,
    reset_compiler,
    rss_mb,
)

__all__ = ["kept_session", "release"]

#: Sessions kept at most in one process (module doc).
MOST_KEPT = 8

#: The kept sessions by key, the least recently used first.
_SESSIONS: OrderedDict[str, Session] = OrderedDict()
#: Each kept session's footprint (MiB): what its building and first run added.
_FOOTPRINT: dict[str, float] = {}


@contextlib.contextmanager
def kept_session(spec: RankSpec, store: Any) -> Iterator[tuple[Session, int]]:
    """The session kept under ``spec.keep``, readied for this run, or a new one kept after
    this run (module doc); with the steps this run discards before its windows."""
    assert spec.keep is not None
    s = _SESSIONS.get(spec.keep)
    if s is not None:
        _SESSIONS.move_to_end(spec.keep)
        prepare_process(spec)  # this configuration's threads and precision flags
        s.rearm(spec)
        s.others_mb = _held_mb(but=spec.keep)
        yield s, REARM_STEPS
        return
    import torch.distributed as dist

    device = prepare_process(spec)
    while _SESSIONS and not _agreed(_room(spec, device), device):  # room to build it
        _drop(next(iter(_SESSIONS)))
    if not dist.is_initialized():  # the first kept session's run: the kept process group
        init_group(spec, store)
    before = _used_mb(device)
    s = build(spec, device)
    s.others_mb = _held_mb()
    yield s, spec.measure.discarded_steps
    footprint = max(_used_mb(device) - before, 0.0)
    room = _room(spec, device, footprint)
    if not _SESSIONS or (len(_SESSIONS) < MOST_KEPT and _agreed(room, device)):
        _FOOTPRINT[spec.keep] = footprint
        _SESSIONS[spec.keep] = s
    else:  # built for this run alone, on the kept process group
        del s
        _collect()


def release() -> None:
    """Let every kept session go, with their process group and compiled graphs: before a run
    that keeps nothing (module doc). Nothing when none is kept."""
    import torch.distributed as dist

    if not dist.is_initialized():  # every other run destroys its own
        return
    _SESSIONS.clear()
    _FOOTPRINT.clear()
    reset_compiler()  # the graphs of every compiled session of the group, kept or let go
    LAST_GROUP.append(dist.group.WORLD)  # freed when the next run starts (LAST_GROUP's doc)
    dist.destroy_process_group()
    _collect()


def _drop(key: str) -> None:
    """Let the kept session ``key`` go (its compiled graphs stay: the others share them)."""
    gone = _SESSIONS.pop(key)
    _FOOTPRINT.pop(key, None)
    del gone
    _collect()


def _collect() -> None:
    """Collect what was let go: the runs freeze what lives when they start
    (``rank.measure.run_rank``), the kept sessions with it."""
    import gc

    from autotune.core import allocator

    gc.unfreeze()
    gc.collect()
    allocator.trim()


def _room(spec: RankSpec, device: Any, also: float = 0.0) -> bool:
    """Whether this rank's node (its GPU) holds the largest kept session's footprint (or
    ``also``'s, a session about to be kept) twice over for each of the node's ranks (one for
    a GPU's own rank)."""
    largest = max(*_FOOTPRINT.values(), also, 0.0)
    cuda = device.type == "cuda"
    free = _free_mb(cuda, device)
    if free is None:  # nothing says: one session at a time
        return False
    ranks = 1 if cuda else spec.local_world_size
    return free >= 2 * ranks * largest


def _agreed(fits: bool, device: Any) -> bool:
    """``fits`` on every rank (over the kept process group): every rank decides alike."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([1.0 if fits else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def _held_mb(but: str | None = None) -> float:
    return sum(mb for k, mb in _FOOTPRINT.items() if k != but)


def _used_mb(device: Any) -> float:
    """What this process holds now (MiB): the GPU's allocated memory, else its RSS."""
    if device.type == "cuda":
        import torch

        return torch.cuda.memory_allocated(device) / 2**20
    return rss_mb()


def _free_mb(cuda: bool, device: Any) -> float | None:
    """The GPU's free memory, else the node's available memory (MiB); None where unknown."""
    if cuda:
        import torch

        return torch.cuda.mem_get_info(device)[0] / 2**20
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None
