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
kept process group). No more than ``MOST_KEPT`` are kept, ``MOST_COMPILED`` of them compiled
(dynamo keeps 8 graphs per code object, then runs eager); a compiled session released takes
the other compiled ones with it (``torch.compiler.reset`` clears every model's graphs).

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
    is_compiled,
    prepare_process,
    reset_compiler,
    rss_mb,
)

__all__ = ["kept_session", "release"]

#: Sessions kept at most in one process; compiled ones among them (module doc).
MOST_KEPT = 8
MOST_COMPILED = 4

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

    if _SESSIONS:  # agree on room, over the kept process group
        _make_room(spec)
    device = prepare_process(spec)
    if not dist.is_initialized():  # the first kept session's run: the kept process group
        init_group(spec, store)
    before = _used_mb(device)
    s = build(spec, device)
    s.others_mb = _held_mb()
    yield s, spec.measure.discarded_steps
    _FOOTPRINT[spec.keep] = max(_used_mb(device) - before, 0.0)
    _SESSIONS[spec.keep] = s


def release() -> None:
    """Let every kept session go, with their process group and compiled graphs: before a run
    that keeps nothing (module doc). Nothing when none is kept."""
    import torch.distributed as dist

    if not dist.is_initialized():  # every other run destroys its own
        return
    compiled = any(is_compiled(s.spec) for s in _SESSIONS.values())
    _SESSIONS.clear()
    _FOOTPRINT.clear()
    if compiled:
        reset_compiler()
    LAST_GROUP.append(dist.group.WORLD)  # freed when the next run starts (LAST_GROUP's doc)
    dist.destroy_process_group()
    _collect()


def _make_room(spec: RankSpec) -> None:
    """Release the least recently used kept sessions until one more fits (module doc)."""
    compiled = is_compiled(spec)
    while _SESSIONS:
        held = list(_SESSIONS.values())
        full = len(held) >= MOST_KEPT or (
            compiled and sum(is_compiled(s.spec) for s in held) >= MOST_COMPILED
        )
        if not full and _agreed(_room(spec, held)):
            return
        _drop(next(iter(_SESSIONS)))


def _drop(key: str) -> None:
    gone = _SESSIONS.pop(key)
    _FOOTPRINT.pop(key, None)
    if is_compiled(gone.spec):  # the reset clears every compiled model's graphs
        for k in [k for k, s in _SESSIONS.items() if is_compiled(s.spec)]:
            _SESSIONS.pop(k)
            _FOOTPRINT.pop(k, None)
        reset_compiler()
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


def _room(spec: RankSpec, held: list[Session]) -> bool:
    """Whether this rank's node (its GPU) holds the largest kept session's footprint twice
    over for each of the node's ranks (one for a GPU's own rank)."""
    largest = max(_FOOTPRINT.values(), default=0.0)
    free = _free_mb(held[0].cuda, held[0].device)
    if free is None:  # nothing says: one session at a time
        return False
    ranks = 1 if held[0].cuda else spec.local_world_size
    return free >= 2 * ranks * largest


def _agreed(fits: bool) -> bool:
    """``fits`` on every rank (over the kept process group): every rank decides alike."""
    import torch
    import torch.distributed as dist

    device = next(iter(_SESSIONS.values())).device
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
