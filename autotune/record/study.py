"""The study as a record: the questions the driver asks of a run's Optuna study (which trials
ran the defaults, the nearest of them to a trial, the incumbent, counts), and the baseline and
anchor trials it queues. Opening the study is the search's (``search.opening``). What is stored
where: ``record.attrs`` (the study-level records), ``record.trial`` (a trial's attributes).

Readers may run in any thread; writers write through Optuna's storage, which serialises them.
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from datetime import datetime

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.core.errors import FailureReason
from autotune.core.stats import Interval
from autotune.definition.space import ResolvedSpace
from autotune.record import storage as storage_mod
from autotune.record import trial as tr
from autotune.record.attrs import ATTRS, RunRecord, ValidationRecord, load

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
    "nearest",
    "nearest_anchor",
    "baselines",
    "close_abandoned_trials",
    "complete",
    "counts",
    "driver_alive",
    "driver_identity",
    "enqueue_baseline",
    "failure_reasons",
    "in_present_terms",
    "incumbent",
    "is_autotune_study",
    "record",
    "tag",
    "throughput",
    "validation",
]

#: Study user attribute holding autotune's own record of the study (``RunRecord``).
ATTR = ATTRS[RunRecord]
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


def record(study: optuna.Study) -> RunRecord | None:
    """The study's autotune record, checked (None when it is not an autotune study)."""
    return load(study, RunRecord)


def is_autotune_study(study: optuna.Study) -> bool:
    return bool(study.user_attrs.get(ATTR))


def validation(study: optuna.Study) -> ValidationRecord | None:
    """The last re-validation's record, checked, if any."""
    return load(study, ValidationRecord)


def complete(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def throughput(t: FrozenTrial) -> float:
    """A COMPLETE trial's samples/s (its first objective, whatever the study's objectives)."""
    return t.values[0]


def baseline_trial(study: optuna.Study) -> FrozenTrial | None:
    """The measured baseline (the first COMPLETE trial marked ``baseline``)."""
    for t in complete(study):
        if tr.is_baseline(t):
            return t
    return None


def baselines(study: optuna.Study) -> list[FrozenTrial]:
    """Every baseline trial of the study, in any state."""
    return [t for t in study.get_trials(deepcopy=False) if tr.is_baseline(t)]


def baseline_value(study: optuna.Study) -> float | None:
    t = baseline_trial(study)
    return None if t is None else throughput(t)


def anchors(study: optuna.Study) -> list[FrozenTrial]:
    """Every measured run of the defaults: the baseline and the re-anchoring runs after it."""
    return [t for t in complete(study) if tr.is_baseline(t)]


def nearest_anchor(study: optuna.Study, t: FrozenTrial) -> FrozenTrial | None:
    """The run of the defaults measured nearest in time to ``t``: the machine drifts, so a
    trial is compared with the defaults as they ran around it. Nearness is counted in trials
    (numbers follow start order, concurrent trials included; trials take similar times), the
    later of two equally near (``nearest``): the same study always gives the same answer."""
    return nearest(anchors(study), t)


def nearest(runs: list[FrozenTrial], t: FrozenTrial) -> FrozenTrial | None:
    """Of ``runs``, the one nearest ``t`` in trial numbers; the later of two equally near.
    The first baseline runs in new processes and can read cold: a real 10-minute run's read
    15,215 samples/s and the run of the defaults two trials later 17,683, and trial 2, as near
    to either, was taken at 1.37x of the cold one and re-validated first, ahead of trials at
    1.26-1.28x of the warm runs beside them."""
    return min(runs, key=lambda a: (abs(a.number - t.number), -a.number)) if runs else None


def anchored_speedup(study: optuna.Study, t: FrozenTrial) -> float | None:
    """``t``'s throughput over that of the run of the defaults nearest to it in time."""
    a = nearest_anchor(study, t)
    return None if a is None else throughput(t) / throughput(a)


def anchored_speedups(done: list[FrozenTrial]) -> dict[int, float]:
    """``anchored_speedup`` of each of the COMPLETE trials ``done`` (one read of a study),
    by number."""
    runs = [t for t in done if tr.is_baseline(t)]
    if not runs:
        return {}
    return {t.number: throughput(t) / throughput(nearest(runs, t)) for t in done}


def enqueue_anchor(study: optuna.Study, space: ResolvedSpace, why: str) -> None:
    """Queue another run of the defaults (a baseline run after the first: ``anchor``)."""
    tr.enqueue(study, space.baseline_params(), baseline=True, anchor=why)


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
        tr.reason(t) for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
    )


def incumbent(study: optuna.Study) -> Interval | None:
    """The best COMPLETE trial's throughput interval as the machine runs now
    (``in_present_terms``): a trial clearly below it is pruned. The best by its speedup over
    the run of the defaults nearest it (``anchored_speedups``), not by its raw throughput: on
    a machine that slows down, a trial measured early keeps the highest raw figure, and a
    real 10-minute run whose defaults fell to 0.82x pruned 79 of 96 trials against it, among
    them trials at 1.27-1.30x of the defaults beside them, above the best's 1.21x."""
    done = complete(study)
    if not done:
        return None
    speedups = anchored_speedups(done)
    best = max(done, key=lambda t: (speedups.get(t.number, 0.0), throughput(t)))
    runs = [t for t in done if tr.is_baseline(t)]  # ``anchors``, from the same read
    return in_present_terms(runs, best)  # None: measured without intervals


def in_present_terms(runs: list[FrozenTrial], t: FrozenTrial) -> Interval | None:
    """``t``'s throughput interval scaled by how the machine drifted since: the latest of the
    study's runs of the defaults ``runs`` (``anchors``) over the one nearest ``t``
    (``nearest``), where the defaults now run slower beyond the noise of both runs (their
    intervals apart). Never scaled up: a machine that speeds up, and the cold first baseline
    (which reads low), leave the bar where it was, and a bar left low prunes less, never
    more. None: ``t`` has no interval."""
    iv = tr.interval(t)
    near = nearest(runs, t)
    if iv is None or near is None:
        return iv
    latest = max(runs, key=lambda a: a.number)
    now, then = tr.interval(latest), tr.interval(near)
    if now is None or then is None or now.high >= then.low or then.median <= 0:
        return iv
    k = now.median / then.median
    return Interval(iv.median * k, iv.low * k, iv.high * k, iv.n)


def tag(trial: optuna.Trial | FrozenTrial) -> str:
    """How the log names a trial: ``baseline``, ``anchor N`` (the defaults again, trial N) or
    ``trial N``."""
    if tr.anchor(trial):
        return f"anchor {trial.number}"
    return "baseline" if tr.is_baseline(trial) else f"trial {trial.number}"


# -- writing ---------------------------------------------------------------------------------


def enqueue_baseline(study: optuna.Study, space: ResolvedSpace) -> None:
    """Queue a baseline trial: every knob at its default."""
    tr.enqueue(study, space.baseline_params(), baseline=True)


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
    """FAIL (reason ``interrupted``) the RUNNING trials whose driver died on this host, and
    those that never named a driver and are a heartbeat grace period old (``_abandoned``).

    Trials of drivers on other hosts are left to Optuna's heartbeat, which fails them once
    they have been silent for the grace period. ``storage`` is the study's own storage (its
    public ``BaseStorage`` API changes a trial that is not this process's)."""
    closed = []
    study_id = storage.get_study_id_from_name(study.study_name)
    now = datetime.now()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        detail = _abandoned(t, now)
        if detail is not None:
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
            storage.set_trial_user_attr(trial_id, "reason", str(FailureReason.INTERRUPTED))
            storage.set_trial_user_attr(trial_id, "reason_detail", detail)
            storage.set_trial_state_values(trial_id, TrialState.FAIL)
            closed.append(t.number)
    return closed


def _abandoned(t: FrozenTrial, now: datetime) -> str | None:
    """Why the RUNNING trial ``t`` has no driver left (its ``reason_detail``), or None while
    one may still run it. A driver records itself as its trial's first write, milliseconds
    after Optuna creates the trial; a trial still without a driver a heartbeat grace period
    later lost its driver in those milliseconds, before Optuna's first heartbeat, and
    Optuna's own clean-up skips a trial that never had one. Its start is the creating host's
    clock: a host more than the grace period behind this one's could have a trial of its own
    closed in those milliseconds."""
    driver = tr.driver(t)
    if driver:
        if driver_alive(driver) is False:
            return f"its driver ({driver}) stopped during the trial"
        return None
    started = t.datetime_start
    if started is not None and (now - started).total_seconds() > storage_mod.GRACE_S:
        return "its driver stopped as it took the trial, before recording itself"
    return None
