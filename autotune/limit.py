"""How far from the limit: where a configuration's step time goes, the compute ceiling, the
ideal-overlap bound, and the bus bandwidth the all-reduce reached.

After re-validation and ablation, ``measure_limit`` runs the limit probe
(``autotune.rank_limit``) once for the defaults (the baseline trial's configuration) and once
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
``summary_line`` says it in one line and names the knob family most likely to help next.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import optuna

from autotune.config import TrialConfig
from autotune.errors import TrialFailed
from autotune.events import Emit, Note

__all__ = ["LIMIT_ATTR", "bounds", "breakdown", "measure_limit", "next_step", "summary_line"]

#: The study's user attribute holding the last limit measurement.
LIMIT_ATTR = "limit"
#: All-reduce rounds of the communication-only measurement (after one unmeasured round).
COMM_REPEATS = 3
#: Exposed communication, as a share of the step, from which communication is the bottleneck.
COMM_BOUND_SHARE = 0.2
#: Data loading, as a share of the step, from which the data pipeline is.
DATA_BOUND_SHARE = 0.15
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


def next_step(record: dict[str, Any], config: TrialConfig, *, free_batch: bool = False) -> str:
    """The knob family most likely to help next, from where the step time goes."""
    parts = breakdown(record)
    step = record["ddp"]["step"]
    if record["world_size"] > 1 and parts["exposed_comm"] / step >= COMM_BOUND_SHARE:
        if config.comm_hook.get("name", "none") == "none":
            return "compression (a comm hook: fp16 or PowerSGD)"
        if free_batch and config.accumulation_steps == 1:
            return "accumulation (more samples per all-reduce)"
        return "a faster link (the all-reduce is the bottleneck with compression on)"
    if parts["data"] / step >= DATA_BOUND_SHARE:
        return "the data pipeline (DataLoader workers, pinned memory)"
    if config.precision == "fp32":
        return "compute-bound: lower precision (bf16, TF32) or a faster device"
    return "compute-bound: little left for DDP settings to win"


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
        ideal = f"{b['share_of_ideal']:.0%} of the ideal-overlap bound ({more:.2f}x more possible)"
    return (
        f"Limit: the {which} step is {comm}; {b['samples_per_s']:.4g} samples/s is {ideal} and "
        f"{b['share_of_ceiling']:.0%} of the compute ceiling ({b['compute_ceiling']:.4g}); "
        f"next: {tuned['next']}"
    )


def measure_limit(
    study: optuna.Study,
    measure: Any,
    *,
    configs: dict[str, TrialConfig],
    trials: dict[str, int],
    trace_dir: Path | None,
    free_batch: bool = False,
    emit: Emit,
) -> dict[str, Any]:
    """Probe each of ``configs`` (``baseline``, ``tuned``; trial numbers in ``trials``) with
    ``measure`` (a ``Measurer``), record the result on ``study`` and return it. A probe that
    fails is recorded with its reason and said; the others still run."""
    started = time.monotonic()
    if trace_dir is not None:
        trace_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    for label, config in configs.items():
        trace = None if trace_dir is None else trace_dir / f"{label}.trace.json"
        settings = {"repeats": COMM_REPEATS, "trace": None if trace is None else str(trace)}
        t0 = time.monotonic()
        try:
            result = measure(trials[label], config, limit=settings)
        except TrialFailed as e:
            out[label] = {"trial": trials[label], "failed": f"{e.reason.value}: {e.detail}"}
            continue
        record = dict(result.ranks[0].limit or {})
        record.update(
            trial=trials[label],
            config=config.to_dict(),
            bounds=bounds(record),
            breakdown={k: round(v, 6) for k, v in breakdown(record).items()},
            next=next_step(record, config, free_batch=free_batch),
            wall_s=round(time.monotonic() - t0, 2),
            trace=None if trace is None or not trace.exists() else str(trace),
        )
        out[label] = record
    out["cost_s"] = round(time.monotonic() - started, 2)
    study.set_user_attr(LIMIT_ATTR, out)
    failed = [
        f"{k}: {v['failed']}" for k, v in out.items() if isinstance(v, dict) and "failed" in v
    ]
    if failed:
        emit(Note(f"The limit probe failed ({'; '.join(failed)})"))
    return out
