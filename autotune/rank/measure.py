"""What runs inside one DDP rank's process: apply a trial's configuration, train, measure.

One function, ``run_rank``, in the order a trial lives: the process group and the workload in
DDP with the trial's settings (``rank.session.open_session``); warm-up until the step time
settles (not timed); timed windows, the device synchronised at both edges of each, until the
throughput interval is narrow enough, the cap, or the trial is clearly below the incumbent
(pruned) - or, for a limit probe (``RankSpec.limit``), ``rank.limit_probe.probe`` instead of the
windows; the result; the process group destroyed on every path. Each decision is taken from
the slowest rank's times, which one all-reduce gives every rank, so all ranks decide alike.

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
from typing import Any

from autotune.core import allocator
from autotune.core.rank_io import NonFiniteLoss, RankResult, RankSpec
from autotune.core.stats import HOPELESS_LAST
from autotune.rank.env import output_to
from autotune.rank.session import LAST_GROUP, Session, open_session

__all__ = ["run_rank"]


def run_rank(spec: RankSpec, store: Any = None) -> RankResult:
    """Run one rank of a trial and return its measurement; leave the process as clean as the
    trial found it (see module doc). ``store``: rank 0's ``TCPStore``, already listening at
    ``master_port`` (others connect to it; without one, rank 0 starts it here)."""
    LAST_GROUP.clear()
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
    import torch

    started = time.perf_counter()
    with open_session(spec, store) as s:
        m = spec.measure
        if spec.limit is not None:  # a few steps: the probe's own figures are medians
            from autotune.rank.limit_probe import probe_warmup

            m = probe_warmup(m)
        # Warm-up: until the slowest rank's step time settles (autotune.core.stats.SettleRule).
        settle, prune_rule = m.settle_rule(), m.prune_rule()
        incumbent = spec.incumbent if spec.limit is None else None
        warmup_started = time.perf_counter()
        step_times: list[float] = []
        last_losses: list[Any] = []
        while settle.settled_at(step_times) is None:
            s.sync()
            t = time.perf_counter()
            last = s.step()
            s.sync()
            step_times.append(s.slowest([time.perf_counter() - t])[0])
            last_losses = [*last_losses[-HOPELESS_LAST + 1 :], last]
            if len(step_times) >= m.min_warmup_steps and not math.isfinite(float(last)):
                # before spending more warm-up or any window on it
                raise NonFiniteLoss(f"loss is {float(last)} after {len(step_times)} warm-up steps")
            rates = [s.samples_per_step / x for x in step_times]
            if prune_rule.hopeless(rates, incumbent) is not None:  # the same on every rank
                ended = time.perf_counter()  # set-up includes warm-up, as a measured trial's
                return _result(
                    s,
                    rates[-HOPELESS_LAST:],
                    step_times[-HOPELESS_LAST:],
                    1,
                    "hopeless",
                    float(torch.stack(last_losses).mean()),
                    None,
                    setup_s=ended - started,
                    warmup_s=ended - warmup_started,
                    warmup_steps=len(step_times),
                    measure_s=0.0,
                )
        per_step = statistics.median(step_times[-m.settle_window :])
        steps = min(max(math.ceil(m.window_s / per_step), m.min_steps), m.max_steps)
        measure_started = time.perf_counter()
        setup_s = measure_started - started  # process group, model, DDP, loader, warm-up

        if spec.limit is not None:  # the limit probe instead of the timed windows
            from autotune.rank.limit_probe import probe

            windows, seconds, losses, found = probe(s, steps, per_step, spec.limit)
            stop = "limit"
        else:
            windows, seconds, losses, stop = _windows(s, steps)
            found = None
        measure_s = time.perf_counter() - measure_started
        if spec.trace is not None and spec.limit is None:  # after the windows, outside them
            from autotune.rank.limit_probe import trace_steps

            trace_steps(s, spec.trace)
        loss = float(torch.stack(losses).mean())
        if not math.isfinite(loss):
            raise NonFiniteLoss(f"loss is {loss} after {len(losses)} measured steps")
        return _result(
            s,
            windows,
            seconds,
            steps,
            stop,
            loss,
            found,
            setup_s=setup_s,
            warmup_s=measure_started - warmup_started,
            warmup_steps=len(step_times),
            measure_s=measure_s,
        )


def _windows(s: Session, steps: int) -> tuple[list[float], list[float], list[Any], str]:
    """Timed windows of ``steps`` steps until the interval is narrow enough, the cap, or the
    trial is clearly below the incumbent: (samples/s over all ranks per window, the slowest
    rank's seconds per window, losses, why they stopped)."""
    import torch.distributed as dist

    m, spec = s.spec.measure, s.spec
    stop_rule, prune_rule = m.stop_rule(), m.prune_rule()
    incumbent = spec.incumbent
    samples_per_window = steps * s.samples_per_step
    windows: list[float] = []
    seconds: list[float] = []
    losses: list[Any] = []
    while True:
        dist.barrier()
        s.sync()
        t0 = time.perf_counter()
        losses.extend(s.step() for _ in range(steps))
        s.sync()
        seconds.append(s.slowest([time.perf_counter() - t0])[0])
        windows.append(samples_per_window / seconds[-1])
        if prune_rule.should_prune(windows, incumbent):
            return windows, seconds, losses, "pruned"
        done, stop = stop_rule.decide(windows)
        if done:
            return windows, seconds, losses, stop


def _result(
    s: Session,
    windows: list[float],
    seconds: list[float],
    steps: int,
    stop: str,
    loss: float,
    limit: dict[str, Any] | None,
    **timing: Any,
) -> RankResult:
    """The rank's result, with the settings read back from the live objects."""
    import torch

    from autotune.core.compat import ddp_logging

    spec, cfg = s.spec, s.spec.config
    peak_mb = torch.cuda.max_memory_allocated(s.device) / 2**20 if s.cuda else s.peak_rss
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
    per_window = steps if limit is None else 1  # the limit probe's windows are single steps
    counted = per_window * len(windows)
    return RankResult(
        rank=spec.rank,
        applied=applied,
        pid=os.getpid(),
        steps=counted,
        samples=counted * cfg.micro_batch * cfg.accumulation_steps,
        window_s=sum(seconds),
        windows=windows,
        steps_per_window=per_window,
        stop=stop,
        loss=loss,
        loss_curve=[float(x) for x in s.curve],
        peak_memory_mb=round(peak_mb, 1),
        limit=limit,
        **timing,
    )
