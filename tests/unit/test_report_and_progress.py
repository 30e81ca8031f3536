"""The report (HTML + PNG figures from optuna.visualization) and the run's live display, on
real Optuna studies in memory with synthetic trial results."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import matplotlib.image
import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial
from rich.console import Console

from autotune.core.config import TrialConfig
from autotune.core.target import Target
from autotune.definition.space import SearchSpace
from autotune.record.study import ATTR
from autotune.report import report
from autotune.report.progress import RunView, failure_line, summary_table

DISTS = {
    "bucket_cap_mb": FloatDistribution(1, 200, log=True),
    "static_graph": CategoricalDistribution([False, True]),
}
DEFAULTS = {"bucket_cap_mb": 25.0, "static_graph": False}
WORKLOAD = {"trainer": "mlp", "options": {}, "world_size": 2, "backend": "gloo", "global_batch": 64}
HARDWARE = {
    "device": "cpu",
    "device_name": "cpu",
    "device_count": 2,
    "node_count": 1,
    "torch": "2.13.0",
    "nccl": None,
}
TARGET = Target(backend="gloo", device="cpu", world_size=2, global_batch=64, cpus_per_rank=1)


def config(params):
    """The full trial configuration autotune stores on each trial (exported as the profile)."""
    space = SearchSpace.load("default").resolve(TARGET)
    return TrialConfig.from_values({**space.defaults(), **params}, TARGET).to_dict()


def one_study(path: Path, *names: str) -> str:
    """A SQLite storage at ``path`` holding one small autotune study per name."""
    url = f"sqlite:///{path}"
    for name in names:
        study = optuna.create_study(study_name=name, storage=url, direction="maximize")
        study.set_user_attr(ATTR, {"workload": WORKLOAD, "hardware": HARDWARE})
        params = {"bucket_cap_mb": 25.0, "static_graph": False}
        study.add_trial(
            create_trial(
                params=params,
                distributions=DISTS,
                value=400.0,
                user_attrs={"baseline": True, "speedup": 1.0, "config": config(params)},
            )
        )
    return url


def study_with(results, failures=(), directions=("maximize",)):
    """A study like autotune's: a baseline first, then COMPLETE and FAIL trials."""
    study = optuna.create_study(directions=list(directions))
    study.set_user_attr(ATTR, {"workload": WORKLOAD, "hardware": HARDWARE})
    base = results[0][1]
    for i, (params, value) in enumerate(results):
        attrs = {
            "speedup": round(value / base, 4),
            "window_s": 3.0,
            "overhead_s": 5.0,
            "config": config(params),
        }
        if i == 0:
            attrs["baseline"] = True
        values = [value] if len(directions) == 1 else [value, 100.0 + 10 * i]
        study.add_trial(
            create_trial(params=params, distributions=DISTS, values=values, user_attrs=attrs)
        )
    for params, reason, detail in failures:
        study.add_trial(
            create_trial(
                params=params,
                distributions=DISTS,
                state=TrialState.FAIL,
                user_attrs={
                    "reason": reason,
                    "reason_detail": detail,
                    "logs": f"/runs/logs/s/trial-{reason}-{len(detail)}",
                },
            )
        )
    return study


RESULTS = [
    (DEFAULTS, 400.0),
    ({"bucket_cap_mb": 5.0, "static_graph": True}, 520.0),
    ({"bucket_cap_mb": 100.0, "static_graph": False}, 380.0),
    ({"bucket_cap_mb": 12.0, "static_graph": True}, 610.0),
]
FAILURES = [
    ({"bucket_cap_mb": 150.0, "static_graph": True}, "timeout", "no result after 30 s"),
    ({"bucket_cap_mb": 2.0, "static_graph": False}, "crash", "rank 1: RuntimeError: boom"),
    ({"bucket_cap_mb": 3.0, "static_graph": False}, "crash", "rank 0: RuntimeError: bang"),
]


def png_shape(path):
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return matplotlib.image.imread(path).shape


#: Ten distinct configurations: enough for the parameter-importance figure.
MANY = RESULTS + [
    ({"bucket_cap_mb": float(b), "static_graph": b % 2 == 0}, 400.0 + 9 * b) for b in range(2, 8)
]


def test_report_draws_every_figure_as_png_and_in_the_page(tmp_path):
    written = report.write(report.build(study_with(MANY, FAILURES)), tmp_path)
    names = {p.name for p in written}
    expected = {"history", "speedup", "importances", "by_parameter", "timeline", "failures"}
    assert names == {"report.html"} | {f"{n}.png" for n in expected}
    for name in expected:
        h, w, _ = png_shape(tmp_path / f"{name}.png")
        assert h > 200 and w > 300  # a real figure, not an empty canvas
    page = (tmp_path / "report.html").read_text()
    # one interactive plotly figure per drawn figure, plotly.js embedded once (works offline)
    assert page.count('class="plotly-graph-div"') == len(expected)
    assert page.count('<script type="text/javascript">/**') <= 1
    assert not re.search(r"<script[^>]+src=", page)
    for title in (
        "Speedup over the defaults, per trial, with 95 % intervals",
        "Failed trials by reason",
    ):
        assert title in page


def test_each_png_has_one_title_the_reports(tmp_path):
    import numpy as np

    r = report.build(study_with(MANY, FAILURES))
    for fig in r.figures:
        if fig.matplotlib is None:
            continue
        for ax in np.atleast_1d(fig.matplotlib).flat:
            # Optuna titles the importances on the left; two titles would print over each other
            titles = [ax.get_title(loc) for loc in ("left", "center", "right")]
            assert [t for t in titles if t] in ([fig.title], []), (fig.name, titles)


def test_report_page_lists_best_trials_and_each_failure_with_its_reason(tmp_path):
    study = study_with(RESULTS, FAILURES)
    report.write(report.build(study), tmp_path)
    page = (tmp_path / "report.html").read_text()
    best = re.search(r"<h2>Best 4 of 4 COMPLETE trials</h2>\s*<table>.*?</table>", page, re.S)
    rows = re.findall(r"<tr><td>(\d+)</td><td>([\d.]+)</td>", best.group(0))
    assert [int(n) for n, _ in rows] == [3, 1, 0, 2]  # ranked by throughput
    assert "bucket_cap_mb=12, static_graph=True" in page  # what the best trial changed
    # The first screen is the result the user acts on, the evidence after it.
    result = page.index("<h2>Result</h2>")
    assert result < page.index("<h2>The study</h2>") < page.index("<h2>Best 4 of 4")
    first = page[result : page.index("<h2>The study</h2>")]
    assert "<span class=big>1.52x</span> the defaults" in first
    assert "not re-validated: the speedup is the search&#x27;s best single trial" in first
    assert (
        "<td>ddp.bucket_cap_mb = 12</td>" in first and "<td>ddp.static_graph = True</td>" in first
    )
    # values for people: no Python dict repr, no 16-digit floats
    ours = page[page.index("<h1>") : page.index('<h2 id="')]  # not the embedded plotly.js
    assert "{'" not in ours and not re.search(r"\d\.\d{8,}", ours)
    for _, reason, detail in FAILURES:
        assert f"<td>{reason}</td><td>{detail}</td>" in page
        # where the failed trial's rank logs are kept, on its row
        assert re.search(
            rf"<td>{detail}</td><td>[^<]*</td><td>/runs/logs/s/trial-{reason}-"
            rf"{len(detail)}</td></tr>",
            page,
        )
    assert "1.52x" in page  # best speedup, 610 / 400
    assert "bucket_cap_mb: 12.0" in page  # the profile autotune export writes


def test_failures_figure_counts_reasons(tmp_path):
    r = report.build(study_with(RESULTS, FAILURES))
    fig = next(f for f in r.figures if f.name == "failures")
    bar = fig.plotly.data[0]
    assert list(bar.x) == ["crash", "timeout"] and list(bar.y) == [2, 1]


def test_figures_that_cannot_be_drawn_say_why_and_write_no_png(tmp_path):
    study = study_with(RESULTS[:1])  # the baseline alone: nothing to rank
    written = report.write(report.build(study), tmp_path)
    assert not (tmp_path / "importances.png").exists()
    assert not (tmp_path / "failures.png").exists()
    assert (tmp_path / "history.png") in written
    page = (tmp_path / "report.html").read_text()
    assert "Not drawn: no trial failed." in page


def test_parameter_importances_are_not_drawn_from_a_few_noisy_trials(tmp_path):
    report.write(report.build(study_with(RESULTS)), tmp_path)
    assert not (tmp_path / "importances.png").exists()
    page = (tmp_path / "report.html").read_text()
    assert (
        "Not drawn: needs at least 10 COMPLETE trials with different parameters (this study "
        in page
    )
    assert "has 4; fewer rank noise)" in page


def test_multi_objective_study_gets_a_pareto_front(tmp_path):
    study = study_with(RESULTS, directions=("maximize", "minimize"))
    study.set_metric_names(["samples_per_s", "peak_memory_mb"])
    r = report.build(study)
    assert [f.name for f in r.figures][:2] == ["history", "pareto"]
    report.write(r, tmp_path)
    png_shape(tmp_path / "pareto.png")


def test_summary_table_ranks_trials_and_keeps_the_baseline_row():
    study = study_with(RESULTS, FAILURES)
    console = Console(record=True, width=120, force_terminal=False)
    console.print(summary_table(study, top=2))
    text = console.export_text()
    lines = [line for line in text.splitlines() if re.match(r"[│|]\s+\d", line)]
    assert [re.search(r"\d+", line).group(0) for line in lines] == ["3", "1", "0"]
    assert "0 (baseline)" in text and "1.52x" in text and "defaults" in text
    assert failure_line(study) == "Failed     2 crash, 1 timeout"


def test_quiet_view_prints_plain_lines_and_tracks_the_best():
    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=False)
    with RunView(console, budget_s=60) as view:
        assert view.live is False  # not a terminal: no live display
        view.budget_started()
        view.log("[green]  512.0[/] samples/s")
        view.trial_started("trial 1", "static_graph=True")
        view.trial_finished("complete", 1.25, 1)
        view.trial_finished("failed", None, 2)
        view.trial_finished("complete", 1.10, 3)
    assert out.getvalue() == "  512.0 samples/s\n"  # no colour codes, nothing else drawn
    assert view.best == (1.25, 1)
    assert (
        str(view.status_lines()[0])
        == "trials 2 complete · 1 failed · 0 pruned · best 1.25x (trial 1)"
    )


def test_live_view_draws_budget_bar_counts_and_running_trial():
    console = Console(record=True, width=100, force_terminal=True)
    view = RunView(console, budget_s=120)
    assert view.live is True
    with view:
        view.budget_started()
        view.trial_finished("complete", 1.0, 0)
        view.trial_started("trial 1", "bucket_cap_mb=5 static_graph=True")
        console.print(view._progress.get_renderable())
    text = console.export_text()
    assert re.search(r"budget .*━.* \d+s of 2m", text)
    assert "trials 1 complete · 0 failed · 0 pruned · best 1.00x (trial 0)" in text
    assert "running trial 1: bucket_cap_mb=5 static_graph=True" in text


@pytest.mark.parametrize("budget", [30, 3600])
def test_live_bar_never_runs_past_the_budget(budget):
    view = RunView(Console(record=True, force_terminal=True), budget_s=budget)
    with view:
        view.started = time.monotonic() - 2 * budget  # as if the budget began long ago
        view._progress.get_renderable()
        task = view._progress.tasks[0]
    assert task.completed == budget and task.total == budget


def test_a_failure_detail_with_brackets_is_printed_as_it_is():
    # gloo's errors carry "[/path/to/pair.cc:537]", which rich would read as a closing tag
    from autotune.core.events import Outcome, TrialFinished

    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False)
    view = RunView(console, budget_s=60, live=False)
    detail = "rank 1: RuntimeError: [/__w/pytorch/third_party/gloo/transport/tcp/pair.cc:537] reset"
    view(
        TrialFinished(
            tag="trial 3",
            number=3,
            outcome=Outcome.FAILED,
            elapsed_s=5.0,
            changes={"comm_hook": "[fp16]"},
            reason="crash",
            detail=detail,
        )
    )
    text = out.getvalue()
    assert detail in text and "comm_hook=[fp16]" in text
    assert view.counts["failed"] == 1


def test_report_replaces_a_planted_link_instead_of_writing_through_it(tmp_path):
    """H-W01: a link named report.html (or a PNG's
    name) in the output directory, pointing at a file of the user's, is replaced by the report;
    the file it pointed at is untouched."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.html").symlink_to(victim)
    (out / "history.png").symlink_to(victim)
    written = report.write(report.build(study_with(MANY, FAILURES)), out)
    assert victim.read_text() == "keep me"
    assert not (out / "report.html").is_symlink() and not (out / "history.png").is_symlink()
    assert (out / "report.html").read_text().startswith("<!")
    assert {p.name for p in written} >= {"report.html", "history.png"}
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_a_crafted_limit_record_is_a_section_that_says_it_could_not_be_read(tmp_path):
    """H-W02: a study attribute ``limit`` whose probe lacks figures (the report raised a
    KeyError) is left out with the reason; the rest of the page is written."""
    study = study_with(MANY, FAILURES)
    parts = dict.fromkeys(("data", "forward", "backward", "exposed_comm", "optimizer"), 0.1)
    study.set_user_attr(
        "limit", {"tuned": {"bounds": {"samples_per_s": "x"}, "breakdown": parts}, "cost_s": 1.0}
    )
    report.write(report.build(study), tmp_path)
    page = (tmp_path / "report.html").read_text()
    assert "limit record could not be read (tuned: samples_per_s" in page
    assert "Speedup over the defaults, per trial, with 95 % intervals" in page


@pytest.mark.parametrize("crafted", ["x", {"bucket_cap_mb": 1}], ids=["H-W03", "H-W03b"])
def test_autotune_report_of_a_crafted_screening_record_is_a_one_line_error(tmp_path, crafted):
    """H-W03: a study attribute ``screening`` that is not autotune's: exit 2, one line naming
    the record, nothing written."""
    from tests.conftest import in_process

    url = f"sqlite:///{tmp_path / 's.db'}"
    target = optuna.create_study(study_name="s", storage=url, direction="maximize")
    target.set_user_attr(ATTR, {"workload": WORKLOAD, "hardware": HARDWARE})
    target.add_trials(study_with(MANY).trials)
    target.set_user_attr("screening", crafted)
    out = in_process("report", "--study-name", "s", "--storage", url, "-o", str(tmp_path / "out"))
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("autotune: error: study record screening")
    assert out.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()
