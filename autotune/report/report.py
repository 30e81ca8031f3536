"""``autotune report``: a study as one HTML page and a set of PNG figures.

Most figures come from Optuna's own visualization module, built twice from the same call:
``optuna.visualization`` (plotly, interactive, in the HTML page) and
``optuna.visualization.matplotlib`` (the PNGs, which need no browser to make or to view).
The figures Optuna has no function for are the report's own (``autotune.report.figures``):
every trial's speedup with its 95 % interval as error bars, and the re-validation's (Optuna's
history plots points alone), failures by reason and where the step time goes.

The page also carries what the figures cannot: the study's workload and hardware, baseline and
best throughput, the best trials with the settings they changed, each failure with its reason,
and the profile ``autotune export`` writes for the study.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.core.files import replace_whole
from autotune.record import trial as tr
from autotune.record.study import complete, failure_reasons
from autotune.report.figures import (
    LIMIT_TITLE,
    SPEEDUP_TITLE,
    failure_figures,
    limit_figures,
    speedup_figures,
)
from autotune.report.page import Figure, Report, html_page, objective_name

__all__ = ["Figure", "Report", "build", "write"]

#: Fewest distinct COMPLETE trials for the parameter-importance figure: below it the ranking is
#: noise (a report of 6 trials ranked bucket_cap_mb first while bf16 was the lever).
MIN_IMPORTANCE_TRIALS = 10


def _optuna_figures(study: optuna.Study) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(name, title, optuna.visualization function, keyword arguments) for this study."""
    multi = len(study.directions) > 1
    first = (lambda t: t.values[0]) if multi else None
    name = objective_name(study)
    figs: list[tuple[str, str, str, dict[str, Any]]] = [
        (
            "history",
            f"Optimisation history ({name})",
            "plot_optimization_history",
            {"target": first, "target_name": name},
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
    distinct = len({tr.point(t) for t in done})
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
    # a study's texts (a stored reason, a metric's name) are drawn as they are: `$...$` in one
    # is not mathtext (a malformed one raised a traceback after a figure was written)
    matplotlib.rcParams["text.parse_math"] = False
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
    drawn = speedup_figures(study)
    at = 2 if len(study.directions) > 1 else 1  # after the history (and the Pareto front)
    if isinstance(drawn, str):
        report.figures.insert(at, Figure("speedup", SPEEDUP_TITLE, skipped=drawn))
    else:
        report.figures.insert(at, Figure("speedup", SPEEDUP_TITLE, *drawn))
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
    """Optuna's generic titles ("Slice Plot") become the report's."""
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


def _mpl_figure(obj: Any) -> Any:
    """The matplotlib Figure behind what an optuna.visualization.matplotlib call returned
    (one Axes, or an array of them for plot_slice)."""
    import numpy as np

    return np.atleast_1d(obj).flat[0].figure


#: How each figure is saved.
_PNG = {"format": "png", "dpi": 100, "bbox_inches": "tight"}


def write(report: Report, out_dir: Path) -> list[Path]:
    """Write ``report.html`` and one PNG per drawn figure into ``out_dir``; return the paths.
    Each file is written to a new temporary file and renamed over its name, so a link planted
    under that name (to a file of the user's elsewhere) is replaced, never written through."""
    import matplotlib.pyplot as plt

    drawn = [
        (fig.name, _mpl_figure(fig.matplotlib))
        for fig in report.figures
        if fig.matplotlib is not None
    ]
    try:
        text = html_page(report).encode("utf-8")  # first: a study it cannot read writes nothing
        out_dir.mkdir(parents=True, exist_ok=True)
        written = [
            replace_whole(
                out_dir / f"{name}.png", lambda f, m=mfig: m.savefig(f, **_PNG), ordinary_mode=True
            )
            for name, mfig in drawn
        ]
        page = replace_whole(out_dir / "report.html", lambda f: f.write(text), ordinary_mode=True)
    finally:
        for _, mfig in drawn:
            plt.close(mfig)
    return [page, *written]
