"""What runs inside one DDP rank's process: apply a trial's configuration, train, measure.

One function, ``run_rank``, in the order a trial lives: the process group and the workload in
DDP with the trial's settings (``rank.session.open_session``); ``min_warmup_steps`` steps of
warm-up (not timed); timed windows, the device synchronised at both edges of each, the first
of them warm-up too while they run slower than the ones after them
(``stats.SettleRule.kept_from``), until the kept windows' throughput interval is narrow
enough, the cap, or the trial is clearly below the incumbent (pruned) - or, for a limit probe
(``RankSpec.limit``), a warm-up until the step time settles and ``rank.limit_probe.probe``
instead of the windows, or the probe after them (``AFTER_WINDOWS``); the result; the process
group destroyed on every path. Each decision is taken from the slowest rank's times, which one
all-reduce gives every rank, so all ranks decide alike.

Environment variables (``NCCL_*``, ``OMP_NUM_THREADS``) are not set here: Ray puts them in the
process when it starts it, before this function and so before the process group exists.

A process runs several trials in a row when their environments are equal (the launcher's
pool), so ``run_rank`` is re-entrant: it sets every per-trial setting (threads, TF32 flags)
rather than relying on defaults, builds a new process group (new port) and everything on it,
and on return has destroyed the process group (its object is freed when the next trial
starts, see ``rank.session.LAST_GROUP``) and collected the model, optimizer and DataLoader,
whose worker processes are gone with it. Peak memory is the trial's own: the maximum RSS
sampled after each forward pass and optimizer step, not the process's lifetime peak.

glibc's malloc is pinned in every rank process (``autotune.core.allocator.pin``, called once when
the pool starts the process). With its dynamic thresholds, a new process (the first trial of a
run, the baseline) took 40-190 thousand page faults a second per rank and ran its steps 10-20 %
slower for the first 20-30 steps, long after the settle rule had started timing: the cold first
baseline (``bench/settle.py``, docs/measurement.md).
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from autotune.core import allocator
from autotune.core.rank_io import AFTER_WINDOWS, NonFiniteLoss, RankResult, RankSpec
from autotune.rank.env import output_to
from autotune.rank.kept import kept_session, release
from autotune.rank.session import LAST_GROUP, Session, open_session

__all__ = ["run_rank"]


def run_rank(spec: RankSpec, store: Any = None) -> RankResult:
    """Run one rank of a trial and return its measurement; leave the process as clean as the
    trial found it (see module doc). ``store``: rank 0's ``TCPStore``, already listening at
    ``master_port`` (others connect to it; without one, rank 0 starts it here)."""
    LAST_GROUP.clear()
    if spec.keep is None:  # a run that keeps nothing runs on a process group of its own
        release()
    # What lives now (torch, Ray, the trainer module, caches) outlives every trial: frozen, the
    # collection below only scans what this trial makes (a full one costs 0.1-0.2 s).
    gc.freeze()
    try:
        with output_to(spec.log_dir, spec.rank):
            try:
                return _run_rank(spec, store)
            except BaseException:
                if spec.log_dir:  # the error in the rank's own log, after what it printed
                    traceback.print_exc()
                raise
    finally:
        # _run_rank's frame is gone: collect its cycles (DDP, autograd graph, the DataLoader
        # iterator, whose finaliser stops and joins the worker processes), give cached CUDA
        # blocks and glibc's free heap back, so the next trial starts from a low RSS.
        gc.collect()
        if spec.backend == "nccl":
            import torch

            torch.cuda.empty_cache()
        allocator.trim()


def _run_rank(spec: RankSpec, store: Any) -> RankResult:
    started = time.perf_counter()
    if spec.keep is not None:  # a re-measurement run: on its configuration's kept session
        with kept_session(spec, store) as (s, discarded):
            return _measure(s, started, discarded)
    with open_session(spec, store) as s:
        if spec.limit is not None and not spec.limit.get(AFTER_WINDOWS):
            return _probe(s, started)  # a few steps: the probe's own figures are medians
        return _measure(s, started, spec.measure.discarded_steps)


def _measure(s: Session, started: float, discarded: int) -> RankResult:
    """The run's measurement on session ``s`` (module doc), after ``discarded`` steps; then
    the trace and the limit probe its spec asks for after the windows."""
    import torch

    spec = s.spec
    # Warm-up: the steps always discarded; the last one's time sizes the windows.
    warmup_started = time.perf_counter()
    step_times: list[float] = []
    last: Any = None
    for _ in range(discarded):
        took, last = _timed_step(s)
        step_times.append(took)
    if not math.isfinite(float(last)):  # before any window is spent on it
        raise NonFiniteLoss(f"loss is {float(last)} after {len(step_times)} warm-up steps")
    timed = _windows(s, step_times[-1])
    kept = timed.kept
    ended = time.perf_counter()
    if spec.trace is not None and timed.stop != "hopeless":  # after the windows
        from autotune.rank.limit_probe import trace_steps

        trace_steps(s, spec.trace)
    found, probe_s = None, 0.0
    if spec.limit is not None and timed.stop != "hopeless":  # AFTER_WINDOWS
        found, probe_s = _probe_after(s, timed)
    losses = [x for window in timed.losses[kept:] for x in window]
    loss = float(torch.stack(losses).mean())
    if not math.isfinite(loss):
        raise NonFiniteLoss(f"loss is {loss} after {len(losses)} measured steps")
    first = timed.starts[kept]  # where the kept windows start: warm-up ends
    return _result(
        s,
        timed.windows[kept:],
        timed.seconds[kept:],
        timed.sizes[kept:],
        timed.stop,
        loss,
        found,
        setup_s=first - started,
        warmup_s=first - warmup_started,
        warmup_steps=len(step_times) + sum(timed.sizes[:kept]),
        measure_s=ended - first,
        probe_s=probe_s,
    )


def _probe_after(s: Session, timed: _Timed) -> tuple[dict[str, Any], float]:
    """The limit probe after the windows (``AFTER_WINDOWS``), which warmed the session up: its
    record and seconds. It times its fewest steps (``least_steps``) at the kept windows'
    median step unless its settings say how many. A probe that raises (every rank alike: its
    steps and all-reduces are the same on each) does not fail the trial, whose windows are
    measured: its record says why instead."""
    from autotune.rank.limit_probe import least_steps, probe

    kept = timed.kept
    step_s = statistics.median(
        sec / n for sec, n in zip(timed.seconds[kept:], timed.sizes[kept:], strict=True)
    )
    settings = dict(s.spec.limit or {})
    settings["steps"] = settings.get("steps") or least_steps(step_s)
    t0 = time.perf_counter()
    try:
        *_, found = probe(s, timed.sizes[-1], step_s, settings)
    except Exception as e:  # noqa: BLE001 - said in the record; the trial stands
        found = {"failed": f"{type(e).__name__}: {e}"}
    return found, time.perf_counter() - t0


def _timed_step(s: Session) -> tuple[float, Any]:
    """One warm-up step: the slowest rank's seconds, and the loss."""
    s.sync()
    t = time.perf_counter()
    last = s.step()
    s.sync()
    return s.slowest([time.perf_counter() - t])[0], last


def _probe(s: Session, started: float) -> RankResult:
    """The limit probe (``rank.limit_probe``) after a warm-up until the slowest rank's step
    time settles (``SettleRule.settled_at``), instead of the windows."""
    import torch

    from autotune.rank.limit_probe import probe, probe_warmup

    m = probe_warmup(s.spec.measure)
    settle = m.settle_rule()
    warmup_started = time.perf_counter()
    step_times: list[float] = []
    while settle.settled_at(step_times) is None:
        took, last = _timed_step(s)
        step_times.append(took)
        if len(step_times) >= m.min_warmup_steps and not math.isfinite(float(last)):
            raise NonFiniteLoss(f"loss is {float(last)} after {len(step_times)} warm-up steps")
    per_step = statistics.median(step_times[-m.settle_window :])
    steps = m.window_steps(per_step)
    measure_started = time.perf_counter()
    windows, seconds, losses, found = probe(s, steps, per_step, s.spec.limit or {})
    loss = float(torch.stack(losses).mean())
    if not math.isfinite(loss):
        raise NonFiniteLoss(f"loss is {loss} after {len(losses)} measured steps")
    return _result(
        s,
        windows,
        seconds,
        [1] * len(windows),  # the probe's windows are single steps
        "limit",
        loss,
        found,
        setup_s=measure_started - started,
        warmup_s=measure_started - warmup_started,
        warmup_steps=len(step_times),
        measure_s=time.perf_counter() - measure_started,
    )


@dataclass
class _Timed:
    """A measurement's windows, all of them (``kept``: the first one counted)."""

    windows: list[float] = field(default_factory=list)
    """Samples/s over all ranks, per window."""
    seconds: list[float] = field(default_factory=list)
    """The slowest rank's seconds, per window."""
    sizes: list[int] = field(default_factory=list)
    """Steps per window."""
    starts: list[float] = field(default_factory=list)
    losses: list[list[Any]] = field(default_factory=list)
    kept: int = 0
    stop: str = ""


def _windows(s: Session, step_s: float) -> _Timed:
    """Timed windows, the first sized from the last warm-up step's ``step_s`` and each after
    it from the one before until one is kept; the first ones warm-up while they run slower
    than the ones after them (``SettleRule.kept_from``); until the kept ones' interval is
    narrow enough, the cap, or the trial is clearly below the incumbent (pruned) or
    hopelessly (hopeless, settled or not)."""
    import torch.distributed as dist

    m, spec = s.spec.measure, s.spec
    steps = m.window_steps(step_s)
    out = _Timed()
    while True:
        dist.barrier()
        s.sync()
        t0 = time.perf_counter()
        out.starts.append(t0)
        out.losses.append([s.step() for _ in range(steps)])
        s.sync()
        out.seconds.append(s.slowest([time.perf_counter() - t0])[0])
        out.sizes.append(steps)
        out.windows.append(steps * s.samples_per_step / out.seconds[-1])
        kept, stop = m.judge(out.windows, out.sizes, spec.incumbent)  # the same on every rank
        out.kept = kept or 0
        if stop:
            out.stop = stop
            return out
        if kept is None:  # still warming up: the next window sized from this one if far off
            steps = m.resized(steps, out.seconds[-1])


def _result(
    s: Session,
    windows: list[float],
    seconds: list[float],
    sizes: list[int],
    stop: str,
    loss: float,
    limit: dict[str, Any] | None,
    **timing: Any,
) -> RankResult:
    """The rank's result, with the settings read back from the live objects."""
    import torch

    from autotune.core.compat import ddp_logging

    spec, cfg = s.spec, s.spec.config
    applied = {  # read back from the live objects, not from the spec
        "bucket_cap_mb": s.ddp.bucket_bytes_cap / 2**20,
        "gradient_as_bucket_view": bool(s.ddp.gradient_as_bucket_view),
        "static_graph": bool(s.ddp.static_graph),
        "comm_hook": ddp_logging(s.ddp).get("comm_hook") or "none",
        "threads": torch.get_num_threads(),
        "num_workers": s.loader.num_workers,
        "pin_memory": s.loader.pin_memory,
        "micro_batch": s.loader.batch_size,
        "accumulation_steps": cfg.accumulation_steps,
        "grad_scaler": s.scaler.is_enabled(),
        "compile": s.compile_facts(),  # what compiled, and nothing after the session's first steps
    }
    counted = sum(sizes)
    return RankResult(
        rank=spec.rank,
        applied=applied,
        pid=os.getpid(),
        steps=counted,
        samples=counted * cfg.micro_batch * cfg.accumulation_steps,
        window_s=sum(seconds),
        windows=windows,
        steps_per_window=sizes[-1] if sizes else 0,
        stop=stop,
        loss=loss,
        loss_curve=[float(x) for x in s.curve],
        peak_memory_mb=round(s.own_peak_mb, 1),
        session_runs=s.runs,
        limit=limit,
        **timing,
    )
