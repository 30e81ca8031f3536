"""The profile of a study: which configuration it exports, with the evidence, and writing it.

The re-validation's winner when there is one (``validation.revalidate``), else the best COMPLETE
trial; for ``--objective throughput,memory`` the Pareto member ``PARETO_RULE`` picks; or a trial
chosen by hand (``autotune export --trial N``). Called by ``tuner.run`` at the end of a run
(whatever stopped it) and by ``autotune export``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna

from autotune.core.config import TrialConfig
from autotune.core.errors import ConfigError
from autotune.definition.durations import format_duration
from autotune.limit.probe import LIMIT_ATTR, summary_line
from autotune.profile.profile import Profile
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
    combined) and, when known, its trial's noise (the 95 % interval's relative half-width).
    The study may be someone else's: anything but numbers and flags is left out."""
    raw = study.user_attrs.get("screening")
    out: dict[str, dict[str, Any]] = {}
    if not isinstance(raw, dict):
        return out
    for label, x in raw.items():
        if not isinstance(label, str) or not isinstance(x, dict):
            continue
        sp = x.get("speedup")
        ok = isinstance(sp, (int, float)) and not isinstance(sp, bool)
        out[label] = {"speedup": sp if ok else None, "helps": x.get("helps") is True}
        ci = x.get("interval")
        noise = ci.get("rel_half_width") if isinstance(ci, dict) else None
        if isinstance(noise, (int, float)) and not isinstance(noise, bool) and 0 <= noise < 10:
            out[label]["noise"] = round(float(noise), 4)
    return out


def ablation_of(study: optuna.Study, number: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The ablation of trial ``number`` as the profile records it (each changed knob: its
    value, its share of the gain with the interval, kept or dropped) and the configuration it
    leaves; None when that trial was not ablated. Someone else's record is read with care:
    only numbers, flags and text pass."""
    rec = study.user_attrs.get("ablation")
    if not isinstance(rec, dict) or rec.get("trial") != number:
        return None
    raw = rec.get("contributions")
    if not isinstance(raw, dict) or not isinstance(rec.get("config"), dict):
        return None
    out: dict[str, Any] = {}
    for k, c in raw.items():
        if not isinstance(k, str) or not isinstance(c, dict):
            continue
        sp = c.get("speedup")
        nums = isinstance(sp, list) and all(isinstance(x, (int, float)) for x in sp)
        entry: dict[str, Any] = {"kept": c.get("kept") is True}
        if nums and len(sp) == 3:
            entry["speedup"] = [round(float(x), 4) for x in sp]
        if isinstance(c.get("why"), str):
            entry["why"] = c["why"]
        out[k] = entry
    summary = {"rounds": rec.get("rounds"), "knobs": out, "together": rec.get("together") is True}
    joint = rec.get("joint")
    if isinstance(joint, dict) and isinstance(joint.get("knobs"), list):
        sp = joint.get("speedup")
        summary["joint"] = {
            "knobs": [k for k in joint["knobs"] if isinstance(k, str)],
            "kept_back": joint.get("kept_back") is True,
        }
        if isinstance(sp, list) and len(sp) == 3 and all(isinstance(x, (int, float)) for x in sp):
            summary["joint"]["speedup"] = [round(float(x), 4) for x in sp]
    return summary, rec["config"]


def screening_note(study: optuna.Study) -> str:
    """The screening's knob effects as a Markdown table for the dashboard's note ('' when the
    study was not screened)."""
    effects = study.user_attrs.get("screening")
    if not isinstance(effects, dict) or not effects:
        return ""
    rows = ["", "## Screening: each knob moved alone from the defaults", ""]
    rows += ["| knob | trial | state | speedup | helps |", "| --- | --- | --- | --- | --- |"]
    for x in effects.values():
        if not isinstance(x, dict):
            continue
        sp = x.get("speedup")
        shown = f"{sp:.3f}x" if isinstance(sp, (int, float)) else "-"
        row = [x.get("label"), x.get("trial"), x.get("state"), shown, x.get("helps")]
        rows.append("| " + " | ".join(str(v).replace("|", "/") for v in row) + " |")
    return "\n".join(rows) + "\n"


def study_profile(
    study: optuna.Study, *, budget_s: float | None = None, trial: int | None = None
) -> Profile:
    """The profile of ``study``: the re-validation's winner when there is one, else the best
    COMPLETE trial (with ``--objective throughput,memory``: chosen from the Pareto front, see
    ``pareto_choice``), or trial number ``trial``; with the evidence in ``measured``.

    The study may come from someone else's database: records that are not what autotune
    writes are a ConfigError naming the study, never a traceback (and the profile itself is
    checked by ``Profile``'s strict rules, its env by the allowlist)."""
    try:
        return _study_profile(study, budget_s=budget_s, trial=trial)
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(
            f"study {study.study_name!r}: its records are not what autotune writes "
            f"({type(e).__name__}: {e}); export another study or trial"
        ) from None


def limit_of(study: optuna.Study, config: TrialConfig) -> dict[str, Any] | None:
    """The study's limit measurement (``autotune.limit.probe``) for a profile of ``config``: the
    figures of the defaults and of ``config``; None when the last probe was of another
    configuration (a later run, ``--trial``) or there was none."""
    limit = study.user_attrs.get(LIMIT_ATTR)
    if not isinstance(limit, dict):
        return None
    probed = limit.get("tuned") or limit.get("baseline")
    if not isinstance(probed, dict) or probed.get("config") != config.to_dict():
        return None
    keep = ("trial", "world_size", "bounds", "breakdown", "comm", "next", "trace")
    out = {
        label: {k: rec[k] for k in keep if k in rec}
        for label in ("baseline", "tuned")
        if isinstance(rec := limit.get(label), dict) and "bounds" in rec
    }
    out["cost_s"] = limit.get("cost_s")
    return out


def _study_profile(study: optuna.Study, *, budget_s: float | None, trial: int | None) -> Profile:
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
    best = pareto_choice(front, base) if multi else max(done, key=throughput)
    if trial is not None:
        best = next((t for t in done if t.number == trial), None)
        if best is None:
            raise ConfigError(
                f"--trial {trial}: not a COMPLETE trial of {study.study_name}; pick one of "
                f"{', '.join(str(t.number) for t in done)}"
            )
    baseline = throughput(base) if base is not None else None
    measured: dict[str, Any] = {
        "baseline_samples_per_s": None if baseline is None else round(baseline, 2),
        "best_samples_per_s": round(throughput(best), 2),
        "speedup": None if not baseline else round(throughput(best) / baseline, 3),
        "interval": best.user_attrs.get("interval"),
        "trials": counts(study),
        "budget": None if budget_s is None else format_duration(budget_s),
        "tuning_s": round(sum(t.user_attrs.get("wall_s", 0.0) for t in study.trials), 1),
    }
    # every run of the defaults in the search (the first baseline, then the re-anchoring
    # runs): how far the first one was from the others, and the machine's drift
    measured["baseline_runs"] = [round(throughput(t), 2) for t in anchors(study)]
    effects = screening_effects(study)
    if effects:
        measured["screening"] = effects
    if multi:
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
    checked = None if trial is not None or multi else validation(study)
    ablated_config: dict[str, Any] | None = None
    if trial is not None:
        measured["validation"] = None
        measured["note"] = f"trial {trial}, chosen by hand (autotune export --trial)"
    elif multi:
        measured["validation"] = None
        measured["note"] = (
            f"--objective throughput,memory: {PARETO_RULE} ({len(front)} on the front, listed "
            f"in pareto; `autotune export --trial N` writes another); not re-validated"
        )
    elif checked and base is not None:
        # The choice made from the interleaved re-measurements, not the search's best value
        # (which is biased upwards: it is the maximum of many noisy measurements).
        winner = checked["winner"]
        number = checked["trials"][winner]
        best = study.trials[number]
        results = checked["results"]
        speedup = results[winner]["speedup"]
        measured.update(
            best_samples_per_s=results[winner]["throughput"]["median"],
            baseline_samples_per_s=results["baseline"]["throughput"]["median"],
            speedup=round(speedup["median"], 3),
            speedup_interval=[speedup["low"], speedup["high"]],
            interval=results[winner]["throughput"],
            validation={
                "rounds": len(checked["measurements"]["baseline"]),
                "order": checked["order"],
                "results": {
                    k: {
                        "trial": checked["trials"][k],
                        "samples_per_s": checked["measurements"][k],
                        "speedup": [r["speedup"]["low"], r["speedup"]["median"],
                                    r["speedup"]["high"]],
                        "beats_baseline": r["beats_baseline"],
                    }
                    for k, r in results.items()
                },
                "failed": checked.get("failed", {}),
                "after_trial": checked["after_trial"],
            },
        )  # fmt: skip
        if not checked["beats_baseline"]:
            measured["note"] = checked["reason"]
        else:
            ablated = ablation_of(study, best.number)
            if ablated is not None:
                measured["ablation"], ablated_config = ablated
    else:
        measured["validation"] = None
        if base is not None and best.number == base.number:
            measured["note"] = "no trial beat the baseline: keep PyTorch's defaults"
        else:
            measured["note"] = (
                "not re-validated: the speedup is the search's best single trial, biased "
                "upwards; run with --validate-top 3 for an interval"
            )
    rec = record(study)
    where = f"study {study.study_name!r} trial {best.number}"
    config = TrialConfig.from_dict(
        ablated_config or best.user_attrs.get("config"), where=f"{where} (ablated)"
    )
    if not isinstance(rec.get("workload"), dict) or not isinstance(rec.get("hardware"), dict):
        raise ConfigError(f"study {study.study_name!r}: its autotune record lacks workload or "
                          f"hardware; not a study autotune wrote")  # fmt: skip
    declared = rec["workload"].get("global_batch")
    if config.global_batch != declared:
        measured["batch_changed"] = (
            f"global batch {config.global_batch} instead of the "
            f"workload's {declared} (--free-batch): training dynamics change; a learning rate, "
            f"warm-up or schedule tuned for {declared} may need tuning again"
        )
    if (limit := limit_of(study, config)) is not None:
        measured["limit"] = limit
    for key in ("numerics_drift", "numerics_unjudged"):  # within tolerance, allowed, or no verdict
        if key in best.user_attrs:
            measured[key] = best.user_attrs[key]
    return Profile.from_config(
        config,
        study={
            "name": study.study_name,
            "best_trial": best.number,
            "baseline_trial": None if base is None else base.number,
        },
        workload=rec["workload"],
        hardware=rec["hardware"],
        measured=measured,
    )
