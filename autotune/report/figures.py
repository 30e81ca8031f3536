"""The report's figures that Optuna has no function for, each drawn in plotly (the page) and in
matplotlib (the PNG): the speedup of every trial with its 95 % interval (and the
re-validation's, interleaved with the defaults), failed trials by reason, and where the step
time goes (the limit probe, ``autotune.limit.probe``), with the page's bar of it and the
section that gives its figures."""

from __future__ import annotations

import html
from collections import Counter
from typing import Any

import optuna

from autotune.core.values import number, ratio_interval
from autotune.limit.probe import summary_line
from autotune.record import trial as tr
from autotune.record.attrs import LimitRecord, ValidationRecord, load_readable
from autotune.record.study import complete

__all__ = ["LIMIT_TITLE", "SPEEDUP_TITLE", "failure_figures", "html_table", "limit_bar"]
__all__ += ["limit_figures", "limit_section", "speedup_figures", "speedup_points"]

LIMIT_TITLE = "Where the step time goes"
SPEEDUP_TITLE = "Speedup over the defaults, per trial, with 95 % intervals"
AXIS = "speedup vs the defaults"
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


#: A set of points: trial numbers, speedups, their intervals' low and high ends, hover labels.
Points = dict[str, list[Any]]


def speedup_points(study: optuna.Study) -> dict[str, Points]:
    """The speedup figure's points, by series: ``search`` (each COMPLETE trial's speedup with
    its own interval: its windows' 95 % interval over their median, scaled to the speedup),
    ``unmeasured`` (a trial that recorded no interval: a point alone) and ``revalidated`` (each
    re-validated arm's paired speedup over the defaults with its interval, at its trial)."""
    out: dict[str, Points] = {k: _no_points() for k in ("search", "unmeasured", "revalidated")}
    for t in complete(study):
        sp = tr.speedup(t)
        if sp is None:
            continue
        rec = tr.interval_record(t)
        if rec is None or rec.low is None or rec.high is None or rec.median <= 0:
            _add(out["unmeasured"], t.number, sp, sp, sp, f"trial {t.number}")
            continue
        low, high = sp * rec.low / rec.median, sp * rec.high / rec.median
        _add(out["search"], t.number, sp, low, high, f"trial {t.number}")
    checked = load_readable(study, ValidationRecord)
    for key, arm in ({} if checked is None else checked.results).items():
        ci = arm.speedup
        at = None if checked is None else checked.trials.get(key)
        if key == "baseline" or at is None or ci.low is None or ci.high is None:
            continue
        _add(out["revalidated"], at, ci.median, ci.low, ci.high, key)
    return out


def _no_points() -> Points:
    return {"x": [], "y": [], "low": [], "high": [], "label": []}


def _add(p: Points, x: int, y: float, low: float, high: float, label: str) -> None:
    for k, v in (("x", x), ("y", y), ("low", low), ("high", high), ("label", label)):
        p[k].append(v)


#: How far right of its trial a re-validated point is drawn (not over the trial's own).
OFFSET = 0.2
#: Each series' legend, colour and marker.
SERIES = {
    "search": ("a trial, its windows' 95 % interval", "#1f77b4", "o"),
    "unmeasured": ("a trial with no interval recorded", "#999999", "x"),
    "revalidated": ("re-validated, interleaved with the defaults", "#d62728", "D"),
}


def speedup_figures(study: optuna.Study) -> tuple[Any, Any] | str:
    """Every trial's speedup with its 95 % interval as error bars (plotly, matplotlib); or why
    there is nothing to draw."""
    points = speedup_points(study)
    if not any(p["x"] for p in points.values()):
        return "no COMPLETE trial has a speedup over the defaults yet"
    import matplotlib.pyplot as plt
    import plotly.graph_objects as go

    pf = go.Figure()
    _, ax = plt.subplots(figsize=(8, 4.5))
    for key, p in points.items():
        if not p["x"]:
            continue
        name, colour, marker = SERIES[key]
        up = [h - y for y, h in zip(p["y"], p["high"], strict=True)]
        down = [y - lo for y, lo in zip(p["y"], p["low"], strict=True)]
        bars = None
        if key != "unmeasured":
            bars = {"type": "data", "symmetric": False, "array": up, "arrayminus": down}
        x = [n + (OFFSET if key == "revalidated" else 0) for n in p["x"]]  # beside its trial
        rows = zip(p["label"], p["y"], p["low"], p["high"], strict=True)
        text = [f"{lb}: {ratio_interval(y, lo, h)}" for lb, y, lo, h in rows]
        pf.add_trace(
            go.Scatter(
                x=x,
                y=p["y"],
                mode="markers",
                name=name,
                error_y=bars,
                marker_color=colour,
                text=text,
                hoverinfo="text",
            )
        )
        yerr = None if bars is None else [down, up]
        ax.errorbar(x, p["y"], yerr=yerr, fmt=marker, color=colour, label=name, capsize=3)
    pf.add_hline(y=1.0, line_dash="dash", line_color="gray", annotation_text="the defaults")
    pf.update_layout(title=SPEEDUP_TITLE, xaxis_title="trial", yaxis_title=AXIS)
    ax.axhline(1.0, linestyle="--", color="gray", label="the defaults (1.0x)")
    ax.set_title(SPEEDUP_TITLE)
    ax.set_xlabel("trial")
    ax.set_ylabel(AXIS)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(loc="best", fontsize=8)
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
    ax.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.35 - 0.1 * len(rows)),
        ncol=3,
        fontsize=8,
        frameon=False,
    )
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

    def num(x: Any) -> str:
        return "" if not isinstance(x, (int, float)) else number(x)

    head = [
        "",
        "samples/s",
        "compute ceiling",
        "share",
        "ideal-overlap bound",
        "share",
        "communication",
        "hidden",
        "bus bandwidth",
        "next",
        "trace",
    ]
    rows = []
    for label, rec in probes.items():
        b = rec.get("bounds") or {}
        bus = b.get("busbw_gbit_s")
        rows.append(
            [
                LABELS[label],
                num(b.get("samples_per_s")),
                num(b.get("compute_ceiling")),
                pct(b.get("share_of_ceiling")),
                num(b.get("ideal_bound")),
                pct(b.get("share_of_ideal")),
                pct(b.get("comm_share")),
                pct(b.get("hidden_share")),
                "" if bus is None else f"{number(bus, 3)} Gbit/s",
                rec.get("next", ""),
                rec.get("trace") or "",
            ]
        )
    line = "" if limit is None else summary_line(limit.probes()) or ""
    cost = "?" if limit is None or limit.cost_s is None else number(limit.cost_s, 3)
    return (
        f"<h2>How far from the limit</h2><p><b>{e(line)}</b></p>{unread}"
        f"{html_table(head, rows)}"
        f"<p>Measured after the search in {e(cost)} s: the compute ceiling is the same "
        "step on the bare model (no all-reduce), the ideal-overlap bound that step plus the "
        "part of the all-reduce alone that the last backward cannot hide. The traces open in "
        "Perfetto or chrome://tracing.</p>"
    )


def limit_bar(study: optuna.Study) -> str:
    """The report's first-screen picture of the limit: each probed configuration's step as
    one bar split into its parts (plain HTML, no script), then the one-line verdict with the
    advice; '' when the run did not probe the limit."""
    probes = _probes(study)
    limit = load_readable(study, LimitRecord)
    if not probes or limit is None:
        return ""
    e = html.escape
    longest = max(max(sum(r["breakdown"][p] for p in PARTS) for r in probes.values()), 1e-12)
    rows = []
    for label, rec in probes.items():
        parts = rec["breakdown"]
        step = sum(parts[p] for p in PARTS)
        cells = "".join(
            f'<span class=part title="{e(name)} {number(parts[p] * 1e3, 3)} ms" '
            f'style="width:{100 * parts[p] / longest:.2f}%;background:{colour}"></span>'
            for p, (name, colour) in PARTS.items()
            if parts[p] > 0
        )
        head = f"{e(LABELS[label])} {number(step * 1e3, 3)} ms"
        rows.append(
            f"<div class=limitrow><span class=limitlabel>{head}</span>"
            f"<span class=bar>{cells}</span></div>"
        )
    key = " ".join(
        f'<span class=key style="background:{c}"></span>{e(n)}' for n, c in PARTS.values()
    )
    line = summary_line(limit.probes()) or ""
    return (
        f"<div class=limitbar>{''.join(rows)}<p class=legend>{key}</p></div>"
        f"<p class=advice>{e(line)}</p>"
    )
