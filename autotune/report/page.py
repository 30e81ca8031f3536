"""The report's HTML page: the result first (the profile's headline and the settings it
changes), how far from the limit, the study (workload, hardware, baseline, best single trial,
the first measurement and why the search stopped), the best trials, the screening's effects,
the figures, the failed trials with their reasons and logs, and the exported profile.
(``autotune.report.report`` builds the figures and writes the files.)"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.core.errors import ConfigError
from autotune.core.knobs import changed_knobs
from autotune.profile.export import screening_effects, study_profile
from autotune.record import trial as tr
from autotune.record.study import baseline_trial, complete, counts, record
from autotune.report.figures import html_table, limit_section
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
    """A value for people: 4 significant digits for a float (240.7, not 240.6574923482821),
    ``k: v`` pairs for a mapping (not a Python repr)."""
    if isinstance(v, float):
        return format(v, ".4g")
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
    its interval and the settings it changes from the defaults; the evidence follows."""
    e = html.escape
    if not complete(study) or len(study.directions) > 1:
        return ""
    try:
        profile = study_profile(study)
    except ConfigError as err:
        return f"<h2>Result</h2><p>No profile: {e(str(err))}</p>"
    now = _flat(profile.trial_config().to_dict())
    was = _flat((tr.config_dict(base) or {}) if base is not None else {})
    changes = [f"{k} = {_value(v)}" for k, v in now.items() if k in was and was[k] != v]
    items = "".join(f"<li><code>{e(c)}</code></li>" for c in changes)
    body = f"<ul>{items}</ul>" if changes else "<p>It changes nothing: keep PyTorch's defaults.</p>"
    return f"<h2>Result</h2><p><b>{e(profile.headline())}</b></p>{body}"


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
        rows.append(["baseline", f"{base.values[0]:.1f} {name} (trial {base.number})"])
    if done and len(study.directions) == 1:
        best = study.best_trial
        rows.append(
            [
                "best single trial",
                f"{best.value:.1f} {objective_name(study)} (trial {best.number}, "
                f"{_fmt(tr.speedup(best), '.2f')}x in the search, biased upwards "
                f"until re-measured): {_changed(best, base)}",
            ]
        )
    rows.extend([k, v] for k, v in search_lines(study))
    for item in rec.left_out if rec else []:
        rows.append(["left out", item])
    return html_table(["", ""], rows), base


def html_page(report: Report) -> str:
    """The whole page, with plotly's script inlined (it opens without a network)."""
    import plotly.offline

    study = report.study
    e = html.escape
    summary, base = _summary(study)
    parts = [
        f"<h1>autotune report: {e(study.study_name)}</h1>",
        _result(study, base),
        limit_section(study),
        "<h2>The study</h2>",
        summary,
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
    rows = [[k, _fmt(x["speedup"], ".3f"), _fmt(x.get("noise"), ".1%"), verdict(x)]
            for k, x in ranked]  # fmt: skip
    return "<h2>Screening: each knob moved alone from the defaults</h2>" + html_table(
        ["knob", "speedup vs the defaults", "trial's noise (±)", "verdict"], rows
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
    rows = [[t.number, tr.reason(t), tr.reason_detail(t), _changed(t, base), tr.logs(t)]
            for t in failed]  # fmt: skip
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
