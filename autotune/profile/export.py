"""The profile of a study: which configuration it exports, with the evidence, and writing it.

The re-validation's winner when there is one (``validation.revalidate``), else the best COMPLETE
trial; for ``--objective throughput,memory`` the Pareto member ``PARETO_RULE`` picks; or a trial
chosen by hand (``autotune export --trial N``). Called by ``tuner.run`` at the end of a run
(whatever stopped it) and by ``autotune export``.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import optuna

from autotune.core.config import TrialConfig
from autotune.core.errors import ConfigError
from autotune.core.values import speedup
from autotune.definition.durations import format_duration
from autotune.limit.probe import summary_line
from autotune.profile.profile import EXPORT_FIX as _FIX
from autotune.profile.profile import Profile
from autotune.record import trial as tr
from autotune.record.attrs import (
    AblationRecord,
    LimitRecord,
    ValidationRecord,
    load,
    load_readable,
    load_screening,
)
from autotune.record.study import (
    anchors,
    baseline_trial,
    complete,
    counts,
    is_autotune_study,
    record,
    throughput,
    validation,
)

__all__ = ["PARETO_RULE", "export_profile", "pareto_choice", "screening_note", "study_profile"]


#: How the profile of a throughput-and-memory study is chosen from its Pareto front.
PARETO_RULE = (
    "the fastest configuration on the Pareto front that needs no more peak memory per rank "
    "than the defaults (the fastest on the front when every one needs more)"
)


def pareto_choice(
    front: list[optuna.trial.FrozenTrial], base: optuna.trial.FrozenTrial | None
) -> optuna.trial.FrozenTrial:
    """``PARETO_RULE``: applying the profile then never costs memory when it can be helped."""
    limit = None if base is None else base.values[1]
    lean = [t for t in front if limit is None or t.values[1] <= limit]
    return max(lean or front, key=throughput)


def export_profile(
    study: optuna.Study,
    path: Path,
    *,
    budget_s: float | None = None,
    note: bool = False,
    trial: int | None = None,
) -> Path:
    """Write ``study``'s profile (``study_profile``) to ``path``; with ``note``, also put it
    in the study's optuna-dashboard note."""
    profile = study_profile(study, budget_s=budget_s, trial=trial)
    saved = profile.save(path)
    if note:
        from optuna_dashboard import save_note

        text = profile.to_yaml()
        note_text = f"## Exported profile\n\n`{saved}`\n\n```yaml\n{text}```\n"
        limit = profile.measured.get("limit")
        line = summary_line(limit) if limit else None
        limit_text = f"## How far from the limit\n\n{line}\n\n" if line else ""
        save_note(study, limit_text + note_text + screening_note(study))
    return saved


def screening_effects(study: optuna.Study) -> dict[str, dict[str, Any]]:
    """The screening's effects as the profile records them: per prior, its speedup over the
    defaults (None when it did not complete), whether it helped (cleared ``HELPS``: it was
    combined) and, when known, its trial's noise (the 95 % interval's relative half-width);
    for a prior screened on top of a lever, the lever (``on_top``) and its ``gain`` over it."""
    out: dict[str, dict[str, Any]] = {}
    for label, x in (load_screening(study) or {}).items():
        out[label] = {"speedup": x.speedup, "helps": x.helps}
        if x.on_top is not None:
            out[label].update(on_top=x.on_top, gain=x.gain)
        noise = None if x.interval is None else x.interval.rel_half_width
        if noise is not None and 0 <= noise < 10:
            out[label]["noise"] = round(noise, 4)
    return out


def ablation_of(study: optuna.Study, number: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The ablation of trial ``number`` as the profile records it (each changed knob: its
    value, its share of the gain with the interval, kept or dropped) and the configuration it
    leaves; None when that trial was not ablated."""
    rec = load(study, AblationRecord)
    if rec is None or rec.trial != number:
        return None
    knobs: dict[str, Any] = {}
    for k, c in rec.contributions.items():
        entry: dict[str, Any] = {"kept": c.kept}
        if c.speedup is not None and len(c.speedup) == 3:
            entry["speedup"] = [round(x, 4) for x in c.speedup]
        if c.why is not None:
            entry["why"] = c.why
        knobs[k] = entry
    summary: dict[str, Any] = {"rounds": rec.rounds, "knobs": knobs, "together": rec.together}
    if rec.joint is not None:
        summary["joint"] = {"knobs": rec.joint.knobs, "kept_back": rec.joint.kept_back}
        if rec.joint.speedup is not None and len(rec.joint.speedup) == 3:
            summary["joint"]["speedup"] = [round(x, 4) for x in rec.joint.speedup]
    return summary, rec.config


def screening_note(study: optuna.Study) -> str:
    """The screening's knob effects as a Markdown table for the dashboard's note ('' when the
    study was not screened)."""
    effects = load_screening(study)
    if not effects:
        return ""
    rows = ["", "## Screening: each knob moved from the defaults, alone or on top of a lever", ""]
    rows += [
        "| knob | on top of | trial | state | speedup | gain on top | helps |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for x in effects.values():
        shown = "-" if x.speedup is None else speedup(x.speedup, 3)
        gain = "-" if x.gain is None else speedup(x.gain, 3)
        row = [x.label, x.on_top or "-", x.trial, x.state, shown, gain, x.helps]
        rows.append("| " + " | ".join(str(v).replace("|", "/") for v in row) + " |")
    return "\n".join(rows) + "\n"


def study_profile(
    study: optuna.Study, *, budget_s: float | None = None, trial: int | None = None
) -> Profile:
    """The profile of ``study``: the re-validation's winner when there is one, else the best
    COMPLETE trial (with ``--objective throughput,memory``: chosen from the Pareto front, see
    ``pareto_choice``), or trial number ``trial``; with the evidence in ``measured``.

    The study may come from someone else's database: its records are read type-checked
    (``record.attrs``), so one that is not what autotune writes is a ConfigError naming the
    record and the field, never a traceback (and the profile itself is checked by
    ``Profile``'s strict rules, its env by the allowlist)."""
    if not is_autotune_study(study):
        raise ConfigError(f"--study-name {study.study_name}: not an autotune study")
    done = complete(study)
    if not done:
        raise ConfigError(
            f"--study-name {study.study_name}: no COMPLETE trial to export yet; run it first"
        )
    base = baseline_trial(study)
    multi = len(study.directions) > 1
    front = sorted(study.best_trials, key=throughput) if multi else []
    best = _chosen(study, done, front, base, trial)
    measured = _measured(study, best, base, front, budget_s)
    ablated_config = None
    if trial is not None:
        measured.update(
            validation=None, note=f"trial {trial}, chosen by hand (autotune export --trial)"
        )
    elif multi:
        measured.update(
            validation=None,
            note=(
                f"--objective throughput,memory: {PARETO_RULE} ({len(front)} on the front, listed "
                f"in pareto; `autotune export --trial N` writes another); not re-validated"
            ),
        )
    elif (checked := validation(study)) is not None and base is not None:
        best = _trial(study, checked.trials[checked.winner])
        measured.update(_validated(checked))
        if not checked.beats_baseline:
            measured["note"] = checked.reason
        elif (ablated := ablation_of(study, best.number)) is not None:
            measured["ablation"], ablated_config = ablated
    else:
        measured["validation"] = None
        measured["note"] = _unvalidated(best, base)
    return _profile(study, best, base, measured, ablated_config)


def _chosen(
    study: optuna.Study,
    done: list[optuna.trial.FrozenTrial],
    front: list[optuna.trial.FrozenTrial],
    base: optuna.trial.FrozenTrial | None,
    trial: int | None,
) -> optuna.trial.FrozenTrial:
    """The trial the search found best (the Pareto rule's with two objectives), or ``trial``."""
    if trial is None:
        return pareto_choice(front, base) if front else max(done, key=throughput)
    best = next((t for t in done if t.number == trial), None)
    if best is None:
        raise ConfigError(
            f"--trial {trial}: not a COMPLETE trial of {study.study_name}; pick one of "
            f"{', '.join(str(t.number) for t in done)}"
        )
    return best


def _measured(
    study: optuna.Study,
    best: optuna.trial.FrozenTrial,
    base: optuna.trial.FrozenTrial | None,
    front: list[optuna.trial.FrozenTrial],
    budget_s: float | None,
) -> dict[str, Any]:
    """The search's own evidence for ``best``: its single measurement, the runs of the
    defaults, the screening, the Pareto front."""
    baseline = throughput(base) if base is not None else None
    interval = tr.interval_record(best)
    measured: dict[str, Any] = {
        "baseline_samples_per_s": None if baseline is None else round(baseline, 2),
        "best_samples_per_s": round(throughput(best), 2),
        "speedup": None if not baseline else round(throughput(best) / baseline, 3),
        "interval": None if interval is None else asdict(interval),
        "trials": counts(study),
        "budget": None if budget_s is None else format_duration(budget_s),
        "tuning_s": round(sum(tr.measured(t, "wall_s") or 0.0 for t in study.trials), 1),
    }
    # every run of the defaults in the search (the first baseline, then the re-anchoring
    # runs): how far the first one was from the others, and the machine's drift
    measured["baseline_runs"] = [round(throughput(t), 2) for t in anchors(study)]
    effects = screening_effects(study)
    if effects:
        measured["screening"] = effects
    if front:
        measured["baseline_peak_memory_mb"] = None if base is None else base.values[1]
        measured["pareto"] = [
            {
                "trial": t.number,
                "samples_per_s": round(t.values[0], 2),
                "peak_memory_mb": t.values[1],
                "speedup": None if not baseline else round(t.values[0] / baseline, 3),
            }
            for t in front
        ]
    return measured


def _trial(study: optuna.Study, number: int) -> optuna.trial.FrozenTrial:
    """Trial ``number`` of ``study``, which a record names."""
    trials = study.get_trials(deepcopy=False)
    if not 0 <= number < len(trials):
        raise ConfigError(
            f"study {study.study_name!r}: its re-validation names trial {number}, "
            f"which it does not have; export another study or trial"
        )
    return trials[number]


def _validated(checked: ValidationRecord) -> dict[str, Any]:
    """The profile's figures from the interleaved re-measurements, not the search's best
    value (which is biased upwards: it is the maximum of many noisy measurements)."""
    won = checked.results[checked.winner]
    return {
        "best_samples_per_s": won.throughput.median,
        "baseline_samples_per_s": checked.results["baseline"].throughput.median,
        "speedup": round(won.speedup.median, 3),
        "speedup_interval": [won.speedup.low, won.speedup.high],
        "interval": asdict(won.throughput),
        "validation": {
            "rounds": len(checked.measurements["baseline"]),
            "order": checked.order,
            "results": {
                k: {
                    "trial": checked.trials[k],
                    "samples_per_s": checked.measurements[k],
                    "speedup": r.speedup.triple(),
                    "beats_baseline": r.beats_baseline,
                }
                for k, r in checked.results.items()
            },
            "failed": checked.failed,
            "after_trial": checked.after_trial,
        },
        **({} if checked.as_is is None else {"as_is": as_is_of(checked)}),
    }


def as_is_of(checked: ValidationRecord) -> dict[str, Any]:
    """The profile's ``measured.as_is``: the speedup over the user's job as it runs today
    (``speedup``), the part of it autotune's defaults give (``pin``: the allocator pin and
    whatever else ``changes`` lists), the part the tuned knobs give (``knobs``: the
    re-validation's), each ``[low, median, high]``, and the line the summary prints; or why it
    was not measured (``not_measured``)."""
    today = checked.as_is
    if today is None or today.reason:
        return {"not_measured": "" if today is None else today.reason}
    knobs = checked.speedup if checked.beats_baseline else None
    out: dict[str, Any] = {
        "line": today.line(knobs),
        "speedup": None if today.today is None else today.today.triple(),
        "pin": None if today.pin is None else today.pin.triple(),
        "knobs": None if knobs is None else knobs.triple(),
        "changes": today.changes,
        "rounds": today.rounds,
        "samples_per_s": today.measurements,
        "pinned": today.pinned,
    }
    if today.failed:
        out["failed"] = today.failed
    return out


def _unvalidated(best: optuna.trial.FrozenTrial, base: optuna.trial.FrozenTrial | None) -> str:
    if base is not None and best.number == base.number:
        return "no trial beat the baseline: keep PyTorch's defaults"
    return (
        "not re-validated: the speedup is the search's best single trial, biased "
        "upwards; run with --validate-top 3 for an interval"
    )


def limit_of(study: optuna.Study, config: TrialConfig) -> dict[str, Any] | None:
    """The study's limit measurement (``autotune.limit.probe``) for a profile of ``config``: the
    figures of the defaults and of ``config``; None when the last probe was of another
    configuration (a later run, ``--trial``), there was none, or it is not one autotune wrote
    (the profile is then exported without it)."""
    limit = load_readable(study, LimitRecord)
    if limit is None:
        return None
    probed = limit.tuned or limit.baseline
    if probed is None or probed.get("config") != config.to_dict():
        return None
    keep = ("trial", "world_size", "bounds", "breakdown", "comm", "next", "trace")
    out: dict[str, Any] = {
        label: {k: rec[k] for k in keep if k in rec}
        for label, rec in (("baseline", limit.baseline), ("tuned", limit.tuned))
        if rec is not None and "bounds" in rec
    }
    out["cost_s"] = limit.cost_s
    return out


def _profile(
    study: optuna.Study,
    best: optuna.trial.FrozenTrial,
    base: optuna.trial.FrozenTrial | None,
    measured: dict[str, Any],
    ablated_config: dict[str, Any] | None,
) -> Profile:
    """The profile of ``best`` (or of the configuration its ablation leaves)."""
    rec = record(study)
    where = f"study {study.study_name!r} trial {best.number}"
    if ablated_config is not None:
        config = TrialConfig.from_dict(ablated_config, where=f"{where} (ablated)", fix=_FIX)
    else:
        config = tr.config(best, where=where, fix=_FIX)
    if rec is None or not rec.workload or not rec.hardware:
        raise ConfigError(
            f"study {study.study_name!r}: its autotune record lacks workload or "
            f"hardware; not a study autotune wrote"
        )
    declared = rec.workload.get("global_batch")
    if config.global_batch != declared:
        measured["batch_changed"] = (
            f"global batch {config.global_batch} instead of the "
            f"workload's {declared} (--free-batch): training dynamics change; a learning rate, "
            f"warm-up or schedule tuned for {declared} may need tuning again"
        )
    if (limit := limit_of(study, config)) is not None:
        measured["limit"] = limit
    measured.update(tr.drift_attrs(best))  # within tolerance, allowed, or no verdict
    return Profile.from_config(
        config,
        study={
            "name": study.study_name,
            "best_trial": best.number,
            "baseline_trial": None if base is None else base.number,
        },
        workload=rec.workload,
        hardware=rec.hardware,
        measured=measured,
    )
