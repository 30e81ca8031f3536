"""Opening the study where the search starts: create the run's Optuna study or resume it when
it measured this run's workload, record what it measures (``RunRecord``), close the trials a
dead driver left RUNNING, and queue the baseline when none is measured or in flight.

It sits on the search's floor because it needs the search's sampler (``search.samplers``), the
profile's hardware keys and the ``StudyOpened`` event; what it writes goes through ``record``.
"""

from __future__ import annotations

import warnings
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.core.errors import ConfigError
from autotune.core.events import StudyOpened
from autotune.definition.space import ResolvedSpace
from autotune.definition.studydef import StudyDefinition
from autotune.profile.rules import SECTIONS
from autotune.record import storage as storage_mod
from autotune.record.attrs import RunRecord, save
from autotune.record.study import (
    METRICS,
    baseline_value,
    baselines,
    close_abandoned_trials,
    enqueue_baseline,
    record,
)
from autotune.record.vet import check_study
from autotune.search.samplers import make_sampler

__all__ = ["open_study"]


def open_study(
    name: str,
    url: str,
    d: StudyDefinition,
    space: ResolvedSpace,
    global_batch: int,
    hw: dict[str, Any],
    storage: optuna.storages.BaseStorage | None = None,
) -> tuple[optuna.Study, StudyOpened]:
    """Create the study ``name`` in ``url`` (or in ``storage``, already open), or resume it
    when its objectives and workload are this run's; record workload, hardware and space on
    it; close trials a dead driver left RUNNING; queue a baseline when none is measured or in
    flight."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = storage or storage_mod.open_storage(url)
    sampler = make_sampler(d.sampler, d.seed, space.grid() if d.sampler == "grid" else None)
    workload = _workload(d, space, global_batch)
    directions = [optuna.study.StudyDirection.MAXIMIZE]
    if d.multi_objective:  # and the least peak memory per rank
        directions.append(optuna.study.StudyDirection.MINIMIZE)
    study = _create(name, storage, sampler, directions, space)
    created = study is not None
    if study is None:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
        _check_resumable(study, name, url, d, directions, workload)
        check_study(study, url)
    trials_before = 0 if created else len(study.trials)
    save(
        study,
        RunRecord(
            version=1,
            workload=workload,
            hardware={k: hw.get(k) for k in SECTIONS["hardware"]},
            space=space.to_mapping(),
            left_out=[str(x) for x in space.dropped],
        ),
    )
    closed = close_abandoned_trials(study, storage)
    if baseline_value(study) is None and not any(
        t.state in (TrialState.WAITING, TrialState.RUNNING) for t in baselines(study)
    ):
        enqueue_baseline(study, space)
    opened = StudyOpened(
        name=name,
        created=created,
        trials=trials_before,
        dimensions=list(space.distributions),
        left_out=[str(x) for x in space.dropped],
        closed=closed,
    )
    return study, opened


def _workload(d: StudyDefinition, space: ResolvedSpace, global_batch: int) -> dict[str, Any]:
    """What the study measures: a resumed study must have measured the same."""
    workload = {
        "trainer": d.trainer,
        "options": dict(d.trainer_options),
        "world_size": space.target.world_size,
        "backend": space.target.backend,
        "global_batch": global_batch,
    }
    if d.free_batch:  # another study: its trials measure other global batches
        workload["free_batch"] = True
    return workload


def _create(
    name: str,
    storage: optuna.storages.BaseStorage,
    sampler: optuna.samplers.BaseSampler,
    directions: list[optuna.study.StudyDirection],
    space: ResolvedSpace,
) -> optuna.Study | None:
    """The new study ``name`` with its baseline queued; None when it exists already."""
    if name in {s.study_name for s in optuna.get_all_study_summaries(storage)}:
        return None
    try:
        study = optuna.create_study(
            study_name=name, storage=storage, sampler=sampler, directions=directions
        )
    except optuna.exceptions.DuplicatedStudyError:
        return None  # another driver on the same storage created it a moment ago: join it
    # at once: a driver joining this new study a moment later finds the baseline queued
    enqueue_baseline(study, space)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(METRICS[: len(directions)])
    return study


def _check_resumable(
    study: optuna.Study,
    name: str,
    url: str,
    d: StudyDefinition,
    directions: list[optuna.study.StudyDirection],
    workload: dict[str, Any],
) -> None:
    """ConfigError unless the existing study ``name`` measured what this run measures."""
    if study.directions != directions:
        raise ConfigError(
            f"--study-name {name}: that study in {storage_mod.display_url(url)} was not made "
            f"for --objective {d.objective}; choose another --study-name"
        )
    old = record(study)
    if old is not None and old.workload and old.workload != workload:
        raise ConfigError(
            f"--study-name {name}: that study measured workload {old.workload}, this run asks "
            f"for {workload}; choose another --study-name"
        )
