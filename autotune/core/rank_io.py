"""What a rank is given and what it gives back: the types that cross from the driver to a rank
process and back (through Ray), so that neither side imports the other's modules for them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotune.core.config import MeasureSettings, TrialConfig
from autotune.core.stats import Interval

__all__ = [
    "AFTER_WINDOWS",
    "KEPT_CALL_S",
    "REARM_STEPS",
    "MemoryLimitExceeded",
    "NonFiniteLoss",
    "RankResult",
    "RankSpec",
    "kept_overhead_s",
]

#: The limit probe's setting (``RankSpec.limit``) that takes it after the trial's own windows,
#: in the same session, instead of in their place: no set-up and warm-up of its own.
AFTER_WINDOWS = "after_windows"
#: Steps a run on a kept session (``RankSpec.keep``, ``autotune.rank.kept``) discards before
#: its windows: the caches the other configurations' runs took in between.
REARM_STEPS = 1
#: Seconds of such a run outside that step and its windows: the call and the ranks' agreement
#: to start (``bench/kept_sessions.py`` on the default workload: 0.02-0.03).
KEPT_CALL_S = 0.03


def kept_overhead_s(step_s: float) -> float:
    """Seconds a run on a kept session spends outside its windows, at ``step_s`` a step: its
    discarded steps and the call (the budget's estimate, the replay's charge)."""
    return REARM_STEPS * step_s + KEPT_CALL_S


class MemoryLimitExceeded(MemoryError):
    """The rank's peak resident memory went over ``--max-memory``."""


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
    incumbent: Interval | None = None
    """The best trial's throughput interval: prune below it."""
    local_rank: int = 0
    """This rank's index among the trial's ranks on its node."""
    local_world_size: int = 1
    """The trial's ranks on this rank's node."""
    log_dir: str | None = None
    """Where this rank's output goes for the trial (``rank-N.log``): its stdout and stderr, its
    DataLoader workers' and NCCL's. None: where the process's output always goes (Ray's)."""
    limit: dict[str, Any] | None = None
    """The limit probe's settings (``autotune.rank.limit_probe.probe``): after the warm-up, time the
    step's phases with and without communication and the all-reduce alone, instead of the
    timed windows; with ``AFTER_WINDOWS`` set in them, after the trial's own windows (the
    baseline's first measurement, ``search.first_look``). None: a trial."""
    trace: str | None = None
    """Where rank 0 writes a Chrome trace of ``PROFILED_STEPS`` DDP steps taken after the timed
    windows (``autotune.rank.limit_probe.trace_steps``), outside every timed figure. None: no
    trace."""
    keep: str | None = None
    """The key of this configuration's session, kept in the rank's process for its next run
    (``autotune.rank.kept``): a re-measurement run, without a limit probe or trace. None: a
    session of its own, gone when the run ends (and every kept one let go before it)."""


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or infinite during the trial."""


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
    """Why the windows stopped: ``converged``, ``cap`` or ``pruned`` (``autotune.core.stats``), or
    ``limit`` for the limit probe (whose windows are single steps)."""
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
    session_runs: int = 1
    """Runs measured on this rank's session, this one included: more than 1 where the session
    was kept from an earlier run of the configuration (``RankSpec.keep``)."""
    node_ip: str | None = None
    """The address of the node the rank ran on."""
    limit: dict[str, Any] | None = None
    """What the limit probe measured (the slowest rank's; every rank holds the same). After
    the windows (``AFTER_WINDOWS``) a probe that raised holds ``{"failed": its error}``."""
    probe_s: float = 0.0
    """Seconds of a limit probe taken after the windows (``AFTER_WINDOWS``), outside every
    other figure; 0: none."""
