"""Numbers for people (``autotune.core.values``), and the run's lines that print them (issue 32:
the limit line said ``5.435e+04 samples/s``)."""

from __future__ import annotations

import io
import math
import re

import pytest
from rich.console import Console

from autotune.core.events import Outcome, TrialFinished, ValidationRun
from autotune.core.values import nbytes, number, seconds, speedup
from autotune.limit.probe import bounds, summary_line
from autotune.report.progress import RunView, format_changes
from tests.conftest import edited
from tests.unit.test_limit import RECORD

EXPONENT = re.compile(r"\d[eE][+-]?\d")


@pytest.mark.parametrize(
    ("x", "shown"),
    [
        (54350.4, "54,350"),
        (1234567.0, "1,234,567"),
        (999.6, "1,000"),  # rounds up into the thousands: separated there too
        (543.21, "543.2"),
        (54.3512, "54.35"),
        (5.43512, "5.435"),
        (0.0543512, "0.05435"),
        (12.0, "12"),  # no trailing zeros: bucket_cap_mb=12, not 12.0
        (400.0, "400"),
        (0.0, "0"),
        (-1234.4, "-1,234"),
        (1e-7, "0.0000001"),
    ],
)
def test_a_number_is_written_without_an_exponent(x, shown):
    assert number(x) == shown
    assert not EXPONENT.search(number(x))


def test_fewer_digits_on_request_and_not_finite_as_python_writes_it():
    assert number(5.43512, 3) == "5.44" and number(543.21, 3) == "543"
    assert number(math.nan) == "nan" and number(math.inf) == "inf"


def test_durations_sizes_and_ratios():
    assert seconds(2.5) == "2.5 s" and seconds(0.0068) == "6.8 ms" and seconds(4.5e-5) == "45 us"
    assert seconds(0.0) == "0 s"
    assert nbytes(500) == "500 B" and nbytes(4096) == "4 KiB"
    assert nbytes(67_272_768) == "64.2 MiB" and nbytes(3 * 2**30) == "3 GiB"
    assert speedup(1.5249) == "1.52x"


def test_the_limit_line_writes_a_fast_rate_for_people():
    fast = edited(RECORD, samples_per_step=815.2)  # 54,347 samples/s in a 15 ms step
    probed = {**fast, "bounds": bounds(fast), "next": "compute-bound"}
    line = summary_line({"tuned": probed})
    assert "54,347 samples/s" in line and "(90,578)" in line
    assert not EXPONENT.search(line)


def test_the_runs_lines_write_rates_and_values_for_people():
    out = io.StringIO()
    view = RunView(Console(file=out, width=200, force_terminal=False), budget_s=60, live=False)
    view(
        TrialFinished(
            tag="trial 3",
            number=3,
            outcome=Outcome.COMPLETE,
            elapsed_s=5.0,
            changes={"bucket_cap_mb": 1500.0},
            throughput=54350.4,
            speedup=1.21,
            rel_half_width=0.02,
            windows=4,
        )
    )
    view(ValidationRun(key="trial 3", throughput=123456.7, rel_half_width=0.01))
    text = out.getvalue()
    assert "54,350 samples/s" in text and "bucket_cap_mb=1,500" in text
    assert "123,457 samples/s" in text
    assert not EXPONENT.search(text)
    assert format_changes({"lr": 0.000125}) == "lr=0.000125"
