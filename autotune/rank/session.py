"""What one rank trains with in one trial: the process group, the workload wrapped in DDP with the
trial's settings, its DataLoader, optimizer and scaler, and one training step.

``open_session(spec, store)`` builds them in the order a torchrun script does (torchrun's
variables, threads and precision flags, process group, model, DDP with the trial's kwargs and
comm hook, DataLoader with the trial's kwargs) and destroys the process group on every path
out. ``Session.step`` is one optimizer step: ``accumulation_steps`` micro-steps, all-reduce on
the last only. The measurement (``autotune.rank.measure``) and the limit probe
(``autotune.rank.limit_probe``) both train through it, so what they time is the same step.

``Session.step(phases)`` also times its phases (data, forward, backward, optimizer): on the host
clock on a CPU, with CUDA events at each edge on a GPU (read once the step is done, so the host
still runs ahead of the device within the step); without ``phases`` it times nothing, so a timed
window is not slowed by it. ``communicate=False`` runs the same step on the bare model
(``ddp.module``): DDP's hooks see no forward of DDP and reduce nothing, so the step is the
rank's compute alone.

A compiled configuration (``ddp.compile``, ``core.apply.compile_model``) compiles in its first
steps. ``open_session`` runs them before it hands the session over (``Session.compile_warmup``):
steps until one compiles no new graph on any rank, so the caller's warm-up settles on compiled
steps and its windows time no compilation. Those steps are training steps like any other (their
losses start the numerics curve) and their seconds are the trial's, charged to the budget with
the rest of its wall time. ``Session.compile_facts`` says what compiled, and whether anything
compiled after that (``late_graphs``): the rank reports it with its result.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from autotune.core import apply, compat
from autotune.core.compiling import NONE
from autotune.core.numerics import CURVE_STEPS
from autotune.core.rank_io import MemoryLimitExceeded, RankSpec
from autotune.rank.env import torchrun_env

__all__ = [
    "PHASES",
    "Session",
    "build",
    "init_group",
    "is_compiled",
    "listening_store",
    "open_session",
    "prepare_process",
    "reset_compiler",
    "rss_mb",
]

#: Steps a compiled configuration runs before the session is handed over: at least the first,
#: until one compiles nothing new on any rank, at most the last (a model that keeps recompiling
#: goes on, its ``late_graphs`` say so).
COMPILE_MIN_STEPS = 2
COMPILE_MAX_STEPS = 10

#: The phases ``Session.step`` times, in the order they happen.
PHASES = ("data", "forward", "backward", "optimizer")

#: The last trial's process group, kept alive until the next trial starts. Gloo's worker
#: threads may still be freeing the last collective's tensors (which takes the GIL) when a
#: trial returns; a ProcessGroupGloo freed at that moment from Python, GIL held, joins those
#: threads and deadlocks (seen on this machine under load). Between trials the process idles
#: with the GIL free, so the threads are done by the time the next trial lets the group go.
LAST_GROUP: list[Any] = []


def rss_mb() -> float:
    """Resident memory of this process now, in MiB (``/proc/self/statm``). Where there is no
    ``/proc``, the lifetime peak instead (Linux reports KiB): never lower than the truth."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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
            host,
            sock.getsockname()[1],
            is_master=True,
            wait_for_workers=False,
            timeout=timeout or timedelta(seconds=300),
            master_listen_fd=sock.fileno(),
        )
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns the descriptor now, and closes it when it goes
    return store


def _batches(loader: Any, sampler: Any) -> Iterator[Any]:
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


@dataclass(eq=False)
class _PhaseClock:
    """Adds each phase of one step to ``phases`` (module doc): on the host clock on a CPU, from
    CUDA events read once the step is done (``finish``) on a GPU; nothing without ``phases``."""

    phases: dict[str, float] | None
    cuda: bool
    last: float = 0.0
    events: list[tuple[str, Any]] = field(default_factory=list)

    @classmethod
    def start(cls, phases: dict[str, float] | None, cuda: bool) -> _PhaseClock:
        clock = cls(phases, cuda, last=time.perf_counter() if phases is not None else 0.0)
        # On a GPU each phase edge is an event on the stream, read after the step: a host
        # synchronisation at every edge would stop the host from running ahead of the device
        # (it cost a third of an H100 transformer's throughput).
        if phases is not None and cuda:
            clock._record("")
        return clock

    def _record(self, phase: str) -> None:
        import torch

        self.events.append((phase, torch.cuda.Event(enable_timing=True)))
        self.events[-1][1].record()

    def mark(self, phase: str) -> None:
        """``phase`` ends now."""
        if self.phases is None:
            return
        if self.cuda:
            self._record(phase)
            return
        now = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self.last
        self.last = now

    def finish(self) -> None:
        """Read the step's events into ``phases`` (on a GPU; nothing to do on a CPU)."""
        if self.events and self.phases is not None:  # events: timing phases on a GPU
            self.events[-1][1].synchronize()
            for (_, start), (phase, end) in zip(self.events, self.events[1:], strict=False):
                self.phases[phase] = self.phases.get(phase, 0.0) + start.elapsed_time(end) / 1e3


@dataclass(eq=False, kw_only=True)
class Session:
    """One rank's training objects for one trial (built by ``open_session``)."""

    spec: RankSpec
    device: Any
    workload: Any
    ddp: Any
    optimizer: Any
    loader: Any
    batches: Iterator[Any]
    scaler: Any
    peak_rss: float = 0.0
    """This trial's peak RSS (MiB), sampled where memory use peaks."""
    curve: list[Any] = field(default_factory=list)
    """The first steps' losses (tensors), for the numerics guard."""
    compile_steps: int = 0
    """Steps ``compile_warmup`` ran (0: the model is not compiled)."""
    compile_s: float = 0.0
    """Their seconds (the slowest rank's)."""
    graphs: list[int | None] = field(default_factory=list)
    """Dynamo's graph count (``compat.compiled_graphs``) before and after ``compile_warmup``
    (after ``rearm``'s warm-up, for a kept session's later run)."""
    others_mb: float = 0.0
    """Memory held by the sessions kept beside this one when it was built (``rank.kept``): not
    this run's, so left out of its peak and of the ``--max-memory`` check."""
    runs: int = 1
    """The runs measured on this session (more than 1: kept, ``rank.kept``)."""

    @property
    def compile_mode(self) -> str:
        return str(self.spec.config.ddp.get("compile", NONE))

    def compile_warmup(self) -> None:
        """A compiled configuration's first steps (module doc): from ``COMPILE_MIN_STEPS`` on,
        until a step compiled no new graph on any rank (the slowest rank's count decides, so
        every rank runs as many), at most ``COMPILE_MAX_STEPS``. Nothing when not compiled."""
        if self.compile_mode == NONE:
            return
        self.sync()
        started = time.perf_counter()
        before = seen = compat.compiled_graphs()
        while self.compile_steps < COMPILE_MAX_STEPS:
            self.step()
            self.compile_steps += 1
            now = compat.compiled_graphs()
            grew = self.slowest([float(now is not None and seen is not None and now > seen)])[0]
            seen = now
            if self.compile_steps >= COMPILE_MIN_STEPS and not grew:
                break
        self.sync()
        self.compile_s = self.slowest([time.perf_counter() - started])[0]
        self.graphs = [before, seen]

    def compile_facts(self) -> dict[str, Any]:
        """What compiled: the mode; for a compiled model, the graphs Dynamo captured in
        ``compile_warmup`` (``graphs``: more than 0 when the model was compiled), those it
        captured after it until now (``late_graphs``: 0 when nothing compiled in the caller's
        warm-up or windows; None where torch has no counter), its steps and seconds."""
        facts: dict[str, Any] = {"mode": self.compile_mode}
        if self.compile_mode == NONE:
            return facts
        before, ready = self.graphs or [None, None]
        now = compat.compiled_graphs()
        known = before is not None and ready is not None and now is not None
        facts["graphs"] = ready - before if known else None
        facts["late_graphs"] = now - ready if known else None
        facts["steps"] = self.compile_steps
        facts["seconds"] = round(self.compile_s, 3)
        return facts

    def rearm(self, spec: RankSpec) -> None:
        """Ready a kept session (``rank.kept``) for another run of its configuration: that
        run's spec (its trial, timeout, output), its own peak memory from now on, and
        ``late_graphs`` counted from now on."""
        self.spec = spec
        self.runs += 1
        self.peak_rss = rss_mb()
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
        if self.graphs:
            self.graphs = [self.graphs[0], compat.compiled_graphs()]

    @property
    def own_peak_mb(self) -> float:
        """This run's peak memory (MiB): the device's on a GPU, else the process's RSS; less
        what the sessions kept beside it hold (``others_mb``)."""
        if self.cuda:
            import torch

            peak = torch.cuda.max_memory_allocated(self.device) / 2**20
        else:
            peak = self.peak_rss
        return max(peak - self.others_mb, 0.0)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def samples_per_step(self) -> int:
        """Samples of one optimizer step over all ranks."""
        cfg = self.spec.config
        return cfg.micro_batch * cfg.accumulation_steps * self.spec.world_size

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)

    def slowest(self, values: list[float]) -> list[float]:
        """Each value's maximum over the ranks: every rank gets the same list, so every rank
        takes the same decision from it (settled, stop, prune) without another message."""
        import torch
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [float(v) for v in t.tolist()]

    def step(self, phases: dict[str, float] | None = None, *, communicate: bool = True) -> Any:
        """One optimizer step; its loss (a tensor). With ``phases``, each phase's seconds are
        added to it (module doc)."""
        import torch

        model = self.ddp if communicate else self.ddp.module
        clock = _PhaseClock.start(phases, self.cuda)
        total = torch.zeros((), device=self.device)
        for micro in range(self.spec.config.accumulation_steps):
            total += self._micro_step(micro, model, clock, communicate=communicate)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.peak_rss = max(self.peak_rss, rss_mb())  # params, grads, optimizer state, all alive
        self.optimizer.zero_grad(set_to_none=True)
        clock.mark("optimizer")
        clock.finish()
        if len(self.curve) < CURVE_STEPS:
            self.curve.append(total)
        max_mb = self.spec.max_memory_mb
        own_mb = self.peak_rss - self.others_mb
        if max_mb is not None and own_mb > max_mb:
            raise MemoryLimitExceeded(
                f"peak host memory {own_mb:.0f} MiB is over --max-memory {max_mb:.0f} MiB"
            )
        return total

    def _micro_step(self, micro: int, model: Any, clock: _PhaseClock, *, communicate: bool) -> Any:
        """Forward and backward of micro-step ``micro`` through ``model`` (DDP, or the bare
        model); its share of the step's loss (a detached float tensor)."""
        cfg = self.spec.config
        accum = cfg.accumulation_steps
        x, y = next(self.batches)
        x = x.to(self.device, non_blocking=True)
        y = y.to(self.device, non_blocking=True)
        clock.mark("data")
        # All-reduce only on the last micro-step.
        reduce = (
            apply.micro_step(self.ddp, micro, accum) if communicate else contextlib.nullcontext()
        )
        with reduce:
            with apply.autocast(cfg.precision, self.device.type):
                loss = self.workload.loss(model(x), y) / accum
            self.peak_rss = max(self.peak_rss, rss_mb())  # activations held for backward
            clock.mark("forward")
            self.scaler.scale(loss).backward()
            clock.mark("backward")
        return loss.detach().float()


@contextlib.contextmanager
def open_session(spec: RankSpec, store: Any) -> Iterator[Session]:
    """The rank's process group and training objects for ``spec``; the process group is
    destroyed on the way out, whatever happened. ``store``: rank 0's ``TCPStore``, already
    listening at ``master_port`` (others connect to it; without one, rank 0 starts it here)."""
    import torch.distributed as dist

    device = prepare_process(spec)
    init_group(spec, store)
    compiled = is_compiled(spec)
    try:
        if compiled:  # an earlier trial's graphs: dynamo allows 8 per code object, then eager
            reset_compiler()
        yield build(spec, device)
    finally:
        if compiled:  # its compiled code holds this trial's model
            reset_compiler()
        dist.destroy_process_group()


def is_compiled(spec: RankSpec) -> bool:
    return spec.config.ddp.get("compile", NONE) != NONE


def reset_compiler() -> None:
    import torch

    torch.compiler.reset()


def prepare_process(spec: RankSpec) -> Any:
    """Set this process up as torchrun would for ``spec``: its variables, threads, device and
    precision flags, before any of the trainer's code runs; the rank's device."""
    import torch

    cfg = spec.config
    # torchrun's variables, before any of the trainer's code runs
    os.environ.update(
        torchrun_env(
            spec.rank,
            spec.world_size,
            spec.local_rank,
            spec.local_world_size,
            spec.backend,
            spec.master_addr,
            spec.master_port,
        )
    )
    apply.set_threads(cfg.threads)
    cuda = spec.backend == "nccl"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.cuda.reset_peak_memory_stats(device)
    apply.set_tf32(cfg.precision == "tf32")
    return device


def init_group(spec: RankSpec, store: Any) -> None:
    """Join the trial's process group through rank 0's ``store`` (started or connected to
    here when None), and keep it in ``LAST_GROUP``."""
    import torch.distributed as dist

    timeout = timedelta(seconds=spec.timeout_s)
    if store is None and spec.rank == 0:  # RankActor.address starts it ahead, else here
        store = listening_store(spec.master_addr, spec.master_port, timeout)
    elif store is None:  # ranks > 0 connect to rank 0's store
        store = dist.TCPStore(
            spec.master_addr,
            spec.master_port,
            spec.world_size,
            is_master=False,
            timeout=timeout,
            wait_for_workers=False,
        )
    store.set_timeout(timeout)
    dist.init_process_group(
        spec.backend, store=store, rank=spec.rank, world_size=spec.world_size, timeout=timeout
    )
    LAST_GROUP.append(dist.group.WORLD)


def build(spec: RankSpec, device: Any) -> Session:
    """The trainer's workload on ``device``, wrapped in DDP with the trial's settings, its
    optimizer, DataLoader and scaler; a compiled model's first steps run
    (``Session.compile_warmup``). On the process group made by ``init_group``."""
    session = _build(spec, device)
    session.compile_warmup()
    return session


def _build(spec: RankSpec, device: Any) -> Session:
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    from autotune.rank.workload import load_workload

    cfg = spec.config
    wl = load_workload(spec.trainer, spec.trainer_options)
    torch.manual_seed(spec.seed)
    model = wl.model().to(device)
    cuda = spec.backend == "nccl"
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
    return Session(
        spec=spec,
        device=device,
        workload=wl,
        ddp=ddp,
        optimizer=optimizer,
        loader=loader,
        batches=_batches(loader, sampler),
        scaler=apply.grad_scaler(cfg.precision, device.type),
    )
