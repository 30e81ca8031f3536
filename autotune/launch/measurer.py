"""Measuring a configuration: what the search asks of it (``Measurer``), and the real one
(``RayMeasurer``).

``Measurer`` is a Protocol: one run of a configuration, on the placement of the calling
thread, returning its ``TrialResult``. The search (``search.loop``), its objective, the first
measurement, re-validation, ablation and the limit probe ask only that of it. Three
implementations: ``RayMeasurer`` runs the study's workload with its measurement settings on the
run's Ray placement groups (``tuner.run``); ``autotune.script.script_measurer.ScriptMeasurer``, a
``RayMeasurer`` too, runs the user's own command there instead (script mode);
``autotune.replay.simulate.ReplayMeasurer`` draws recorded runs of a landscape on a simulated
clock (the replay benchmark). All are called in the driver process; only what the Ray ones send
to the ranks crosses to Ray.

``RayMeasurer`` is shared by the objective (search trials, one thread per concurrent trial) and
re-validation (the main thread, always on the first placement group, so its comparisons never
mix node differences). Each search thread says which runner it uses (``use``); a thread that
said nothing uses the first.

``RayMeasurer`` can also run what the re-validation compares the user's own job with
(``as_is``, ``fresh``): the defaults as the job runs today, without the allocator pin, and any
configuration in new processes. The replay's measurer has no recording of that job, and the
re-validation asks for these two only where the measurer has them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import optuna

from autotune.core import allocator
from autotune.core.config import MeasureSettings, TrialConfig, as_it_runs
from autotune.core.errors import ConfigError, FailureReason, TrialFailed
from autotune.core.rank_io import AFTER_WINDOWS
from autotune.core.results import TrialResult
from autotune.core.stats import Interval
from autotune.core.target import Target
from autotune.definition.studydef import StudyDefinition
from autotune.launch.launcher import TrialRunner
from autotune.record import trial as tr
from autotune.record.study import baseline_trial

__all__ = [
    "BASELINE_TIMEOUT_S",
    "TIMEOUT_FACTOR",
    "TIMEOUT_FLOOR_S",
    "Measurer",
    "Placement",
    "RayMeasurer",
    "checked",
]

#: Timeout of the baseline trial when none is set (later trials derive theirs from it).
BASELINE_TIMEOUT_S = 300.0
#: Floor and multiple of the baseline's wall time for the derived trial timeout.
TIMEOUT_FLOOR_S = 30.0
TIMEOUT_FACTOR = 4.0


class Placement(Protocol):
    """Where a search thread's trials run: one placement group (``launcher.TrialRunner``), or
    the replay's stand-in for one."""

    def ensure_placed(self) -> None:
        """Before each trial: wait until the placement is there again after a node loss, or
        stop."""


class Measurer(Protocol):
    """What the search asks of a measurement (module doc)."""

    @property
    def runners(self) -> Sequence[Placement]:
        """The placements trials run on: one search thread each."""

    @property
    def can_probe(self) -> bool:
        """Whether the limit probe (``limit=``) can run."""

    @property
    def folds_probe(self) -> bool:
        """Whether a run takes the limit probe after its own windows (``limit=`` with
        ``core.rank_io.AFTER_WINDOWS``): the baseline trial's first measurement."""

    @property
    def keeps_sessions(self) -> bool:
        """Whether a re-measurement run asked to (``keep=``) measures on the session kept
        from its configuration's last run (``core.rank_io.RankSpec.keep``)."""

    def use(self, runner: Placement) -> None:
        """The calling thread's trials run on ``runner`` (one of ``runners``) from now on."""

    def abort(self) -> None:
        """End every running trial now (Ctrl-C, from the main thread)."""

    def __call__(
        self,
        number: int,
        config: TrialConfig,
        incumbent: Interval | None = None,
        measure: MeasureSettings | None = None,
        log_dir: Path | None = None,
        limit: dict[str, Any] | None = None,
        trace: Path | None = None,
        keep: bool = False,
    ) -> TrialResult:
        """One run of ``config`` (trial ``number``), pruned below ``incumbent``, with
        ``measure`` (None: the study's settings), its output in ``log_dir``; with ``limit``,
        the limit probe; with ``trace``, a Chrome trace of a few DDP steps written there after
        the timed windows (``RankSpec.trace``; a measurer that cannot take one ignores it);
        with ``keep``, a re-measurement run on the session kept from this configuration's last
        such run, if any, kept for its next (``RankSpec.keep``; a measurer that cannot keep
        one builds it anew). Raises ``TrialFailed``."""


def checked(number: int, config: TrialConfig) -> None:
    """The one check of a configuration about to run, whatever it came from
    (``TrialConfig.check``): one out of bounds fails trial ``number`` as ``illegal``."""
    try:
        config.check(where=f"trial {number}")
    except ConfigError as e:
        raise TrialFailed(FailureReason.ILLEGAL, str(e)) from None


class RayMeasurer:
    """Measures configurations of ``study``'s workload on ``runners`` (a ``Measurer``)."""

    def __init__(
        self,
        *,
        study: optuna.Study,
        runners: list[TrialRunner],
        definition: StudyDefinition,
        target: Target | None = None,
    ) -> None:
        self.study = study
        self.runners = runners
        self.d = definition
        #: What the space was resolved against: ranks per node, for the threads torchrun
        #: gives the job as it runs today (``as_is``); None: taken as several.
        self.target = target
        self._local = threading.local()  # the runner of the trial this thread runs

    def as_is_reason(self) -> str | None:
        """Why the user's job as it runs today cannot be measured here; None when it can.
        On a GPU the pin acts on host memory only and every arm of that comparison would need
        new CUDA processes (10-12 s each, docs/gpu.md); off glibc (2.33 or newer) there is no
        pin to leave out, and no way to see that a process runs without it."""
        if self.runner.backend == "nccl" or (self.target and self.target.device == "cuda"):
            return (
                "not measured on a GPU: the allocator pin acts on host memory only, and "
                "each run would need new CUDA processes"
            )
        if not allocator.readable():
            return (
                "the C library is not glibc 2.33 or newer: there is no allocator pin to leave out"
            )
        if allocator.pinned_by_env(os.environ):
            set_ = " and ".join(k for k in allocator.ENV if os.environ.get(k, "").strip())
            return (
                f"not measured: this shell sets {set_} (as `autotune env` does), which every "
                "process of the run inherits; unset it to measure your job without the pin"
            )
        return None

    def as_is(self, config: TrialConfig) -> TrialConfig | str:
        """The defaults' ``config`` as the user's job runs it today (``config.as_it_runs``:
        no allocator pin, torchrun's threads, the user's own ``OMP_NUM_THREADS``), or why it
        cannot be measured here (``as_is_reason``)."""
        reason = self.as_is_reason()
        if reason is not None:
            return reason
        per_node = None if self.target is None else self.target.ranks_per_node
        return as_it_runs(config, os.environ, per_node)

    def fresh(
        self, number: int, config: TrialConfig, *, measure: MeasureSettings, pin: bool = True
    ) -> TrialResult:
        """One run of ``config`` in new rank processes, which pin glibc's allocator unless
        ``pin`` is False (the job as it runs today)."""
        checked(number, config)
        return self.runner.run(
            trial=number,
            trainer=self.d.trainer,
            trainer_options=dict(self.d.trainer_options),
            config=config,
            measure=measure,
            seed=self.d.seed or 0,
            timeout_s=self.trial_timeout(),
            max_memory_mb=self.d.max_memory_mb,
            fresh=True,
            pin=pin,
        )

    @property
    def can_probe(self) -> bool:
        """Whether the limit probe can run."""
        return True

    @property
    def folds_probe(self) -> bool:
        """Whether a run takes the limit probe after its own windows: the study's ranks do
        (``rank.measure``)."""
        return True

    @property
    def keeps_sessions(self) -> bool:
        """Whether re-measurement runs keep their sessions: the study's ranks do
        (``rank.kept``)."""
        return True

    @property
    def runner(self) -> TrialRunner:
        """The runner of the calling thread (the first one when it chose none)."""
        return getattr(self._local, "runner", self.runners[0])

    def use(self, runner: Placement) -> None:
        """The calling thread's trials run on ``runner`` (one of ``runners``) from now on."""
        self._local.runner = runner

    def abort(self) -> None:
        """End every running trial now (Ctrl-C, from the main thread): each fails at once
        instead of running to its end."""
        for r in self.runners:
            r.abort()

    def trial_timeout(self) -> float:
        """``--trial-timeout``, else 4x the baseline trial's wall time (at least 30 s)."""
        if self.d.trial_timeout_s is not None:
            return self.d.trial_timeout_s
        base = baseline_trial(self.study)
        wall_s = None if base is None else tr.measured(base, "wall_s")
        if wall_s is None:
            return BASELINE_TIMEOUT_S
        return max(TIMEOUT_FLOOR_S, TIMEOUT_FACTOR * wall_s)

    def __call__(
        self,
        number: int,
        config: TrialConfig,
        incumbent: Interval | None = None,
        measure: MeasureSettings | None = None,
        log_dir: Path | None = None,
        limit: dict[str, Any] | None = None,
        trace: Path | None = None,
        keep: bool = False,
    ) -> TrialResult:
        """One real run of ``config`` (trial ``number``); raises ``TrialFailed``. With
        ``log_dir``, the ranks' output goes there; with ``limit``, it is the limit probe
        (``autotune.rank.limit_probe``); with ``trace``, rank 0 writes a Chrome trace of a few
        DDP steps there after the windows. The configuration is checked once more here, whatever
        it came from (``checked``): one out of bounds fails as ``illegal``. A run that takes the
        limit probe after its windows (``AFTER_WINDOWS``) has twice the trial timeout: the
        windows and the probe each within it, as when the probe was a run of its own."""
        checked(number, config)
        return self.runner.run(
            trial=number,
            trainer=self.d.trainer,
            trainer_options=dict(self.d.trainer_options),
            config=config,
            measure=measure or self.d.measure,
            seed=self.d.seed or 0,
            timeout_s=self.trial_timeout() * (2 if limit and limit.get(AFTER_WINDOWS) else 1),
            max_memory_mb=self.d.max_memory_mb,
            incumbent=incumbent,
            log_dir=None if log_dir is None else str(log_dir),
            limit=limit,
            trace=None if trace is None else str(trace),
            keep=keep,
        )
