"""Measuring a configuration: what the search asks of it (``Measurer``), and the real one
(``RayMeasurer``).

``Measurer`` is a Protocol: one run of a configuration, on the placement of the calling
thread, returning its ``TrialResult``. The search (``search.loop``), its objective, the first
measurement, re-validation, ablation and the limit probe ask only that of it. Two
implementations: ``RayMeasurer`` runs the study's workload with its measurement settings on the
run's Ray placement groups (``tuner.run``); ``autotune.replay.simulate.ReplayMeasurer`` draws
recorded runs of a landscape on a simulated clock (the replay benchmark). Both are called in
the driver process; only what ``RayMeasurer`` sends to the ranks crosses to Ray.

``RayMeasurer`` is shared by the objective (search trials, one thread per concurrent trial) and
re-validation (the main thread, always on the first placement group, so its comparisons never
mix node differences). Each search thread says which runner it uses (``use``); a thread that
said nothing uses the first.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import optuna

from autotune.core.config import MeasureSettings, TrialConfig
from autotune.core.errors import ConfigError, FailureReason, TrialFailed
from autotune.core.stats import Interval
from autotune.definition.studydef import StudyDefinition
from autotune.launch.launcher import TrialRunner
from autotune.launch.results import TrialResult
from autotune.record import trial as tr
from autotune.record.study import baseline_trial

__all__ = [
    "BASELINE_TIMEOUT_S",
    "TIMEOUT_FACTOR",
    "TIMEOUT_FLOOR_S",
    "Measurer",
    "Placement",
    "RayMeasurer",
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
    ) -> TrialResult:
        """One run of ``config`` (trial ``number``), pruned below ``incumbent``, with
        ``measure`` (None: the study's settings), its output in ``log_dir``; with ``limit``,
        the limit probe. Raises ``TrialFailed``."""


class RayMeasurer:
    """Measures configurations of ``study``'s workload on ``runners`` (a ``Measurer``)."""

    def __init__(
        self, *, study: optuna.Study, runners: list[TrialRunner], definition: StudyDefinition
    ) -> None:
        self.study = study
        self.runners = runners
        self.d = definition
        self._local = threading.local()  # the runner of the trial this thread runs

    @property
    def can_probe(self) -> bool:
        """Whether the limit probe can run: not in script mode (the user's command is opaque)."""
        return not self.d.command

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
    ) -> TrialResult:
        """One real run of ``config`` (trial ``number``); raises ``TrialFailed``. With
        ``log_dir``, the ranks' output goes there; with ``limit``, it is the limit probe
        (``autotune.rank.limit_probe``). The configuration is checked once more here, whatever
        it came from (``TrialConfig.check``): one out of bounds fails as ``illegal``."""
        try:
            config.check(where=f"trial {number}")
        except ConfigError as e:
            raise TrialFailed(FailureReason.ILLEGAL, str(e)) from None
        if self.d.command:  # script mode: the user's command, in the placement group
            from autotune.script.trial import run_script

            if limit is not None:
                raise ValueError("script mode has no limit probe")
            timeout_s = self.trial_timeout()
            return self.runner.call_in_group(
                run_script,
                wait_s=timeout_s,
                command=list(self.d.command),
                config=config,
                world_size=self.runner.world_size,
                backend=self.runner.backend,
                measure=measure or self.d.measure,
                timeout_s=timeout_s,
                incumbent=incumbent,
                log_dir=None if log_dir is None else str(log_dir),
                cwd=os.getcwd(),  # the command as the user typed it, where they typed it
                env=dict(os.environ),
                max_memory_mb=self.d.max_memory_mb,
            )
        return self.runner.run(
            trial=number,
            trainer=self.d.trainer,
            trainer_options=dict(self.d.trainer_options),
            config=config,
            measure=measure or self.d.measure,
            seed=self.d.seed or 0,
            timeout_s=self.trial_timeout(),
            max_memory_mb=self.d.max_memory_mb,
            incumbent=incumbent,
            log_dir=None if log_dir is None else str(log_dir),
            limit=limit,
        )
