"""The report's figures that Optuna has no function for, each drawn in plotly (the page) and in
matplotlib (the PNG): failed trials by reason, and where the step time goes (the limit probe,
``autotune.limit.probe``) with the section of the page that gives its figures."""

from __future__ import annotations

import html
from collections import Counter
from typing import Any

import optuna

from autotune.limit.probe import summary_line
from autotune.record.attrs import LimitRecord, load_readable

__all__ = ["LIMIT_TITLE", "failure_figures", "html_table", "limit_figures", "limit_section"]

LIMIT_TITLE = "Where the step time goes"
#: The parts of a DDP step, in the order they happen, with their colours.
PARTS = {
    "data": ("data loading", "#9467bd"),
    "forward": ("forward", "#1f77b4"),
    "backward": ("backward", "#2ca02c"),
    "exposed_comm": ("communication not hidden", "#d62728"),
    "optimizer": ("optimizer", "#ff7f0e"),
}
LABELS = {"baseline": "defaults", "tuned": "tuned"}


def html_table(header: list[str], rows: list[list[Any]]) -> str:
    """An HTML table of ``rows`` under ``header``, every cell escaped (None: empty)."""
    e = html.escape
    head = "".join(f"<th>{e(str(h))}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{e('' if c is None else str(c))}</td>" for c in r) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def failure_figures(failures: Counter[str]) -> tuple[Any, Any]:
    """Failures by reason as a bar chart, in plotly and in matplotlib."""
    import matplotlib.pyplot as plt
    import plotly.graph_objects as go

    ranked = failures.most_common()
    reasons, counts = [r for r, _ in ranked], [c for _, c in ranked]
    pf = go.Figure(go.Bar(x=reasons, y=counts, marker_color="#d62728"))
    pf.update_layout(title="Failed trials by reason", xaxis_title="reason", yaxis_title="trials")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(reasons, counts, color="#d62728")
    ax.set_title("Failed trials by reason")
    ax.set_xlabel("reason")
    ax.set_ylabel("trials")
    ax.yaxis.get_major_locator().set_params(integer=True)
    return pf, ax


def _probes(study: optuna.Study) -> dict[str, dict[str, Any]]:
    """The study's probed configurations that have a breakdown (a study from elsewhere may
    hold anything under the attribute: what is not a probe record is left out)."""
    limit = load_readable(study, LimitRecord)
    if limit is None:
        return {}
    out = {}
    for label, rec in limit.probes().items():
        if label in LABELS and isinstance(rec.get("breakdown"), dict):
            parts = rec["breakdown"]
            if all(isinstance(parts.get(p), (int, float)) for p in PARTS):
                out[label] = rec
    return out


def limit_figures(study: optuna.Study) -> tuple[Any, Any] | str:
    """Milliseconds per optimizer step of each probed configuration, stacked by part (plotly,
    matplotlib); or why there is nothing to draw."""
    probes = _probes(study)
    if not probes:
        return "the run did not measure the limit (--no-limit, a budget too short, or an older run)"
    import matplotlib.pyplot as plt
    import plotly.graph_objects as go

    rows = [LABELS[k] for k in probes]
    pf = go.Figure()
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.6 * len(rows)))
    left = [0.0] * len(rows)
    for part, (name, colour) in PARTS.items():
        ms = [probes[k]["breakdown"][part] * 1e3 for k in probes]
        pf.add_trace(go.Bar(y=rows, x=ms, name=name, orientation="h", marker_color=colour))
        ax.barh(rows, ms, left=left, label=name, color=colour)
        left = [a + b for a, b in zip(left, ms, strict=True)]
    pf.update_layout(barmode="stack", title=LIMIT_TITLE, xaxis_title="ms per optimizer step")
    ax.set_title(LIMIT_TITLE)
    ax.set_xlabel("ms per optimizer step")
    ax.invert_yaxis()
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35 - 0.1 * len(rows)), ncol=3,
              fontsize=8, frameon=False)  # fmt: skip
    return pf, ax


def limit_section(study: optuna.Study) -> str:
    """The page's section on the limit: the one-line verdict, then each probed configuration's
    throughput against its compute ceiling and ideal-overlap bound, the all-reduce's bus
    bandwidth, and the trace file."""
    probes = _probes(study)
    e = html.escape
    limit = load_readable(study, LimitRecord)
    problems = [] if limit is None else limit.problems()
    unread = (
        f"<p>The study's limit record could not be read ({e('; '.join(problems))}): it was not "
        f"written by autotune, and is left out.</p>"
        if problems
        else ""
    )
    if not probes:
        return f"<h2>How far from the limit</h2>{unread}" if unread else ""

    def pct(x: Any) -> str:
        return "" if not isinstance(x, (int, float)) else f"{x:.0%}"

    head = ["", "samples/s", "compute ceiling", "share", "ideal-overlap bound", "share",
            "communication", "hidden", "bus bandwidth", "next", "trace"]  # fmt: skip
    rows = []
    for label, rec in probes.items():
        b = rec.get("bounds") or {}
        bus = b.get("busbw_gbit_s")
        rows.append([
            LABELS[label], b.get("samples_per_s"), b.get("compute_ceiling"),
            pct(b.get("share_of_ceiling")), b.get("ideal_bound"), pct(b.get("share_of_ideal")),
            pct(b.get("comm_share")), pct(b.get("hidden_share")),
            "" if bus is None else f"{bus:.3g} Gbit/s", rec.get("next", ""), rec.get("trace") or "",
        ])  # fmt: skip
    line = "" if limit is None else summary_line(limit.probes()) or ""
    cost = None if limit is None else limit.cost_s
    return (
        f"<h2>How far from the limit</h2><p><b>{e(line)}</b></p>{unread}"
        f"{html_table(head, rows)}"
        f"<p>Measured after the search in {e(str(cost))} s: the compute ceiling is the same "
        "step on the bare model (no all-reduce), the ideal-overlap bound that step plus the "
        "part of the all-reduce alone that the last backward cannot hide. The traces open in "
        "Perfetto or chrome://tracing.</p>"
    )
