"""Script mode's ``Measurer``: the user's own command, on the run's placement groups.

``ScriptMeasurer`` is a ``launch.measurer.RayMeasurer`` whose runs start the user's torchrun
command on the placement group's nodes (``script.nodes.run_on_nodes``) instead of the study's
trainer in warm rank actors; the limit probe's place is taken by the script's first measurement
(``script.first_measurement.first_measurement``). Everything else (the placement of each search
thread, the trial timeout, what the job as it runs today is) is the Ray measurer's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna

from autotune.core.config import MeasureSettings, TrialConfig
from autotune.core.results import TrialResult
from autotune.core.stats import Interval
from autotune.core.target import Target
from autotune.definition.studydef import StudyDefinition
from autotune.launch.launcher import TrialRunner
from autotune.launch.measurer import RayMeasurer, checked
from autotune.script.first_measurement import first_measurement
from autotune.script.nodes import Files, run_on_nodes

__all__ = ["ScriptMeasurer"]


class ScriptMeasurer(RayMeasurer):
    """Measures the user's command ``definition.command`` on ``runners``; ``files`` says where
    the nodes find the job's files (``script.nodes.check_files``)."""

    def __init__(
        self,
        *,
        study: optuna.Study,
        runners: list[TrialRunner],
        definition: StudyDefinition,
        files: Files,
        target: Target | None = None,
    ) -> None:
        super().__init__(study=study, runners=runners, definition=definition, target=target)
        self.files = files

    @property
    def folds_probe(self) -> bool:
        """No: the script's first measurement is a run of its own, whose steps are timed phase
        by phase (``script.first_measurement``), which its baseline's windows must not be."""
        return False

    @property
    def keeps_sessions(self) -> bool:
        """No: every run of the user's command is a new torchrun."""
        return False

    def fresh(
        self, number: int, config: TrialConfig, *, measure: MeasureSettings, pin: bool = True
    ) -> TrialResult:
        """One run of ``config``: the user's command starts afresh for every run anyway, and
        its allocator is pinned only by the configuration's environment, which ``as_is``
        leaves without the pin (``pin`` changes nothing here)."""
        return self(number, config, measure=measure)

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
        """One run of the user's command with ``config`` (trial ``number``) on the calling
        thread's nodes; with ``limit``, the first measurement. Neither ``trace`` nor ``keep``
        is taken: the script's steps are its own, not a session's, and each run is a new
        torchrun (no run asks for a trace in script mode). Raises ``TrialFailed``."""
        checked(number, config)
        common = dict(
            command=self.d.command,
            files=self.files,
            config=config,
            measure=measure or self.d.measure,
            timeout_s=self.trial_timeout(),
            log_dir=None if log_dir is None else str(log_dir),
        )
        if limit is not None:
            return first_measurement(self.runner, **common)
        return run_on_nodes(
            self.runner,
            **common,
            incumbent=incumbent,
            max_memory_mb=self.d.max_memory_mb,
        )
