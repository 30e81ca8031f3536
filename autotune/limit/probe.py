"""How far from the limit: where a configuration's step time goes, the compute ceiling, the
ideal-overlap bound, and the bus bandwidth the all-reduce reached.

After re-validation and ablation, ``measure_limit`` runs the limit probe
(``autotune.rank.limit_probe``) once for the defaults (the baseline trial's configuration) and once
for the configuration the profile exports, in the trials' own placement group and processes.
Each probe gives, per optimizer step and for the slowest rank: the DDP step's phases (data,
forward, backward with the communication it did not hide, optimizer), the same step on the
bare model (no all-reduce: the compute ceiling), and the gradients' all-reduce alone at the
configuration's bucket sizes and hook dtype. ``bounds`` turns that into:

* **compute ceiling**: samples/s of the bare model's step; every rank computing alone on its
  share of the machine, so the sum over the ranks.
* **ideal-overlap bound**: DDP overlaps the all-reduce with the backward of the last
  micro-step only, and the last bucket (the first layers' gradients) cannot overlap at all.
  The ideal step is the bare step plus whatever of the all-reduce sticks out:
  ``compute_step + max(last_bucket, comm - backward_of_the_last_micro_step)`` (at least
  max(compute, communication)).
* **shares**: the DDP step's samples/s over each bound, all three from the same processes in
  the same minute.
* **communication**: the part of the backward phase DDP spent waiting on the all-reduce (its
  backward returns once its buckets are reduced): ``exposed = ddp.backward -
  compute.backward``. The step's communication is the larger of that and the all-reduce
  alone (in training it competes with the backward for the same cores, and can take longer
  than alone); hidden is the part of it that is not exposed.
* **bus bandwidth**: the ring all-reduce moves 2(n-1)/n of the bytes per rank
  (nccl-tests' ``busbw``): ``wire_bytes * 2(n-1)/n / comm_s``. With one rank there is none.

The record is the study's ``limit`` user attribute and the profile's ``measured.limit``;
``summary_line`` says it in one line and names the knob family most likely to help next, with
why, from the same model the screening is ordered by (``autotune.limit.evidence``): never a
family the run's screening measured as no gain (``no_gain``: it did not help, or its interval
does not clear 1.0), and never compression for an all-reduce whose time is per-message latency
(small buckets: alpha dominates, and compression only cuts bytes). Numbers are written for
people (``autotune.core.values``). The defaults are probed once, right after the baseline trial
(``probe_one``, the study's ``first_measurement``); the probe at the end reuses that record.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.core.config import MeasureSettings, TrialConfig
from autotune.core.errors import FailureReason, TrialFailed
from autotune.core.events import Emit, Note
from autotune.core.results import TrialResult
from autotune.core.values import nbytes, number, seconds, speedup
from autotune.limit.evidence import COMM_BOUND_SHARE, DATA_BOUND_SHARE, Evidence
from autotune.record import trial as tr
from autotune.record.attrs import (
    AblationRecord,
    FirstMeasurement,
    LimitRecord,
    load,
    load_screening,
    save,
)
from autotune.record.study import anchored_speedups, baseline_trial
from autotune.record.typed import RecordError

__all__ = [
    "bounds",
    "breakdown",
    "completed",
    "measure_limit",
    "next_step",
    "no_gain",
    "probe_one",
    "summary_line",
    "traced_run",
]

#: All-reduce rounds of the communication-only measurement (after one unmeasured round).
COMM_REPEATS = 3
#: The least optimistic gain (``autotune.limit.evidence``) worth naming as the next step.
WORTH = 1.03
#: The bucket size (MB) that "smaller buckets" means: the screening's.
SMALL_BUCKET_MB = 5.0
#: A share of the ideal-overlap bound from which the step is at it, within the probe's noise.
AT_BOUND = 0.97


def breakdown(record: dict[str, Any]) -> dict[str, float]:
    """Seconds per optimizer step of the DDP step, by what they were spent on: data, forward,
    backward (the bare model's), communication not hidden behind backward, optimizer."""
    ddp, compute = record["ddp"], record["compute"]
    backward = min(compute["backward"], ddp["backward"])
    return {
        "data": ddp["data"],
        "forward": ddp["forward"],
        "backward": backward,
        "exposed_comm": ddp["backward"] - backward,
        "optimizer": ddp["optimizer"],
    }


def bounds(record: dict[str, Any]) -> dict[str, Any]:
    """The figures derived from one probe record (module doc)."""
    n, per_step = record["world_size"], record["samples_per_step"]
    ddp, compute, comm = record["ddp"], record["compute"], record["comm"]
    step, bare = ddp["step"], compute["step"]
    overlappable = compute["backward"] / record["accumulation_steps"]
    ideal = bare + max(comm["last_bucket_s"], comm["comm_s"] - overlappable)
    exposed = breakdown(record)["exposed_comm"]
    comm_s = comm["comm_s"]
    in_step = max(comm_s, exposed)  # the step's communication, hidden or not
    bus = None
    if n > 1 and comm_s > 0:
        bus = comm["wire_bytes"] * 2 * (n - 1) / n / comm_s
    return {
        "samples_per_s": round(per_step / step, 2),
        "compute_ceiling": round(per_step / bare, 2),
        "ideal_bound": round(per_step / ideal, 2),
        "share_of_ceiling": round(bare / step, 4),
        "share_of_ideal": round(ideal / step, 4),
        "comm_share": round(min(in_step / step, 1.0), 4),
        "hidden_share": None if in_step <= 0 else round(1 - exposed / in_step, 4),
        "exposed_comm_share": round(exposed / step, 4),
        "busbw_gbit_s": None if bus is None else round(bus * 8 / 1e9, 4),
    }


def next_step(
    record: dict[str, Any],
    config: TrialConfig,
    *,
    free_batch: bool = False,
    device: str = "cpu",
    ruled_out: frozenset[str] = frozenset(),
) -> str:
    """The knob family most likely to help next, with why: the one whose gain on this step is
    largest (``autotune.limit.evidence``; compression only where the bytes, not the
    per-message latency, take the all-reduce's time), among the families ``config`` has not
    moved yet and the run did not measure as no gain (``ruled_out``: knob names, e.g.
    ``comm_hook``). None worth ``WORTH``: what bounds the step, from the same breakdown."""
    ev = Evidence.from_probe(record, device=device, noise=0.0)
    step = ev.step_s
    comm_bound = ev.world_size > 1 and ev.exposed_s >= COMM_BOUND_SHARE * step
    options = [
        o
        for o in _untried(ev, config, free_batch=free_batch, comm_bound=comm_bound)
        if o[1] not in ruled_out
    ]
    best = max(options, default=None, key=lambda o: o[0])
    if best is not None and best[0] >= WORTH:
        return f"{best[2]}, up to {speedup(best[0])}: {best[3]}"
    if comm_bound and ev.latency_dominated:
        return (
            f"a link with less latency, or fewer all-reduces per sample: the all-reduce is "
            f"{ev.buckets} message(s) of {nbytes(ev.grad_bytes / ev.buckets)} whose time is "
            f"per-message latency ({seconds(ev.smallest_s)} each), not bytes"
        )
    if comm_bound:
        return "a faster link: the all-reduce is the bottleneck and no DDP setting left shortens it"
    if ev.data_s >= DATA_BOUND_SHARE * step:
        return "a faster data pipeline than DataLoader settings give"
    return "compute-bound: little left for DDP settings to win; a faster device"


def _untried(
    ev: Evidence, config: TrialConfig, *, free_batch: bool, comm_bound: bool
) -> list[tuple[float, str, str, str]]:
    """The knob families ``config`` has not moved yet, each as (its gain on this step, the
    knob it moves, what to call it, why: the part of the breakdown it acts on)."""
    step = seconds(ev.step_s)
    options: list[tuple[float, str, str, str]] = []
    if config.comm_hook.get("name", "none") == "none":
        why = f"the all-reduce's bytes take {seconds(ev.surely_bytes_s)} of a {step} step"
        options.append(
            (
                ev.compressed_surely(),
                "comm_hook",
                "compression (a comm hook: fp16 or PowerSGD)",
                why,
            )
        )
    if config.ddp.get("bucket_cap_mb", 25.0) == 25.0:
        why = f"{ev.buckets} all-reduces a step at {seconds(ev.smallest_s)} latency each"
        options.append(
            (ev.fewer_messages(100.0), "bucket_cap_mb", "larger buckets (fewer all-reduces)", why)
        )
        why = f"{seconds(ev.exposed_s)} of communication sticks out of the backward"
        options.append(
            (
                ev.more_overlap(SMALL_BUCKET_MB),
                "bucket_cap_mb",
                "smaller buckets (the all-reduce starts earlier in backward)",
                why,
            )
        )
    if config.data.get("num_workers", 0) == 0:
        why = f"loading takes {seconds(ev.data_s)} of a {step} step"
        options.append(
            (
                ev.off_the_loop(),
                "num_workers",
                "the data pipeline (DataLoader workers, pinned memory)",
                why,
            )
        )
    if config.precision == "fp32":
        why = f"forward and backward take {seconds(ev.forward_s + ev.backward_s)} of a {step} step"
        options.append((ev.faster_compute(), "precision", "lower precision (bf16, TF32)", why))
    if free_batch and config.accumulation_steps == 1 and comm_bound:
        why = f"{seconds(ev.exposed_s)} of exposed communication a step"
        options.append(
            (
                ev.speedup_if_saved(ev.exposed_s / 2),
                "micro_batch",
                "accumulation (more samples per all-reduce)",
                why,
            )
        )
    return options


def no_gain(study: optuna.Study) -> frozenset[str]:
    """The knobs the run measured as no gain: a screened prior that did not help, or whose
    speedup's 95 % interval does not clear 1.0 (``helps`` within its own noise), and a knob
    the ablation dropped from the winner. The advice never names their family."""
    out: set[str] = set()
    with contextlib.suppress(RecordError):
        if (ablation := load(study, AblationRecord)) is not None:
            out.update(ablation.dropped)
    with contextlib.suppress(RecordError):
        for s in (load_screening(study) or {}).values():
            if s.state not in ("COMPLETE", "PRUNED"):
                continue
            noise = None if s.interval is None else s.interval.rel_half_width
            low = None if s.speedup is None else s.speedup * (1 - (noise or 0.0))
            if not s.helps or low is None or low <= 1.0:
                out.update(s.moves)
    return frozenset(out | _screened_trials_no_gain(study))


def _screened_trials_no_gain(study: optuna.Study) -> set[str]:
    """The same rule read from the screening's own trials, for a run whose search stopped
    before the screening's record was written (a short budget): a screening trial PRUNED, or
    COMPLETE with its speedup over the defaults measured nearest to it not clearing 1.0 by
    its own interval; the knobs it moved from the defaults."""
    base = baseline_trial(study)
    if base is None:
        return set()
    ended = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    speedups = anchored_speedups([t for t in ended if t.state == TrialState.COMPLETE])
    out: set[str] = set()
    for t in ended:
        if tr.screen_label(t) is None or tr.is_baseline(t):
            continue
        sp = speedups.get(t.number)
        if t.state == TrialState.PRUNED or (sp is not None and sp * (1 - tr.rel_noise(t)) <= 1):
            out.update(k for k, v in t.params.items() if base.params.get(k) != v)
    return out


def summary_line(limit: dict[str, Any]) -> str | None:
    """One line for the run's summary: where the exported configuration's step goes and how
    far it is from the ideal-overlap bound and the compute ceiling."""
    tuned, which = limit.get("tuned"), "tuned"
    if tuned is None:  # the profile keeps the defaults: they were probed alone
        tuned, which = limit.get("baseline"), "default"
    if not tuned or "bounds" not in tuned:
        return None
    b = tuned["bounds"]
    if tuned["world_size"] == 1:
        comm = (
            f"one rank, no link to cross: DDP's own bucketing costs {b['exposed_comm_share']:.0%}"
        )
    elif b["hidden_share"] is None:
        comm = "no communication measured"
    else:
        comm = f"{b['comm_share']:.0%} communication, {b['hidden_share']:.0%} of it hidden"
    if b["share_of_ideal"] >= AT_BOUND:
        ideal = "at the ideal-overlap bound"
    else:
        more = 1 / b["share_of_ideal"]
        share = f"{b['share_of_ideal']:.0%}"
        ideal = f"{share} of the ideal-overlap bound ({speedup(more)} more possible)"
    return (
        f"Limit: the {which} step is {comm}; {number(b['samples_per_s'])} samples/s is {ideal} "
        f"and {b['share_of_ceiling']:.0%} of the compute ceiling ({number(b['compute_ceiling'])}); "
        f"next: {tuned['next']}"
    )


def probe_one(
    measure: Any,
    trial: int,
    config: TrialConfig,
    *,
    trace: Path | None = None,
    free_batch: bool = False,
    device: str = "cpu",
    ruled_out: frozenset[str] = frozenset(),
    steps: int | None = None,
) -> dict[str, Any]:
    """One limit probe of ``config`` (trial ``trial``) with ``measure`` (a ``Measurer``): its
    record, with its bounds, breakdown and next step. ``steps``: DDP steps to time (None: the
    probe's own choice, two windows' worth). Raises ``TrialFailed``.

    A traced probe whose rank process dies (reason ``crash``) is measured once more without
    the trace, and its record says so (``untraced``): ``torch.profiler``'s results, freed as
    the rank cleans up after the probe, have crashed a rank process in ``free`` (a SIGSEGV,
    1 of 25 runs of the README's own-model example on CPU), and the figures the search is
    ordered by matter more than the trace. What the crashed run wrote at ``trace`` is
    removed: the record names no trace then."""
    t0 = time.monotonic()
    settings: dict[str, Any] = {
        "repeats": COMM_REPEATS,
        "trace": None if trace is None else str(trace),
    }
    if steps is not None:
        settings["steps"] = steps
    untraced = None
    try:
        result = measure(trial, config, limit=settings)
    except TrialFailed as e:
        if e.reason is not FailureReason.CRASH or trace is None:
            raise
        untraced = f"the traced probe failed ({e.reason.value}: {e.detail})"
        result = measure(trial, config, limit=dict(settings, trace=None))
        trace.unlink(missing_ok=True)  # whatever the crashed run wrote is not this record's
    record = dict(result.ranks[0].limit or {})
    if untraced is not None:
        record["untraced"] = untraced
    record["measure_s"] = round(result.ranks[0].measure_s, 2)  # without set-up and warm-up
    return completed(
        record,
        trial,
        config,
        free_batch=free_batch,
        device=device,
        ruled_out=ruled_out,
        wall_s=time.monotonic() - t0,
        trace=None if trace is None or not trace.exists() else trace,
    )


def completed(
    probed: dict[str, Any],
    trial: int,
    config: TrialConfig,
    *,
    free_batch: bool = False,
    device: str = "cpu",
    ruled_out: frozenset[str] = frozenset(),
    wall_s: float,
    trace: Path | None = None,
) -> dict[str, Any]:
    """The record of a probe of ``config`` (trial ``trial``) from what its ranks measured
    (``probed``, ``RankResult.limit``): with its bounds, breakdown and next step, the
    ``wall_s`` it took and the ``trace`` it wrote. Raises ``KeyError`` where a figure is
    missing."""
    record = dict(probed)
    record.update(
        trial=trial,
        config=config.to_dict(),
        bounds=bounds(record),
        breakdown={k: round(v, 6) for k, v in breakdown(record).items()},
        next=next_step(record, config, free_batch=free_batch, device=device, ruled_out=ruled_out),
        wall_s=round(wall_s, 2),
        trace=None if trace is None else str(trace),
    )
    return record


def traced_run(
    measure: Any,
    trial: int,
    config: TrialConfig,
    path: Path,
    settings: MeasureSettings,
    emit: Emit,
) -> tuple[TrialResult, Path | None]:
    """A run of ``config`` (trial ``trial``) measured with ``settings`` whose rank 0 writes a
    Chrome trace of a few DDP steps to ``path`` after its windows (``RankSpec.trace``): its
    result, and ``path`` where the trace was written (None: it was not). As in ``probe_one``,
    a traced run whose rank process dies (``crash``: ``torch.profiler``'s results have crashed
    a rank as it freed them) is taken again without the trace, said in one line; any other
    failure is the run's (``TrialFailed``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # an earlier run's: this record names only its own
    try:
        result = measure(trial, config, measure=settings, trace=path)
    except TrialFailed as e:
        if e.reason is not FailureReason.CRASH:
            raise
        path.unlink(missing_ok=True)
        emit(
            Note(
                f"The run of trial {trial} that took the Chrome trace failed ({e.reason.value}: "
                f"{e.detail}); measured again without the trace"
            )
        )
        return measure(trial, config, measure=settings), None
    return result, path if path.exists() else None


def _reused(
    record: dict[str, Any] | None,
    config: TrialConfig,
    *,
    free_batch: bool,
    device: str,
    ruled_out: frozenset[str],
) -> dict[str, Any] | None:
    """A stored probe ``record`` of ``config`` with its bounds and its advice (``next_step``)
    as of now; None where there is none, or it cannot be read as a probe's (it may be someone
    else's: the configuration is probed again)."""
    if record is None:
        return None
    try:
        advice = next_step(
            record, config, free_batch=free_batch, device=device, ruled_out=ruled_out
        )
        found = dict(bounds=bounds(record), next=advice)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    return {**{k: v for k, v in record.items() if k != "untraced"}, **found}  # untraced: said


def _trace_again(
    measure: Any, trial: int, config: TrialConfig, path: Path, rerun: MeasureSettings, emit: Emit
) -> Path | None:
    """The Chrome trace of a reused probe's configuration, in a run of its own
    (``traced_run``); None, said, where that run fails."""
    try:
        return traced_run(measure, trial, config, path, rerun, emit)[1]
    except TrialFailed as e:
        emit(
            Note(f"No Chrome trace of trial {trial}: its run failed ({e.reason.value}: {e.detail})")
        )
        return None


def measure_limit(
    study: optuna.Study,
    measure: Any,
    *,
    configs: dict[str, TrialConfig],
    trials: dict[str, int],
    trace_dir: Path | None,
    free_batch: bool = False,
    emit: Emit,
    device: str = "cpu",
    ruled_out: frozenset[str] = frozenset(),
    traced: dict[str, Path] | None = None,
    rerun: MeasureSettings | None = None,
) -> dict[str, Any]:
    """Probe each of ``configs`` (``baseline``, ``tuned``; trial numbers in ``trials``) with
    ``measure`` (a ``Measurer``), record the result on ``study`` and return it. The defaults'
    probe of the first measurement (``record.attrs.FirstMeasurement``), when the study holds one, is
    not taken again; that probe takes no trace (``search.first_look``), so its record names
    the trace this run took of the same configuration (``traced``: the re-validation's, by
    label), or, with ``trace_dir`` and none taken, one taken now in a run measured with
    ``rerun`` (``traced_run``). A probe that fails is recorded with its reason and said; the
    others still run."""
    ruled_out = ruled_out | no_gain(study)
    known = {}
    with contextlib.suppress(RecordError):  # unreadable: the defaults are probed again
        if (first := load(study, FirstMeasurement)) is not None:
            known["baseline"] = first.probe
    started = time.monotonic()
    if trace_dir is not None:
        trace_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    for label, config in configs.items():
        reused = _reused(
            known.get(label), config, free_batch=free_batch, device=device, ruled_out=ruled_out
        )
        if reused is not None:  # the defaults, probed right after the baseline trial
            taken = (traced or {}).get(label)
            if taken is None and trace_dir is not None and rerun is not None:
                path = trace_dir / f"{label}.trace.json"
                taken = _trace_again(measure, trials[label], config, path, rerun, emit)
            out[label] = dict(reused, trace=None if taken is None else str(taken))
            continue
        trace = None if trace_dir is None else trace_dir / f"{label}.trace.json"
        try:
            out[label] = probe_one(
                measure,
                trials[label],
                config,
                trace=trace,
                free_batch=free_batch,
                device=device,
                ruled_out=ruled_out,
            )
        except TrialFailed as e:
            out[label] = {"trial": trials[label], "failed": f"{e.reason.value}: {e.detail}"}
    out["cost_s"] = round(time.monotonic() - started, 2)
    save(
        study,
        LimitRecord(baseline=out.get("baseline"), tuned=out.get("tuned"), cost_s=out["cost_s"]),
    )
    failed = [
        f"{k}: {v['failed']}" for k, v in out.items() if isinstance(v, dict) and "failed" in v
    ]
    if failed:
        emit(Note(f"The limit probe failed ({'; '.join(failed)})"))
    _say_untraced({k: v for k, v in out.items() if k in configs}, emit)
    return out


def _say_untraced(probed: dict[str, Any], emit: Emit) -> None:
    """A line for each probe taken again without its trace (``probe_one``)."""
    for label, rec in probed.items():
        if isinstance(rec, dict) and rec.get("untraced"):
            which = {"baseline": "defaults", "tuned": "tuned configuration"}.get(label, label)
            emit(
                Note(
                    f"The limit probe of the {which} was taken again without its trace: "
                    f"{rec['untraced']}"
                )
            )
