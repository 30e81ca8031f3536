"""``autotune report``: a study as one HTML page and a set of PNG figures.

Every figure comes from Optuna's own visualization module, built twice from the same call:
``optuna.visualization`` (plotly, interactive, in the HTML page) and
``optuna.visualization.matplotlib`` (the PNGs, which need no browser to make or to view).
The figures Optuna has no function for (failures by reason, where the step time goes) are
plain bar charts (``autotune.report.figures``).

The page also carries what the figures cannot: the study's workload and hardware, baseline and
best throughput, the best trials with the settings they changed, each failure with its reason,
and the profile ``autotune export`` writes for the study.
"""

from __future__ import annotations

import html
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.core.errors import ConfigError
from autotune.core.knobs import changed_knobs
from autotune.profile.export import screening_effects, study_profile
from autotune.record.study import (
    baseline_trial,
    complete,
    counts,
    failure_reasons,
    record,
)
from autotune.report.figures import (
    LIMIT_TITLE,
    failure_figures,
    html_table,
    limit_figures,
    limit_section,
)
from autotune.search.screening import verdict
from autotune.search.stop import search_lines

__all__ = ["Figure", "Report", "build", "write"]

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


#: Fewest distinct COMPLETE trials for the parameter-importance figure: below it the ranking is
#: noise (a report of 6 trials ranked bucket_cap_mb first while bf16 was the lever).
MIN_IMPORTANCE_TRIALS = 10


def _speedup(t: FrozenTrial) -> float:
    return float(t.user_attrs.get("speedup", float("nan")))


def _objective_name(study: optuna.Study, i: int = 0) -> str:
    names = study.metric_names
    return names[i] if names else "objective"


def _optuna_figures(study: optuna.Study) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(name, title, optuna.visualization function, keyword arguments) for this study."""
    multi = len(study.directions) > 1
    first = (lambda t: t.values[0]) if multi else None
    name = _objective_name(study)
    figs: list[tuple[str, str, str, dict[str, Any]]] = [
        (
            "history",
            f"Optimisation history ({name})",
            "plot_optimization_history",
            {"target": first, "target_name": name},
        ),
        (
            "speedup",
            "Speedup over the baseline, per trial",
            "plot_optimization_history",
            {"target": _speedup, "target_name": "speedup vs baseline"},
        ),
        (
            "importances",
            f"Parameter importances for {name}",
            "plot_param_importances",
            # with a target Optuna's importance evaluator assumes lower is better
            {"target": _lower_is_better(study), "target_name": name},
        ),
        (
            "by_parameter",
            f"{name} by parameter",
            "plot_slice",
            {"target": first, "target_name": name},
        ),
        ("timeline", "Trials over time, by state", "plot_timeline", {}),
    ]
    if multi:
        names = study.metric_names or [f"objective {i}" for i in range(len(study.directions))]
        figs.insert(
            1, ("pareto", "Pareto front", "plot_pareto_front", {"target_names": list(names)})
        )
    return figs


def _lower_is_better(study: optuna.Study) -> Callable[[FrozenTrial], float] | None:
    """The first objective as a target for importances (None: the study's own direction)."""
    if len(study.directions) == 1:
        return None
    sign = -1.0 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else 1.0
    return lambda t: sign * t.values[0]


def _why_not(study: optuna.Study, fn: str) -> str | None:
    """Why Optuna's figure ``fn`` would be empty for this study (None: it can be drawn)."""
    done = complete(study)
    if fn == "plot_timeline":
        return None if study.trials else "the study has no trials"
    if not done:
        return "no COMPLETE trial yet"
    distinct = len({tuple(sorted(t.params.items())) for t in done})
    if fn == "plot_param_importances" and distinct < MIN_IMPORTANCE_TRIALS:
        return (
            f"needs at least {MIN_IMPORTANCE_TRIALS} COMPLETE trials with different parameters "
            f"(this study has {distinct}; fewer rank noise); the screening table measures each "
            f"knob alone"
        )
    return None


def build(study: optuna.Study) -> Report:
    """Build every figure of ``study`` in memory (nothing is written)."""
    import matplotlib

    matplotlib.use("Agg")  # PNGs without a display
    import optuna.visualization as pv
    import optuna.visualization.matplotlib as mv

    report = Report(study)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # _lower_is_better already turns a maximised first objective into a minimised target
        warnings.filterwarnings("ignore", message="PedAnovaImportanceEvaluator computes")
        for name, title, fn, kwargs in _optuna_figures(study):
            why = _why_not(study, fn)
            if why:
                report.figures.append(Figure(name, title, skipped=why))
                continue
            fig = Figure(
                name,
                title,
                plotly=getattr(pv, fn)(study, **kwargs),
                matplotlib=getattr(mv, fn)(study, **kwargs),
            )
            _retitle(fig)
            report.figures.append(fig)
    failures = failure_reasons(study)
    if failures:
        pf, mf = failure_figures(failures)
        report.figures.append(Figure("failures", "Failed trials by reason", pf, mf))
    else:
        report.figures.append(
            Figure("failures", "Failed trials by reason", skipped="no trial failed")
        )
    drawn = limit_figures(study)
    if isinstance(drawn, str):
        report.figures.append(Figure("limit", LIMIT_TITLE, skipped=drawn))
    else:
        report.figures.append(Figure("limit", LIMIT_TITLE, *drawn))
    return report


def _retitle(fig: Figure) -> None:
    """Optuna's generic titles ("Slice Plot") become the report's; the speedup figure gets
    the baseline's level as a reference line."""
    import numpy as np

    fig.plotly.update_layout(title=fig.title)
    axes = np.atleast_1d(fig.matplotlib)
    for ax in axes.flat:  # Optuna titles some plots on the left: it would print over ours
        ax.set_title("", loc="left")
        ax.set_title("", loc="right")
    if axes.size == 1:
        axes.flat[0].set_title(fig.title)
    else:
        axes.flat[0].figure.suptitle(fig.title)
    if fig.name == "speedup":
        fig.plotly.add_hline(y=1.0, line_dash="dash", line_color="gray", annotation_text="baseline")
        axes.flat[0].axhline(1.0, linestyle="--", color="gray", label="baseline (1.0x)")
        axes.flat[0].legend(loc="best")


def _mpl_figure(obj: Any) -> Any:
    """The matplotlib Figure behind what an optuna.visualization.matplotlib call returned
    (one Axes, or an array of them for plot_slice)."""
    import numpy as np

    return np.atleast_1d(obj).flat[0].figure


def write(report: Report, out_dir: Path) -> list[Path]:
    """Write ``report.html`` and one PNG per drawn figure into ``out_dir``; return the paths."""
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for fig in report.figures:
        if fig.matplotlib is None:
            continue
        mfig = _mpl_figure(fig.matplotlib)
        path = out_dir / f"{fig.name}.png"
        mfig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(mfig)
        written.append(path)
    page = out_dir / "report.html"
    tmp = page.with_suffix(".html.tmp")
    tmp.write_text(_html(report), encoding="utf-8")
    tmp.replace(page)
    return [page, *written]


# -- the page ---------------------------------------------------------------------------


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
    was = _flat(base.user_attrs.get("config") or {}) if base is not None else {}
    changes = [f"{k} = {_value(v)}" for k, v in now.items() if k in was and was[k] != v]
    items = "".join(f"<li><code>{e(c)}</code></li>" for c in changes)
    body = f"<ul>{items}</ul>" if changes else "<p>It changes nothing: keep PyTorch's defaults.</p>"
    return f"<h2>Result</h2><p><b>{e(profile.headline())}</b></p>{body}"


def _fmt(x: Any, spec: str) -> str:
    return "" if x is None else format(x, spec)


def _summary(study: optuna.Study) -> tuple[str, FrozenTrial | None]:
    rec = record(study)
    base = baseline_trial(study)
    rows: list[list[Any]] = [
        ["study", study.study_name],
        ["trials", ", ".join(f"{v} {k}" for k, v in counts(study).items())],
    ]
    for key in ("workload", "hardware"):
        if isinstance(rec.get(key), dict):
            shown = {k: v for k, v in rec[key].items() if v is not None}
            rows.append([key, _value(shown)])
    done = complete(study)
    if base is not None:
        name = _objective_name(study)
        rows.append(["baseline", f"{base.values[0]:.1f} {name} (trial {base.number})"])
    if done and len(study.directions) == 1:
        best = study.best_trial
        rows.append(
            [
                "best single trial",
                f"{best.value:.1f} {_objective_name(study)} (trial {best.number}, "
                f"{_fmt(best.user_attrs.get('speedup'), '.2f')}x in the search, biased upwards "
                f"until re-measured): {_changed(best, base)}",
            ]
        )
    rows.extend([k, v] for k, v in search_lines(study))
    for item in rec.get("left_out", []):
        rows.append(["left out", item])
    return html_table(["", ""], rows), base


def _html(report: Report) -> str:
    import plotly.offline

    study = report.study
    e = html.escape
    summary, base = _summary(study)
    ranked = sorted(complete(study), key=lambda t: -(t.values[0] if t.values else 0))
    best_rows = [
        [
            t.number,
            _fmt(t.values[0], ".1f"),
            _fmt(t.user_attrs.get("speedup"), ".3f"),
            _fmt(t.user_attrs.get("window_s"), ".1f"),
            _fmt(t.user_attrs.get("overhead_s"), ".1f"),
            _changed(t, base),
        ]
        for t in ranked[:TOP]
    ]
    failed = study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
    fail_rows = [
        [
            t.number,
            t.user_attrs.get("reason", "unknown"),
            t.user_attrs.get("reason_detail", ""),
            _changed(t, base),
            t.user_attrs.get("logs", ""),
        ]
        for t in failed
    ]
    parts = [
        f"<h1>autotune report: {e(study.study_name)}</h1>",
        _result(study, base),
        limit_section(study),
        "<h2>The study</h2>",
        summary,
        f"<h2>Best {min(TOP, len(ranked))} of {len(ranked)} COMPLETE trials</h2>",
        html_table(
            ["trial", _objective_name(study), "speedup", "window s", "overhead s", "changed"],
            best_rows,
        ),
    ]
    effects = screening_effects(study)
    if effects:
        ranked_fx = sorted(effects.items(), key=lambda kv: -(kv[1]["speedup"] or 0.0))
        parts.append("<h2>Screening: each knob moved alone from the defaults</h2>")
        parts.append(
            html_table(
                ["knob", "speedup vs the defaults", "trial's noise (±)", "verdict"],
                [
                    [k, _fmt(x["speedup"], ".3f"), _fmt(x.get("noise"), ".1%"), verdict(x)]
                    for k, x in ranked_fx
                ],
            )  # fmt: skip
        )
    for fig in report.figures:
        parts.append(f'<h2 id="{fig.name}">{e(fig.title)}</h2>')
        if fig.plotly is None:
            parts.append(f"<p class=skipped>Not drawn: {e(fig.skipped or '')}.</p>")
        else:
            parts.append(fig.plotly.to_html(full_html=False, include_plotlyjs=False))
    parts.append(f"<h2>Failed trials ({len(failed)})</h2>")
    parts.append(html_table(["trial", "reason", "detail", "changed", "rank logs"], fail_rows))
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
        "</head><body>" + "\n".join(parts) + "</body></html>"
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
