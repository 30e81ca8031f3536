"""The report shows evidence, not points (issue 32): its first screen is the result (the
profile's speedup with its interval, the settings it changes with their measured
contributions, where the step goes and the advice), the knobs left out are folded below, and
every speedup in the figure carries its 95 % interval as an error bar."""

from __future__ import annotations

import re
from dataclasses import asdict

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from autotune.limit.probe import bounds, breakdown
from autotune.record.attrs import (
    AblationRecord,
    ArmRecord,
    Contribution,
    IntervalRecord,
    ValidationRecord,
    save,
)
from autotune.record.study import ATTR
from autotune.report import report
from autotune.report.figures import speedup_points
from autotune.report.page import Report, html_page
from tests.unit.test_limit import RECORD
from tests.unit.test_report_and_progress import (
    DEFAULTS,
    FAILURES,
    HARDWARE,
    RESULTS,
    WORKLOAD,
    config,
    study_with,
)

LEFT_OUT = [f"knob_{i}: no-op on gloo/cpu (reason {i})" for i in range(20)]
#: Each trial's windows: median, low, high (samples/s) of its 95 % interval.
WINDOWS = {
    0: (400.0, 392.0, 408.0),
    1: (520.0, 500.0, 540.0),
    2: (380.0, 370.0, 390.0),
    3: (610.0, 595.0, 625.0),
}


def interval(median, low, high):
    return IntervalRecord(
        median=median, low=low, high=high, n=5, rel_half_width=(high - low) / 2 / median
    )


def with_intervals(results, failures=()):
    """``study_with``'s study, each trial that is in ``WINDOWS`` with its interval recorded as
    autotune records it (``Measurement.interval``)."""
    made = study_with(results, failures)
    study = optuna.create_study(direction="maximize")
    study.set_user_attr(ATTR, {"workload": WORKLOAD, "hardware": HARDWARE, "left_out": LEFT_OUT})
    for t in made.trials:
        attrs = dict(t.user_attrs)
        if t.number in WINDOWS and t.state == TrialState.COMPLETE:
            attrs["interval"] = asdict(interval(*WINDOWS[t.number]))
        study.add_trial(
            create_trial(
                params=t.params,
                distributions=t.distributions,
                values=t.values,
                state=t.state,
                user_attrs=attrs,
            )
        )
    return study


def evidence_study():
    """A study that found something: trial 3 (bucket_cap_mb 12, static_graph) re-validated at
    1.48x [1.41, 1.55], its ablation keeping the buckets (1.45x [1.38, 1.52]) and dropping
    static_graph (1.01x [0.98, 1.04]); limit probed; 20 knobs left out."""
    study = with_intervals(RESULTS, FAILURES)
    arm = ArmRecord(
        throughput=interval(600.0, 590.0, 610.0),
        speedup=interval(1.48, 1.41, 1.55),
        beats_baseline=True,
    )
    base_arm = ArmRecord(
        throughput=interval(405.0, 400.0, 410.0), speedup=interval(1, 1, 1), beats_baseline=False
    )
    save(
        study,
        ValidationRecord(
            winner="trial 3",
            speedup=interval(1.48, 1.41, 1.55),
            beats_baseline=True,
            results={"baseline": base_arm, "trial 3": arm},
            reason="trial 3: 1.48x",
            trials={"baseline": 0, "trial 3": 3},
            order=["baseline", "trial 3"] * 3,
            measurements={"baseline": [400.0, 405.0, 410.0], "trial 3": [590.0, 600.0, 610.0]},
        ),
    )
    ablated = {"bucket_cap_mb": 12.0, "static_graph": DEFAULTS["static_graph"]}
    save(
        study,
        AblationRecord(
            trial=3,
            rounds=3,
            order=["winner", "without bucket_cap_mb", "without static_graph"],
            measurements={"winner": [600.0]},
            contributions={
                "bucket_cap_mb": Contribution(value=12.0, kept=True, speedup=[1.38, 1.45, 1.52]),
                "static_graph": Contribution(value=True, kept=False, speedup=[0.98, 1.01, 1.04]),
            },
            dropped=["static_graph"],
            together=False,
            joint=None,
            params=ablated,
            config=config(ablated),
        ),
    )
    advice = "larger buckets (fewer all-reduces), up to 1.10x: 40 all-reduces"
    probed = {**RECORD, "bounds": bounds(RECORD), "breakdown": breakdown(RECORD), "next": advice}
    study.set_user_attr("limit", {"baseline": probed, "tuned": probed, "cost_s": 4.0})
    return study


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    report.write(report.build(evidence_study()), out)
    return (out / "report.html").read_text()


def test_the_first_screen_is_the_result_and_the_left_out_list_is_folded_below_it(page):
    result = page.index("<h2>Result</h2>")
    fold = page.index("<details class=leftout>")
    study = page.index("<h2>The study</h2>")
    assert page.index("<h1>") < result < study < fold
    first = page[result:study]
    # the headline speedup with the re-validation's interval, in large type
    assert "<span class=big>1.48x</span> the defaults" in first
    assert "1.48x [1.41, 1.55], 3 interleaved rounds" in first
    # the settings it changes with what each was measured to contribute (the ablation)
    assert "<td>ddp.bucket_cap_mb = 12</td><td>1.45x [1.38, 1.52]</td><td>kept</td>" in first
    assert "<td>static_graph</td><td>1.01x [0.98, 1.04]</td><td>dropped" in first
    # where the step goes, as a bar, and the one-line advice
    assert first.count("<div class=limitrow>") == 2 and "class=part" in first
    assert "next: larger buckets (fewer all-reduces), up to 1.10x" in first
    # nothing of the left-out list on the first screen; all 20 inside the fold
    assert "knob_" not in first
    details = page[fold : page.index("</details>", fold)]
    assert "<summary>Left out on this backend/device: 20 knob(s)" in details
    assert details.count("<li>") == 20 and "knob_19: no-op on gloo/cpu (reason 19)" in details
    assert "<td>left out</td>" not in page  # no longer rows of the study's table


def test_every_speedup_in_the_figure_has_its_interval_as_an_error_bar():
    r = report.build(evidence_study())
    fig = next(f for f in r.figures if f.name == "speedup")
    traces = {t.name: t for t in fig.plotly.data}
    search = traces["a trial, its windows' 95 % interval"]
    assert list(search.x) == [0, 1, 2, 3]
    assert search.error_y.type == "data" and search.error_y.symmetric is False
    # trial 1: 1.30x with windows 500-540 around 520: 1.25x-1.35x
    i = list(search.x).index(1)
    assert search.y[i] == pytest.approx(1.3)
    assert search.y[i] - search.error_y.arrayminus[i] == pytest.approx(1.25)
    assert search.y[i] + search.error_y.array[i] == pytest.approx(1.35)
    # the re-validation's paired interval, at its trial
    again = traces["re-validated, interleaved with the defaults"]
    assert list(again.text) == ["trial 3: 1.48x [1.41, 1.55]"] and again.y[0] == pytest.approx(1.48)
    assert again.x[0] == pytest.approx(3.2)  # beside trial 3's own point
    assert again.error_y.arrayminus[0] == pytest.approx(0.07)
    assert again.error_y.array[0] == pytest.approx(0.07)
    # the PNG draws the same error bars (matplotlib's errorbar containers)
    assert len(fig.matplotlib.containers) == 2
    assert all(c.has_yerr for c in fig.matplotlib.containers)


def test_a_trial_without_a_recorded_interval_is_drawn_apart_without_a_bar():
    points = speedup_points(study_with(RESULTS))  # no trial recorded its interval
    assert points["search"]["x"] == [] and points["unmeasured"]["x"] == [0, 1, 2, 3]
    r = report.build(study_with(RESULTS))
    fig = next(f for f in r.figures if f.name == "speedup")
    (trace,) = fig.plotly.data
    assert trace.name == "a trial with no interval recorded" and trace.error_y.array is None


def test_an_unvalidated_profile_shows_its_trials_own_interval():
    study = with_intervals(RESULTS)
    text = html_page(Report(study))
    first = text[text.index("<h2>Result</h2>") : text.index("<h2>The study</h2>")]
    # 610 / 400 = 1.525x, its windows 595-625 around 610
    assert "<span class=big>1.52x</span>" in first
    assert "1.52x [1.49, 1.56], the trial&#x27;s own windows" in first
    assert "not re-validated" in first
    # no ablation: each setting says what the screening measured, or that nothing did
    assert "<td>ddp.bucket_cap_mb = 12</td><td>not measured</td><td>not ablated</td>" in first


def test_numbers_on_the_page_are_written_for_people(page):
    ours = page[page.index("<h1>") : page.index('<h2 id="')]
    assert not re.search(r"\d\.\d+e[+-]\d", ours)
    # the limit table: 4,267 samples/s rather than 4266.67
    assert "<td>4,267</td>" in ours and "4266.67" not in ours


def test_the_headline_carries_the_job_as_it_runs_today_or_why_it_was_not_measured():
    from autotune.report.page import _headline

    measured = {"speedup": 1.18, "speedup_interval": [1.15, 1.2], "validation": {"rounds": 6}}
    line = "1.35x [1.33, 1.37] your job as it runs today (of which the allocator pin 1.12x ...)"
    shown = _headline({**measured, "as_is": {"line": line, "speedup": [1.33, 1.35, 1.37]}}, "")
    assert "<span class=big>1.18x</span>" in shown and "your job as it runs today" in shown
    assert shown.index("1.18x") < shown.index("1.35x")  # the tuned knobs' figure leads
    why = _headline({**measured, "as_is": {"not_measured": "on a GPU <the pin>"}}, "")
    assert "not measured (on a GPU &lt;the pin&gt;)" in why  # escaped
    assert "as it runs today" not in _headline(measured, "")  # an older profile: nothing
