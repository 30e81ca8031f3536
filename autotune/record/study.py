"""What autotune stores on an Optuna study, and how to read it back: the only module that knows
the study's attribute layout.

Study user attributes:

* ``autotune``: the run's record (``version``, ``workload``, ``hardware``, ``space``,
  ``left_out``); a study without it is not an autotune study;
* ``validation``: the last re-validation (``validation.revalidate``).

Trial user attributes: ``baseline`` (True on a baseline trial), ``driver`` (who runs it),
``config`` (the ``TrialConfig``), the measurement (``measurement_attrs``), and on FAIL trials
``reason`` (a ``FailureReason`` value) and ``reason_detail``.

Readers may run in any thread; writers write through Optuna's storage, which serialises them.
"""

from __future__ import annotations

import math
import os
import socket
import warnings
from collections import Counter
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.core.errors import ConfigError, FailureReason, TrialFailed
from autotune.core.stats import Interval
from autotune.definition.space import ResolvedSpace
from autotune.definition.studydef import StudyDefinition
from autotune.launch.results import TrialResult
from autotune.profile.rules import SECTIONS
from autotune.record import storage as storage_mod
from autotune.report.events import StudyOpened
from autotune.search.samplers import make_sampler

__all__ = [
    "ATTR",
    "DRIVER",
    "METRICS",
    "anchored_speedup",
    "anchored_speedups",
    "anchors",
    "baseline_trial",
    "baseline_value",
    "enqueue_anchor",
    "nearest_anchor",
    "baselines",
    "close_abandoned_trials",
    "complete",
    "counts",
    "driver_alive",
    "driver_identity",
    "enqueue_baseline",
    "failure_reasons",
    "incumbent",
    "is_autotune_study",
    "measurement_attrs",
    "open_study",
    "record",
    "record_failure",
    "rel_noise",
    "tag",
    "throughput",
    "validation",
]

#: Study user attribute holding autotune's own record of the study.
ATTR = "autotune"
#: The objectives' names, in Optuna's order: samples/s (maximised), then with
#: ``--objective throughput,memory`` the largest peak memory of a rank (minimised).
METRICS = ["samples_per_s", "peak_memory_mb"]


def _boot_id() -> str:
    """This boot of this machine (Linux), or '' where the kernel does not say."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _start_time(pid: int | str) -> str | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/PID/stat`` field 22);
    None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # fields after "pid (comm)"; 22nd overall


def driver_identity(pid: int | None = None) -> str:
    """``host:boot_id:pid:start_time``: two drivers never share it (not on two machines with
    one host name, which differ in boot id, nor a reused pid, which differs in start time)."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{_boot_id()}:{pid}:{_start_time(pid) or ''}"


#: Which driver runs a trial (user attribute ``driver``): lets a resumed run on the same
#: machine close at once the trials of a driver that died (``kill -9``), without waiting for
#: Optuna's heartbeat grace period.
DRIVER = driver_identity()


# -- reading ---------------------------------------------------------------------------------


def record(study: optuna.Study) -> dict[str, Any]:
    """The study's autotune record (empty when it is not an autotune study)."""
    return dict(study.user_attrs.get(ATTR) or {})


def is_autotune_study(study: optuna.Study) -> bool:
    return bool(study.user_attrs.get(ATTR))


def validation(study: optuna.Study) -> dict[str, Any] | None:
    """The last re-validation's record, if any."""
    return study.user_attrs.get("validation")


def complete(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def throughput(t: FrozenTrial) -> float:
    """A COMPLETE trial's samples/s (its first objective, whatever the study's objectives)."""
    return t.values[0]


def rel_noise(t: FrozenTrial) -> float:
    """The relative half-width of a trial's 95 % interval (0 when it has none)."""
    interval = t.user_attrs.get("interval")
    v = interval.get("rel_half_width") if isinstance(interval, dict) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def baseline_trial(study: optuna.Study) -> FrozenTrial | None:
    """The measured baseline (the first COMPLETE trial marked ``baseline``)."""
    for t in complete(study):
        if t.user_attrs.get("baseline"):
            return t
    return None


def baselines(study: optuna.Study) -> list[FrozenTrial]:
    """Every baseline trial of the study, in any state."""
    return [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("baseline")]


def baseline_value(study: optuna.Study) -> float | None:
    t = baseline_trial(study)
    return None if t is None else throughput(t)


def anchors(study: optuna.Study) -> list[FrozenTrial]:
    """Every measured run of the defaults: the baseline and the re-anchoring runs after it."""
    return [t for t in complete(study) if t.user_attrs.get("baseline")]


def nearest_anchor(study: optuna.Study, t: FrozenTrial) -> FrozenTrial | None:
    """The run of the defaults measured nearest in time to ``t``: the machine drifts, so a
    trial is compared with the defaults as they ran around it. Nearness is counted in trials
    (numbers follow start order, concurrent trials included; trials take similar times), the
    earlier of two equally near: the same study always gives the same answer."""
    return _nearest(anchors(study), t)


def _nearest(runs: list[FrozenTrial], t: FrozenTrial) -> FrozenTrial | None:
    return min(runs, key=lambda a: (abs(a.number - t.number), a.number)) if runs else None


def anchored_speedup(study: optuna.Study, t: FrozenTrial) -> float | None:
    """``t``'s throughput over that of the run of the defaults nearest to it in time."""
    a = nearest_anchor(study, t)
    return None if a is None else throughput(t) / throughput(a)


def anchored_speedups(done: list[FrozenTrial]) -> dict[int, float]:
    """``anchored_speedup`` of each of the COMPLETE trials ``done`` (one read of a study),
    by number."""
    runs = [t for t in done if t.user_attrs.get("baseline")]
    if not runs:
        return {}
    return {t.number: throughput(t) / throughput(_nearest(runs, t)) for t in done}


def enqueue_anchor(study: optuna.Study, space: ResolvedSpace, why: str) -> None:
    """Queue another run of the defaults (a baseline run after the first: ``anchor``)."""
    study.enqueue_trial(space.baseline_params(), user_attrs={"baseline": True, "anchor": why})


def counts(study: optuna.Study) -> dict[str, int]:
    """Trials by state: complete, failed, pruned, and their total."""
    out = {"complete": 0, "failed": 0, "pruned": 0}
    key = {TrialState.COMPLETE: "complete", TrialState.FAIL: "failed", TrialState.PRUNED: "pruned"}
    for t in study.get_trials(deepcopy=False):
        if t.state in key:
            out[key[t.state]] += 1
    out["total"] = sum(out.values())
    return out


def failure_reasons(study: optuna.Study) -> Counter[str]:
    """How many FAIL trials ended with each reason."""
    return Counter(
        t.user_attrs.get("reason", "unknown")
        for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
    )


def incumbent(study: optuna.Study) -> Interval | None:
    """The best COMPLETE trial's throughput interval: a trial clearly below it is pruned."""
    done = complete(study)
    if not done:
        return None
    best = max(done, key=throughput)
    if "interval" not in best.user_attrs:
        return None  # measured by an autotune without intervals
    return Interval.from_dict(best.user_attrs["interval"])


def tag(trial: optuna.Trial | FrozenTrial) -> str:
    """How the log names a trial: ``baseline``, ``anchor N`` (the defaults again, trial N) or
    ``trial N``."""
    if trial.user_attrs.get("anchor"):
        return f"anchor {trial.number}"
    return "baseline" if trial.user_attrs.get("baseline") else f"trial {trial.number}"


# -- writing ---------------------------------------------------------------------------------


def record_failure(trial: optuna.Trial, failure: TrialFailed) -> None:
    """Why ``trial`` fails: attributes ``reason`` and ``reason_detail``."""
    trial.set_user_attr("reason", str(failure.reason))
    trial.set_user_attr("reason_detail", failure.detail)


def measurement_attrs(
    result: TrialResult, speedup: float | None, *, tokens_per_sample: int | None = None
) -> dict[str, Any]:
    """The trial attributes of a measurement (``speedup`` left out when None: another
    driver's baseline is not measured yet)."""
    ranks = result.ranks
    attrs: dict[str, Any] = {
        "throughput": round(result.throughput, 3),
        "interval": result.interval.to_dict(),
        "windows": [round(w, 2) for w in result.windows],
        "stop": ranks[0].stop,
        "warmup_steps": ranks[0].warmup_steps,
        "step_time_s": round(result.step_time_s, 6),
        "peak_memory_mb": [r.peak_memory_mb for r in ranks],
        "steps": ranks[0].steps,
        "window_s": round(result.window_s, 3),
        "wall_s": round(result.wall_s, 3),
        "overhead_s": round(result.overhead_s, 3),
        # where the overhead went, on the slowest rank: warm-up steps, and the rest before
        # them (process group, model, DDP, DataLoader; process start when fresh)
        "warmup_s": round(result.warmup_s, 3),
        "init_s": round(result.init_s, 3),
        "loss": ranks[0].loss if math.isfinite(ranks[0].loss) else None,  # None: not reported
        "nodes": [r.node_ip for r in ranks],  # where each rank ran, in rank order
    }
    if speedup is not None:
        attrs["speedup"] = round(speedup, 4)
    if tokens_per_sample:
        attrs["tokens_per_s"] = round(result.throughput * tokens_per_sample, 1)
    attrs["loss_curve"] = [float(f"{x:.6g}") for x in ranks[0].loss_curve]
    return attrs


def enqueue_baseline(study: optuna.Study, space: ResolvedSpace) -> None:
    """Queue a baseline trial: every knob at its default."""
    study.enqueue_trial(space.baseline_params(), user_attrs={"baseline": True})


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
    workload = {
        "trainer": d.trainer,
        "options": dict(d.trainer_options),
        "world_size": space.target.world_size,
        "backend": space.target.backend,
        "global_batch": global_batch,
    }
    if d.free_batch:  # another study: its trials measure other global batches
        workload["free_batch"] = True
    directions = [optuna.study.StudyDirection.MAXIMIZE]
    if d.multi_objective:  # and the least peak memory per rank
        directions.append(optuna.study.StudyDirection.MINIMIZE)
    existing = {s.study_name for s in optuna.get_all_study_summaries(storage)}
    created = False
    if name not in existing:
        try:
            study = optuna.create_study(
                study_name=name, storage=storage, sampler=sampler, directions=directions
            )
            created = True
        except optuna.exceptions.DuplicatedStudyError:
            pass  # another driver on the same storage created it a moment ago: join it
    if created:
        # at once: a driver joining this new study a moment later finds the baseline queued
        enqueue_baseline(study, space)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(METRICS[: len(directions)])
    else:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
        if study.directions != directions:
            raise ConfigError(
                f"--study-name {name}: that study in {storage_mod.display_url(url)} was not made "
                f"for --objective "
                f"{d.objective}; choose another --study-name"
            )
        old = record(study).get("workload")
        if old is not None and old != workload:
            raise ConfigError(
                f"--study-name {name}: that study measured workload {old}, this run asks for "
                f"{workload}; choose another --study-name"
            )
    trials_before = 0 if created else len(study.trials)
    rec = record(study)
    rec.update(
        version=1,
        workload=workload,
        hardware={k: hw.get(k) for k in SECTIONS["hardware"]},
        space=space.to_mapping(),
        left_out=[str(x) for x in space.dropped],
    )
    study.set_user_attr(ATTR, rec)
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


def driver_alive(driver: str) -> bool | None:
    """Whether the driver ``driver`` (``driver_identity``) still runs: None when it ran on
    another machine or boot, or this one cannot tell (Optuna's heartbeat decides then)."""
    parts = driver.rsplit(":", 3)
    if len(parts) != 4:
        return None  # an older autotune's host:pid: left to the heartbeat
    host, boot, pid, start = parts
    if host != socket.gethostname() or not boot or boot != _boot_id() or not pid.isdigit():
        return None
    return start != "" and _start_time(pid) == start


def close_abandoned_trials(study: optuna.Study, storage: optuna.storages.BaseStorage) -> list[int]:
    """FAIL (reason ``interrupted``) the RUNNING trials whose driver died on this host.

    Trials of drivers on other hosts are left to Optuna's heartbeat, which fails them once
    they have been silent for the grace period. ``storage`` is the study's own storage (its
    public ``BaseStorage`` API changes a trial that is not this process's)."""
    closed = []
    study_id = storage.get_study_id_from_name(study.study_name)
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        driver = t.user_attrs.get("driver", "")
        if driver_alive(driver) is False:
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
            storage.set_trial_user_attr(trial_id, "reason", str(FailureReason.INTERRUPTED))
            storage.set_trial_user_attr(
                trial_id, "reason_detail", f"its driver ({driver}) stopped during the trial"
            )
            storage.set_trial_state_values(trial_id, TrialState.FAIL)
            closed.append(t.number)
    return closed
