"""What runs inside one DDP rank's process: apply a trial's configuration, train, measure.

One function, ``run_rank``, in the order a trial lives: threads and precision flags; process
group; workload built and wrapped in DDP with the trial's kwargs and comm hook; DataLoader with
the trial's kwargs; warm-up until the step time settles (not timed); timed windows, the device
synchronised at both edges of each, until the throughput interval is narrow enough, the cap,
or the trial is clearly below the incumbent (pruned); the result; the process group destroyed
on every path. Each decision is taken from the slowest rank's times, which one all-reduce
gives every rank, so all ranks decide alike.

Environment variables (``NCCL_*``, ``OMP_NUM_THREADS``) are not set here: Ray puts them in the
process when it starts it, before this function and so before the process group exists.

A process runs several trials in a row when their environments are equal (the launcher's
pool), so ``run_rank`` is re-entrant: it sets every per-trial setting (threads, TF32 flags)
rather than relying on defaults, builds a new process group (new port) and everything on it,
and on return has destroyed the process group (its object is freed when the next trial starts,
see ``_LAST_GROUP``) and collected the model, optimizer and DataLoader, whose worker processes
are gone with it. Peak memory is the trial's own: the maximum RSS sampled after each forward
pass and optimizer step, not the process's lifetime peak.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import os
import resource
import statistics
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from autotune import apply
from autotune.config import MeasureSettings, TrialConfig
from autotune.numerics import CURVE_STEPS
from autotune.rank_env import output_to, torchrun_env
from autotune.stats import Interval

__all__ = ["NonFiniteLoss", "RankResult", "RankSpec", "listening_store", "run_rank"]


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or infinite during the trial."""


class MemoryLimitExceeded(MemoryError):
    """The rank's peak resident memory went over ``--max-memory``."""


def rss_mb() -> float:
    """Resident memory of this process now, in MiB (``/proc/self/statm``). Where there is no
    ``/proc``, the lifetime peak instead (Linux reports KiB): never lower than the truth."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass(frozen=True, kw_only=True)
class RankSpec:
    """Everything one rank needs to run its part of a trial."""

    trial: int
    rank: int
    world_size: int
    backend: str
    master_addr: str
    master_port: int
    trainer: str
    trainer_options: dict[str, Any] = field(default_factory=dict)
    config: TrialConfig
    measure: MeasureSettings
    seed: int = 0
    timeout_s: float = 300.0
    max_memory_mb: float | None = None
    """Host memory limit per rank (the trial's peak RSS); over it the trial fails with ``oom``
    (checked after each optimizer step)."""
    incumbent: dict[str, Any] | None = None
    """The best trial's throughput interval (``Interval.to_dict``): prune below it."""
    local_rank: int = 0
    """This rank's index among the trial's ranks on its node."""
    local_world_size: int = 1
    """The trial's ranks on this rank's node."""
    log_dir: str | None = None
    """Where this rank's output goes for the trial (``rank-N.log``): its stdout and stderr, its
    DataLoader workers' and NCCL's. None: where the process's output always goes (Ray's)."""


@dataclass(kw_only=True)
class RankResult:
    """What one rank measured in one trial (the launcher adds where and in which process)."""

    rank: int
    applied: dict[str, Any]
    """The settings read back from the live objects (DDP, DataLoader, scaler), not the spec."""
    pid: int
    steps: int
    """Optimizer steps inside timed windows."""
    samples: int
    """Samples this rank processed inside timed windows."""
    window_s: float
    """Seconds inside timed windows (the slowest rank's, every rank holds the same)."""
    windows: list[float]
    """Samples/s over all ranks, one per timed window (the same list on every rank)."""
    steps_per_window: int
    warmup_steps: int
    stop: str
    """Why the windows stopped: ``converged``, ``cap`` or ``pruned`` (``autotune.stats``)."""
    setup_s: float
    """Seconds from the call to the first timed window: process group, model, DDP, loader,
    warm-up."""
    warmup_s: float
    measure_s: float
    """Seconds of the timed windows and the gaps between them."""
    loss: float
    loss_curve: list[float]
    peak_memory_mb: float
    env_at_start: dict[str, str | None] = field(default_factory=dict)
    """The process environment's trial variables as the process started (what NCCL read)."""
    pg_at_start: bool = False
    """Whether a process group existed when the process started (never should)."""
    process_trials: int = 1
    """Trials this process has run, this one included."""
    reused: bool = False
    """Whether the process ran an earlier trial (the launcher's pool)."""
    node_ip: str | None = None
    """The address of the node the rank ran on."""


def _batches(loader: Any, sampler: Any) -> Iterator[Any]:
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


#: The last trial's process group, kept alive until the next trial starts. Gloo's worker
#: threads may still be freeing the last collective's tensors (which takes the GIL) when a
#: trial returns; a ProcessGroupGloo freed at that moment from Python, GIL held, joins those
#: threads and deadlocks (seen on this machine under load). Between trials the process idles
#: with the GIL free, so the threads are done by the time the next trial lets the group go.
_LAST_GROUP: list[Any] = []


def listening_store(host: str, port: int = 0, timeout: timedelta | None = None) -> Any:
    """Rank 0's ``TCPStore``, listening on ``host`` only (``port`` 0: a free one, its
    ``.port``). Given a host, torch's store still listens on every interface ("::"); handed a
    socket already bound to ``host`` (``master_listen_fd``), it listens there alone."""
    import socket

    import torch.distributed as dist

    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.bind(addr)
        sock.listen(socket.SOMAXCONN)
        store = dist.TCPStore(
            host, sock.getsockname()[1], is_master=True, wait_for_workers=False,
            timeout=timeout or timedelta(seconds=300), master_listen_fd=sock.fileno(),
        )  # fmt: skip
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns the descriptor now, and closes it when it goes
    return store


def run_rank(spec: RankSpec, store: Any = None) -> RankResult:
    """Run one rank of a trial and return its measurement; leave the process as clean as the
    trial found it (see module doc). ``store``: rank 0's ``TCPStore``, already listening at
    ``master_port`` (others connect to it; without one, rank 0 starts it here)."""
    _LAST_GROUP.clear()
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
        with contextlib.suppress(OSError, AttributeError):  # AttributeError: not glibc
            ctypes.CDLL(None).malloc_trim(0)


def _run_rank(spec: RankSpec, store: Any) -> RankResult:
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    from autotune.workload import load_workload

    started = time.perf_counter()
    cfg = spec.config
    # torchrun's variables, before any of the trainer's code runs
    os.environ.update(torchrun_env(spec.rank, spec.world_size, spec.local_rank,
                                   spec.local_world_size, spec.backend, spec.master_addr,
                                   spec.master_port))  # fmt: skip
    apply.set_threads(cfg.threads)
    cuda = spec.backend == "nccl"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.cuda.reset_peak_memory_stats(device)
    apply.set_tf32(cfg.precision == "tf32")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    timeout = timedelta(seconds=spec.timeout_s)
    if store is None and spec.rank == 0:  # RankActor.address starts it ahead, else here
        store = listening_store(spec.master_addr, spec.master_port, timeout)
    elif store is None:  # ranks > 0 connect to rank 0's store
        store = dist.TCPStore(
            spec.master_addr, spec.master_port, spec.world_size, is_master=False,
            timeout=timeout, wait_for_workers=False,
        )  # fmt: skip
    store.set_timeout(timeout)
    dist.init_process_group(
        spec.backend, store=store, rank=spec.rank, world_size=spec.world_size, timeout=timeout
    )
    _LAST_GROUP.append(dist.group.WORLD)
    try:
        wl = load_workload(spec.trainer, spec.trainer_options)
        torch.manual_seed(spec.seed)
        model = wl.model().to(device)
        ddp = apply.wrap(model, cfg.ddp, cfg.comm_hook, device_ids=[0] if cuda else None)
        optimizer = wl.optimizer(ddp.parameters())
        sampler = DistributedSampler(
            wl.dataset,
            num_replicas=spec.world_size,
            rank=spec.rank,
            seed=spec.seed,
            drop_last=True,
        )
        loader = DataLoader(
            wl.dataset,
            sampler=sampler,
            drop_last=True,
            **apply.dataloader_kwargs(cfg.micro_batch, cfg.data),
        )
        batches = _batches(loader, sampler)
        scaler = apply.grad_scaler(cfg.precision, device.type)
        accum = cfg.accumulation_steps
        peak_rss = 0.0  # this trial's peak RSS (MiB), sampled where memory use peaks
        curve: list[torch.Tensor] = []  # the first steps' losses, for the numerics guard

        def step() -> torch.Tensor:
            nonlocal peak_rss
            total = torch.zeros((), device=device)
            for micro in range(accum):
                x, y = next(batches)
                x = x.to(device, non_blocking=True)
                y = y.to(device, non_blocking=True)
                # All-reduce only on the last micro-step.
                with apply.micro_step(ddp, micro, accum):
                    with apply.autocast(cfg.precision, device.type):
                        loss = wl.loss(ddp(x), y) / accum
                    peak_rss = max(peak_rss, rss_mb())  # activations held for the backward
                    scaler.scale(loss).backward()
                total += loss.detach().float()
            scaler.step(optimizer)
            scaler.update()
            peak_rss = max(peak_rss, rss_mb())  # params, grads and optimizer state, all alive
            optimizer.zero_grad(set_to_none=True)
            if len(curve) < CURVE_STEPS:
                curve.append(total)
            if spec.max_memory_mb is not None and peak_rss > spec.max_memory_mb:
                raise MemoryLimitExceeded(
                    f"peak host memory {peak_rss:.0f} MiB is over --max-memory "
                    f"{spec.max_memory_mb:.0f} MiB"
                )
            return total

        m = spec.measure

        def slowest(seconds: float) -> float:
            """The slowest rank's time: every rank gets the same value, so every rank takes
            the same decision from it (settled, stop, prune) without another message."""
            t = torch.tensor([seconds], dtype=torch.float64, device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return float(t.item())

        # Warm-up: until the slowest rank's step time settles (autotune.stats.SettleRule).
        settle = m.settle_rule()
        warmup_started = time.perf_counter()
        step_times: list[float] = []
        last = torch.zeros(())
        while settle.settled_at(step_times) is None:
            sync()
            t = time.perf_counter()
            last = step()
            sync()
            step_times.append(slowest(time.perf_counter() - t))
            if len(step_times) >= m.min_warmup_steps and not math.isfinite(float(last)):
                # before spending more warm-up or any window on it
                raise NonFiniteLoss(f"loss is {float(last)} after {len(step_times)} warm-up steps")
        per_step = statistics.median(step_times[-m.settle_window :])
        steps = min(max(math.ceil(m.window_s / per_step), m.min_steps), m.max_steps)
        measure_started = time.perf_counter()
        setup_s = measure_started - started  # process group, model, DDP, loader, warm-up

        # Timed windows until the interval is narrow enough, the cap, or a clear loser.
        stop_rule, prune_rule = m.stop_rule(), m.prune_rule()
        incumbent = None if spec.incumbent is None else Interval.from_dict(spec.incumbent)
        samples_per_window = steps * cfg.micro_batch * accum * spec.world_size
        windows: list[float] = []  # samples/s over all ranks, one per window
        window_s: list[float] = []
        losses: list[torch.Tensor] = []
        stop = "measuring"
        while True:
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            losses.extend(step() for _ in range(steps))
            sync()
            window_s.append(slowest(time.perf_counter() - t0))
            windows.append(samples_per_window / window_s[-1])
            if prune_rule.should_prune(windows, incumbent):
                stop = "pruned"
                break
            done, stop = stop_rule.decide(windows)
            if done:
                break

        loss = float(torch.stack(losses).mean())
        if not math.isfinite(loss):
            raise NonFiniteLoss(f"loss is {loss} after {len(losses)} measured steps")
        peak_mb = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else peak_rss
        logged = ddp._get_ddp_logging_data()
        applied = {  # read back from the live objects, not from the spec
            "bucket_cap_mb": ddp.bucket_bytes_cap / 2**20,
            "gradient_as_bucket_view": bool(ddp.gradient_as_bucket_view),
            "static_graph": bool(ddp.static_graph),
            "comm_hook": logged.get("comm_hook") or "none",
            "threads": torch.get_num_threads(),
            "num_workers": loader.num_workers,
            "pin_memory": loader.pin_memory,
            "micro_batch": loader.batch_size,
            "accumulation_steps": accum,
            "grad_scaler": scaler.is_enabled(),
        }
        return RankResult(
            rank=spec.rank,
            applied=applied,
            pid=os.getpid(),
            steps=steps * len(windows),
            samples=steps * len(windows) * cfg.micro_batch * accum,
            window_s=sum(window_s),
            windows=windows,
            steps_per_window=steps,
            warmup_steps=len(step_times),
            stop=stop,
            setup_s=setup_s,
            warmup_s=measure_started - warmup_started,
            measure_s=time.perf_counter() - measure_started,
            loss=loss,
            loss_curve=[float(x) for x in curve],
            peak_memory_mb=round(peak_mb, 1),
        )
    finally:
        dist.destroy_process_group()
