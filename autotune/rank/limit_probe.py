"""The limit probe inside a rank: where one configuration's step time goes, and what the same
hardware does with communication taken out, or with nothing but communication.

``probe(session, steps, step_s, settings)`` runs after the warm-up, in this order, every rank at
once:

1. DDP steps (two windows' worth, ``MIN_STEPS`` to ``MAX_STEPS``; where steps are slow,
   ``FEWEST_STEPS`` that take ``PROBE_S`` or more do), each phase timed (data, forward,
   backward, optimizer; ``Session.step``). DDP's backward returns once its buckets
   are all-reduced, so the backward phase holds the communication not hidden behind it.
2. alternating with them in blocks (DDP, bare, DDP, bare), as many steps of the bare model
   (``Session.step(communicate=False)``): the same micro-batch, precision and DataLoader, no
   all-reduce - each rank computing alone on its share of the machine, as it does in the
   trial. That is the compute ceiling. Alternating, both see the same machine.
3. The communication alone: the gradients' buckets, at the sizes DDP itself settled on for
   this configuration (``core.compat.ddp_bucket_bytes``), all-reduced back to back as DDP issues
   them, ``repeats`` times (no unmeasured round first: the DDP steps just sent the same buckets
   over the same group); then the last bucket alone, which no backward can hide. A
   compressing hook (fp16, bf16) all-reduces half the bytes: the buckets are sent in that
   dtype. PowerSGD is not modelled (its buckets are sent whole: an upper bound). Then one
   all-reduce of each of ``FIT_BYTES`` (at most the gradients' own bytes), ``repeats`` times
   each: the points of the link's alpha-beta fit (``autotune.limit.evidence.fit_alpha_beta``:
   seconds = alpha + bytes x per-byte), which tells a latency-bound all-reduce from a
   bandwidth-bound one.
4. With ``trace``: ``torch.profiler`` over ``PROFILED_STEPS`` DDP steps, each phase a labelled
   range (``autotune.forward`` ...), written by rank 0 as a Chrome trace (Perfetto opens it).

Each phase is a mean over the steps and the all-reduce a median over the repeats, then the
slowest rank's (one all-reduce), so every rank returns the same record. After step 2 the
ranks' weights differ: nothing measured here trains anything that is kept.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import replace
from typing import Any

from autotune.core.config import MeasureSettings
from autotune.core.knobs import HALF_HOOKS
from autotune.rank.session import PHASES, Session

__all__ = [
    "PROBE_WARMUP_STEPS",
    "PROFILED_STEPS",
    "least_steps",
    "probe",
    "probe_steps",
    "probe_warmup",
    "trace_steps",
]

#: DDP steps (and as many bare ones) the probe times: two windows' worth, within these. Fewer
#: let one slow step of a loaded machine move the mean: with 3 steps the default MLP's probe
#: read 268 samples/s where its trials read 350-377.
MIN_STEPS = 8
MAX_STEPS = 200
#: Where steps are slow, fewer than ``MIN_STEPS`` do: as many as take ``PROBE_S`` seconds, at
#: least ``FEWEST_STEPS`` (two per block). The mean moved by one slow step is a matter of the
#: time measured, not of the count: the default MLP's 8 steps take about 3 s; on the network
#: lab at 300 Mbit (2 s a step) the 8 DDP and 8 bare steps took 17 of the probe's 40 s, and the
#: probe delays every screening trial.
PROBE_S = 4.0
FEWEST_STEPS = 4
#: DDP steps recorded by the profiler for the trace (outside every timed figure).
PROFILED_STEPS = 2
#: Most warm-up steps before the probe: its figures are means over its steps, and it
#: usually runs in processes that have just run this model (on the network lab a settled
#: warm-up took a third of a 35 s probe).
PROBE_WARMUP_STEPS = 4
#: Message sizes (bytes) of the alpha-beta fit: a latency-sized message, a middling one and a
#: bucket-sized one (capped at the gradients' bytes, at least two distinct sizes).
FIT_BYTES = (1 << 10, 1 << 17, 1 << 22)


Phases = list[dict[str, float]]


def _phased(s: Session, steps: int) -> tuple[Phases, Phases, list[Any]]:
    """``steps`` DDP steps and ``steps`` bare-model steps in alternating blocks (DDP, bare,
    DDP, bare), their phases timed: (each DDP step's phases, each bare step's, each DDP step's
    loss). Blocks, not single steps: the two kinds share one DataLoader, and alternating step
    by step let one kind take the batches the workers had ready while the other waited (on an
    H100 a data-bound convnet's bare steps waited 3x longer for data than its DDP steps)."""
    ddp: Phases = []
    bare: Phases = []
    losses: list[Any] = []
    half = max(steps // 2, 1)
    for block in (half, steps - half):
        for communicate, out in ((True, ddp), (False, bare)):
            for _ in range(block):
                phases = dict.fromkeys(PHASES, 0.0)
                loss = s.step(phases, communicate=communicate)
                out.append(phases)
                if communicate:
                    losses.append(loss)
    return ddp, bare, losses


def _mean_phases(steps: list[dict[str, float]]) -> dict[str, float]:
    """Each phase's mean seconds per step, and the whole step's. Means, not medians: a phase
    whose cost comes in bursts (a DataLoader whose workers deliver several batches at once,
    then none for a while) would have a median far below what it costs per step - on an H100
    the median step of a data-bound convnet ran 3.5x faster than its trials."""
    mean = {p: statistics.fmean(st[p] for st in steps) for p in PHASES}
    mean["step"] = sum(mean.values())
    return mean


def _comm_alone(s: Session, repeats: int) -> dict[str, Any]:
    """The gradients' all-reduce with nothing else running: (median seconds of all buckets back
    to back, of the last bucket alone) and what was sent."""
    import torch
    import torch.distributed as dist

    from autotune.core.compat import ddp_bucket_bytes

    hook = s.spec.config.comm_hook.get("name", "none")
    half = hook in HALF_HOOKS
    dtype = (torch.bfloat16 if hook == "bf16" else torch.float16) if half else torch.float32
    sizes = ddp_bucket_bytes(s.ddp)  # fp32 gradient bytes per bucket
    buckets = [torch.ones(max(1, n // 4), dtype=dtype, device=s.device) for n in sizes]
    everything: list[float] = []
    last: list[float] = []
    for _ in range(repeats):  # the DDP steps before warmed the group up with these buckets
        dist.barrier()
        s.sync()
        t0 = time.perf_counter()
        for work in [dist.all_reduce(b, async_op=True) for b in buckets]:
            work.wait()
        s.sync()
        t1 = time.perf_counter()
        dist.all_reduce(buckets[-1])
        s.sync()
        everything.append(t1 - t0)
        last.append(time.perf_counter() - t1)
    fit = _sweep(s, repeats, sum(sizes))
    return {
        "comm_s": statistics.median(everything),
        "last_bucket_s": statistics.median(last),
        "buckets": len(sizes),
        "wire_bytes": sum(b.numel() * b.element_size() for b in buckets),
        "dtype": str(dtype).removeprefix("torch."),
        "modelled": hook in ("none", *HALF_HOOKS),
        "fit_bytes": [b for b, _ in fit],
        "fit_s": [t for _, t in fit],
    }


def _sweep(s: Session, repeats: int, grad_bytes: int) -> list[tuple[int, float]]:
    """(bytes, median seconds) of one fp32 all-reduce of each of ``FIT_BYTES`` (capped at the
    gradients' bytes), after one unmeasured round; every rank runs the same sizes."""
    import torch
    import torch.distributed as dist

    top = max(grad_bytes, 2 * FIT_BYTES[0])
    sizes = sorted({min(b, top) for b in FIT_BYTES})
    out = []
    for size in sizes:
        t = torch.ones(max(1, size // 4), dtype=torch.float32, device=s.device)
        times = []
        for r in range(repeats + 1):
            dist.barrier()
            s.sync()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            s.sync()
            if r:
                times.append(time.perf_counter() - t0)
        out.append((t.numel() * 4, statistics.median(times)))
    return out


def trace_steps(s: Session, path: str) -> None:
    """A few DDP steps under ``torch.profiler``, each step a labelled range
    (``autotune.stepN``; DDP, autograd, the optimizer and the collectives label their own
    within it); rank 0 writes the Chrome trace to ``path``."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if s.cuda else [])
    with profile(activities=activities) as prof:
        for i in range(PROFILED_STEPS):
            with record_function(f"autotune.step{i}"):
                s.step()
        s.sync()
    if s.spec.rank == 0:
        prof.export_chrome_trace(path)
    del prof
    if s.cuda:
        torch.cuda.empty_cache()


def _rounded(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 6)
    return [_rounded(x) for x in v] if isinstance(v, list) else v


def probe_warmup(m: MeasureSettings) -> MeasureSettings:
    """The trial's measurement settings with the probe's shorter warm-up."""
    return replace(
        m,
        min_warmup_steps=min(m.min_warmup_steps, 1),
        settle_window=1,
        max_warmup_steps=min(m.max_warmup_steps, PROBE_WARMUP_STEPS),
    )


def least_steps(step_s: float) -> int:
    """The fewest DDP steps a probe times at ``step_s`` seconds a step: ``MIN_STEPS``, or where
    steps are slow as many as take ``PROBE_S`` (at least ``FEWEST_STEPS``). The first
    measurement times this many (``search.first_look``): it orders the screening, and every
    screening trial waits for it."""
    if step_s <= 0:
        return MIN_STEPS
    return min(MIN_STEPS, max(FEWEST_STEPS, math.ceil(PROBE_S / step_s)))


def probe_steps(steps: int, step_s: float) -> int:
    """The DDP steps the probe times (and as many bare ones), for ``steps`` steps per window
    of ``step_s`` seconds each: two windows' worth, at least ``least_steps``, at most
    ``MAX_STEPS``."""
    return min(max(2 * steps, least_steps(step_s)), MAX_STEPS)


def probe(
    s: Session, steps: int, step_s: float, settings: dict[str, Any]
) -> tuple[list[float], list[float], list[Any], dict[str, Any]]:
    """The probe (module doc) after a warm-up whose last steps took ``step_s`` seconds each:
    (samples/s of each DDP step over all ranks, the slowest rank's seconds of each, the
    losses, the record)."""
    steps = int(settings.get("steps") or probe_steps(steps, step_s))
    ddp_steps, compute_steps, losses = _phased(s, steps)
    comm = _comm_alone(s, int(settings.get("repeats", 5)))
    ddp, compute = _mean_phases(ddp_steps), _mean_phases(compute_steps)
    # The slowest rank's figures: the ranks wait for each other at every all-reduce.
    fits = len(comm["fit_s"])
    worst = s.slowest(
        [*ddp.values(), *compute.values(), comm["comm_s"], comm["last_bucket_s"], *comm["fit_s"]]
    )
    n = len(ddp)
    ddp = dict(zip(ddp, worst[:n], strict=True))
    compute = dict(zip(compute, worst[n : 2 * n], strict=True))
    comm.update(comm_s=worst[2 * n], last_bucket_s=worst[2 * n + 1])
    comm["fit_s"] = worst[2 * n + 2 : 2 * n + 2 + fits]
    per_step = s.slowest([sum(st.values()) for st in ddp_steps])
    if settings.get("trace"):
        trace_steps(s, settings["trace"])
    record = {
        "world_size": s.spec.world_size,
        "samples_per_step": s.samples_per_step,
        "accumulation_steps": s.spec.config.accumulation_steps,
        "steps": steps,
        "ddp": {k: round(v, 6) for k, v in ddp.items()},
        "compute": {k: round(v, 6) for k, v in compute.items()},
        "comm": {k: _rounded(v) for k, v in comm.items()},
    }
    return [s.samples_per_step / t for t in per_step], per_step, losses, record
