"""The report's HTML page. The first screen is the result: the profile's speedup with its 95 %
interval, the settings it changes with what each was measured to contribute (the ablation's
paired ratio, or the screening's effect alone), and where its step time goes with the one-line
advice. The evidence follows: the study (workload, hardware, baseline, best single trial, the
first measurement and why the search stopped; the knobs left out on this backend folded away),
how far from the limit, the best trials, the screening's effects, the figures (every speedup
with its interval), the failed trials with their reasons and logs, and the exported profile.
(``autotune.report.report`` builds the figures and writes the files.)"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.core.errors import ConfigError
from autotune.core.knobs import changed_knobs
from autotune.core.values import number, precise, ratio_interval, speedup, speedup_interval
from autotune.profile.export import screening_effects, study_profile
from autotune.record import trial as tr
from autotune.record.attrs import load_screening
from autotune.record.study import baseline_trial, complete, counts, record
from autotune.report.figures import html_table, limit_bar, limit_section
from autotune.search.screening import verdict
from autotune.search.stop import search_lines

__all__ = ["TOP", "Figure", "Report", "html_page", "objective_name"]

#: How many of the best trials the page lists.
TOP = 10


@dataclass
class Figure:
    """One figure of the report: built, or left out with the reason."""

    name: str
    title: str
    plotly: Any = None
    matplotlib: Any = None
    skipped: str | None = None


@dataclass
class Report:
    study: optuna.Study
    figures: list[Figure] = field(default_factory=list)


def objective_name(study: optuna.Study, i: int = 0) -> str:
    names = study.metric_names
    return names[i] if names else "objective"


def _value(v: Any) -> str:
    """A value for people (``core.values.number``: 240.7 and 54,350, not 240.6574923482821 or
    5.435e+04), ``k: v`` pairs for a mapping (not a Python repr)."""
    if isinstance(v, float):
        return number(v)
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_value(x)}" for k, x in v.items())
    return str(v)


def _changed(t: FrozenTrial, baseline: FrozenTrial | None) -> str:
    if baseline is None:
        return ", ".join(f"{k}={_value(v)}" for k, v in t.params.items())
    diff = changed_knobs(t.params, baseline.params)
    return ", ".join(f"{k}={_value(v)}" for k, v in diff.items()) or "defaults"


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _result(study: optuna.Study, base: FrozenTrial | None) -> str:
    """The report's first screen, what the user acts on: the exported profile's speedup with
    its interval, the settings it changes from the defaults with their measured contributions,
    and where its step time goes with the advice; the evidence follows."""
    e = html.escape
    if not complete(study) or len(study.directions) > 1:
        return ""
    try:
        profile = study_profile(study)
    except ConfigError as err:
        return f"<h2>Result</h2><p>No profile: {e(str(err))}</p>"
    now = _flat(profile.trial_config().to_dict())
    was = _flat((tr.config_dict(base) or {}) if base is not None else {})
    changes = {k: v for k, v in now.items() if k in was and was[k] != v}
    ablation = profile.measured.get("ablation") or {}
    return (
        f"<h2>Result</h2>{_headline(profile.measured, profile.headline())}"
        f"{_knob_table(study, changes, ablation.get('knobs') or {})}{limit_bar(study)}"
    )


def _headline(m: dict[str, Any], said: str) -> str:
    """The speedup in large type with its 95 % interval: the re-validation's, or else the
    trial's own windows' (against one run of the defaults); then what the profile notes
    (not re-validated, chosen by hand). No speedup, or the defaults kept: the headline."""
    e = html.escape
    sp, ci, own = m.get("speedup"), m.get("speedup_interval"), m.get("interval")
    if not isinstance(sp, (int, float)) or ci == [1.0, 1.0]:
        return f"<p class=headline><b>{e(said)}</b></p>"
    interval = ""
    note = m.get("note")
    note_html = f"<p>{e(note)}</p>" if isinstance(note, str) and note else ""
    if m.get("validation") and _numbers(ci, 2):
        rounds = (m.get("validation") or {}).get("rounds")
        if not precise(sp, ci[0], ci[1]):  # no headline figure: say what it would take
            said = speedup_interval(sp, ci[0], ci[1], rounds if isinstance(rounds, int) else None)
            return (
                f"<p class=headline><b>Re-validated against the defaults: {e(said)}</b></p>"
                + _as_today(m.get("as_is"))
                + note_html
            )
        interval = f"{ratio_interval(sp, ci[0], ci[1])}, {rounds} interleaved rounds"
    elif isinstance(own, dict) and _numbers([own.get(k) for k in ("median", "low", "high")], 3):
        median = own["median"]
        if median > 0:
            low, high = sp * own["low"] / median, sp * own["high"] / median
            interval = f"{ratio_interval(sp, low, high)}, the trial's own windows"
    ci_html = f" <span class=ci>({e(interval)})</span>" if interval else ""
    return (
        f"<p class=headline><span class=big>{speedup(sp)}</span> the defaults{ci_html}</p>"
        + _as_today(m.get("as_is"))
        + note_html
    )


def _as_today(as_is: Any) -> str:
    """The comparison with the user's job as it runs today (``measured.as_is``): its line, or
    why it was not measured; nothing when the profile has none (an older profile)."""
    if not isinstance(as_is, dict):
        return ""
    line, why = as_is.get("line"), as_is.get("not_measured")
    if isinstance(line, str) and line:
        return f"<p class=headline>{html.escape(line)}</p>"
    if isinstance(why, str) and why:
        return f"<p>Your job as it runs today: not measured ({html.escape(why)})</p>"
    return ""


def _numbers(xs: Any, n: int) -> bool:
    return (
        isinstance(xs, list)
        and len(xs) == n
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
    )


def _knob_table(study: optuna.Study, changes: dict[str, Any], knobs: dict[str, Any]) -> str:
    """The settings the profile changes (config path = value) with what each was measured to
    contribute; then those the ablation dropped. Nothing changed: one line that says so."""
    if not changes and not knobs:
        return "<p>It changes nothing: keep PyTorch's defaults.</p>"
    alone = _screened(study)
    rows, used = [], set()
    for path, value in changes.items():
        name = next((k for k in knobs if k in path.split(".")), None)
        used.add(name)
        if name is not None:
            rows.append([f"{path} = {_value(value)}", _share(knobs[name]), "kept"])
        else:
            found = next((x for k, x in alone.items() if k in path.split(".")), "not measured")
            rows.append([f"{path} = {_value(value)}", found, "not ablated"])
    for name, c in knobs.items():
        if name not in used and not c.get("kept"):
            rows.append([name, _share(c), "dropped: back to its default"])
    note = (
        "<p class=note>Contribution: the profile's speedup over itself without that setting, "
        "interleaved (ablation, 95 % interval); <i>alone</i>: the setting moved alone from "
        "the defaults (screening).</p>"
    )
    return html_table(["setting", "measured contribution", "ablation"], rows) + note


def _share(c: dict[str, Any]) -> str:
    """An ablated knob's contribution: ``1.21x [1.15, 1.27]``, or why it was not measured."""
    sp = c.get("speedup")
    if _numbers(sp, 3):
        return ratio_interval(sp[1], sp[0], sp[2])
    return str(c.get("why") or "not measured")


def _screened(study: optuna.Study) -> dict[str, str]:
    """Each knob the screening moved alone, with its effect in words."""
    out: dict[str, str] = {}
    for x in (load_screening(study) or {}).values():
        if x.speedup is None:
            continue
        noise = None if x.interval is None else x.interval.rel_half_width
        effect = {"speedup": x.speedup, "helps": x.helps, "noise": noise}
        said = verdict({**effect, "on_top": x.on_top, "gain": x.gain})
        pm = "" if noise is None else f" ±{noise:.0%}"
        how = f"alone {speedup(x.speedup)}{pm}"
        if x.on_top is not None:
            how = f"on top of {x.on_top} {_fmt(x.gain, '.2f')}x{pm}"
        for knob in x.moves:
            out.setdefault(knob, f"{how} (screening: {said})")
    return out


def _fmt(x: Any, spec: str) -> str:
    return "" if x is None else format(x, spec)


def _summary(study: optuna.Study) -> tuple[str, FrozenTrial | None]:
    try:
        rec = record(study)
    except ConfigError as err:
        return html_table(["", ""], [["study", f"unreadable: {err}"]]), None
    base = baseline_trial(study)
    rows: list[list[Any]] = [
        ["study", study.study_name],
        ["trials", ", ".join(f"{v} {k}" for k, v in counts(study).items())],
    ]
    for key, value in (("workload", rec.workload), ("hardware", rec.hardware)) if rec else ():
        shown = {k: v for k, v in value.items() if v is not None}
        rows.append([key, _value(shown)])
    done = complete(study)
    if base is not None:
        name = objective_name(study)
        rows.append(["baseline", f"{number(base.values[0])} {name} (trial {base.number})"])
    if done and len(study.directions) == 1:
        best = study.best_trial
        rows.append(
            [
                "best single trial",
                f"{number(best.value)} {objective_name(study)} (trial {best.number}, "
                f"{_fmt(tr.speedup(best), '.2f')}x in the search, biased upwards "
                f"until re-measured): {_changed(best, base)}",
            ]
        )
    rows.extend([k, v] for k, v in search_lines(study))
    return html_table(["", ""], rows) + _left_out(rec.left_out if rec else []), base


def _left_out(items: list[str]) -> str:
    """The knobs left out on this backend/device, each with its reason, folded away: a list
    the user rarely needs, not the report's first screen."""
    if not items:
        return ""
    e = html.escape
    lis = "".join(f"<li>{e(str(x))}</li>" for x in items)
    return (
        f"<details class=leftout><summary>Left out on this backend/device: {len(items)} "
        f"knob(s), each with its reason (no trial is spent on a no-op)</summary>"
        f"<ul>{lis}</ul></details>"
    )


def html_page(report: Report) -> str:
    """The whole page, with plotly's script inlined (it opens without a network)."""
    import plotly.offline

    study = report.study
    e = html.escape
    summary, base = _summary(study)
    parts = [
        f"<h1>autotune report: {e(study.study_name)}</h1>",
        _result(study, base),
        "<h2>The study</h2>",
        summary,
        limit_section(study),
        _best(study, base),
        _screening(study),
        *_figures(report),
        _failed(study, base),
    ]
    note = _profile_note(study)
    if note:
        parts.append(f"<h2>Exported profile</h2><pre>{e(note)}</pre>")
    css = (
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
        "padding:3px 8px;text-align:left;vertical-align:top;font-size:14px}"
        ".skipped{color:#777}pre{background:#f6f6f6;padding:1em}"
        ".headline{font-size:18px;margin:.3em 0}.big{font-size:32px;font-weight:bold}"
        ".ci{color:#444}.note{font-size:12px;color:#555}.advice{font-weight:bold}"
        ".limitrow{display:flex;align-items:center;margin:3px 0}"
        ".limitlabel{width:160px;font-size:13px}.bar{flex:1;display:flex;height:18px}"
        ".part{display:block;height:100%}.legend{font-size:12px;margin:2px 0}"
        ".key{display:inline-block;width:10px;height:10px;margin:0 4px 0 10px}"
        "details{margin:.5em 0}summary{cursor:pointer;color:#444}"
    )
    return (
        "<!doctype html><html><head><meta charset=utf-8>"
        f"<title>autotune report: {e(study.study_name)}</title><style>{css}</style>"
        f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>'
        "</head><body>" + "\n".join(p for p in parts if p) + "</body></html>"
    )


def _best(study: optuna.Study, base: FrozenTrial | None) -> str:
    """The ``TOP`` fastest COMPLETE trials with what they changed."""
    ranked = sorted(complete(study), key=lambda t: -(t.values[0] if t.values else 0))
    rows = [
        [
            t.number,
            _fmt(t.values[0], ".1f"),
            _fmt(tr.speedup(t), ".3f"),
            _fmt(tr.measured(t, "window_s"), ".1f"),
            _fmt(tr.measured(t, "overhead_s"), ".1f"),
            _changed(t, base),
        ]
        for t in ranked[:TOP]
    ]
    head = ["trial", objective_name(study), "speedup", "window s", "overhead s", "changed"]
    return f"<h2>Best {min(TOP, len(ranked))} of {len(ranked)} COMPLETE trials</h2>" + html_table(
        head, rows
    )


def _screening(study: optuna.Study) -> str:
    """Each screened knob's effect and its verdict ('' when the study was not screened)."""
    effects = screening_effects(study)
    if not effects:
        return ""
    ranked = sorted(effects.items(), key=lambda kv: -(kv[1]["speedup"] or 0.0))
    rows = [
        [
            k,
            x.get("on_top") or "",
            _fmt(x["speedup"], ".3f"),
            _fmt(x.get("gain"), ".3f"),
            _fmt(x.get("noise"), ".1%"),
            verdict(x),
        ]
        for k, x in ranked
    ]
    head = ["knob", "on top of", "speedup vs the defaults", "gain on top", "trial's noise (±)"]
    return "<h2>Screening: each knob moved alone or on top of a lever</h2>" + html_table(
        [*head, "verdict"], rows
    )


def _figures(report: Report) -> list[str]:
    out = []
    for fig in report.figures:
        out.append(f'<h2 id="{fig.name}">{html.escape(fig.title)}</h2>')
        if fig.plotly is None:
            out.append(f"<p class=skipped>Not drawn: {html.escape(fig.skipped or '')}.</p>")
        else:
            out.append(fig.plotly.to_html(full_html=False, include_plotlyjs=False))
    return out


def _failed(study: optuna.Study, base: FrozenTrial | None) -> str:
    """Every FAIL trial: its reason, the detail, what it changed and its rank logs."""
    failed = study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
    rows = [
        [t.number, tr.reason(t), tr.reason_detail(t), _changed(t, base), tr.logs(t)] for t in failed
    ]
    return f"<h2>Failed trials ({len(failed)})</h2>" + html_table(
        ["trial", "reason", "detail", "changed", "rank logs"], rows
    )


def _profile_note(study: optuna.Study) -> str | None:
    """The profile ``autotune export`` would write for the study, as YAML (or why there is
    none: a study from elsewhere may hold what autotune refuses to export)."""
    if not complete(study) or len(study.directions) > 1:
        return None  # a multi-objective study exports its Pareto set, not one profile
    try:
        return study_profile(study).to_yaml()
    except ConfigError as e:
        return f"# not exported: {e}\n"
