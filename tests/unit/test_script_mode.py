"""Script mode's pure parts: rank 0's step stamps turned into a measurement (``StepStream``),
and the checks of ``autotune run ... -- CMD`` before anything starts (``script_job``)."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from autotune.core.config import MeasureSettings
from autotune.core.errors import ConfigError
from autotune.core.numerics import CURVE_STEPS
from autotune.core.stats import Interval
from autotune.definition.studydef import StudyDefinition
from autotune.script.job import script_job
from autotune.script.trial import Reports, StepStream, loss_curve

M = MeasureSettings(window_s=1.0, min_windows=3, max_windows=6)


def stamps(step_times: list[float]) -> list[float]:
    out = [100.0]
    for t in step_times:
        out.append(out[-1] + t)
    return out


def test_slow_first_steps_are_warm_up_and_windows_are_samples_per_second():
    times = [1.0, 0.5, 0.3] + [0.1] * 200
    s = StepStream(M, samples_per_step=64.0)
    seen = stamps(times)
    # fed as the file grows: not measured until enough windows exist
    assert not s.feed(seen[:5])
    assert s.feed(seen)
    assert s.warmup_steps is not None and s.warmup_steps >= 3  # the slow steps are not timed
    assert s.steps_per_window in (10, 11)  # ceil(window_s / the settled step time of ~0.1 s)
    assert s.windows == pytest.approx([640.0] * len(s.windows))
    assert s.stop and s.stop != "pruned" and 3 <= len(s.windows) <= 6


def test_a_trial_clearly_below_the_incumbent_is_pruned():
    s = StepStream(M, samples_per_step=64.0, incumbent=Interval(2100.0, 2000.0, 2200.0, 5))
    assert s.feed(stamps([0.1] * 200))
    assert s.stop == "pruned"


def test_a_report_line_being_written_is_not_read(tmp_path):
    f = tmp_path / "rank-0.steps"
    f.write_text("t 1.5\nl 0.25\nt 2.0\nt 2.")
    r = Reports(f)
    r.read()
    assert (r.stamps, r.losses) == ([1.5, 2.0], [0.25])
    with open(f, "a") as out:  # the line is finished, and another one written
        out.write("5\nt 3.0\n")
    r.read()
    assert (r.stamps, r.losses) == ([1.5, 2.0, 2.5, 3.0], [0.25])  # each line read once
    missing = Reports(tmp_path / "missing")
    missing.read()
    assert (missing.stamps, missing.losses) == ([], [])


def test_the_wrapped_model_reports_its_steps_and_peak_memory(tmp_path, monkeypatch):
    """What ``Profile.wrap`` installs in a trial: a stamp per forward pass, and every
    ``MEMORY_EVERY``-th the peak memory, read back by the driver's ``Reports``."""
    import resource

    import torch

    from autotune.script import report as script_report

    monkeypatch.setenv("AUTOTUNE_REPORT_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(script_report, "_OUT", {})
    model = torch.nn.Linear(4, 2)
    assert script_report.install(model)
    for _ in range(script_report.MEMORY_EVERY + 1):
        script_report.report_loss(model(torch.ones(3, 4)).sum())
    script_report._OUT[str(tmp_path)].flush()
    r = Reports(tmp_path / "rank-0.steps")
    r.read()
    assert len(r.stamps) == len(r.losses) == script_report.MEMORY_EVERY + 1
    lines = (tmp_path / "rank-0.steps").read_text().splitlines()
    assert sum(x.startswith("m ") for x in lines) == 2  # the first forward and the 9th
    now = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert 0.5 * now < r.peak_mb <= now + 1  # this process's peak resident set, in MiB


def test_a_script_reporting_one_loss_per_micro_step_gives_one_value_per_optimizer_step():
    losses = [float(k) for k in range(40)]
    # 4 micro-steps per optimizer step, one loss each: means of 4
    assert loss_curve(losses, 40, 4)[:3] == [1.5, 5.5, 9.5] and len(loss_curve(losses, 40, 4)) == 10
    # one loss per optimizer step (10 of 40 forwards): read as it is, at most CURVE_STEPS
    assert loss_curve(losses[:10], 40, 4) == losses[:10]
    assert loss_curve(losses, 40, 1) == losses[:CURVE_STEPS]
    assert loss_curve([], 40, 4) == []


def definition(cmd: list[str], **settings) -> StudyDefinition:
    d = StudyDefinition.load("default").override(**settings)
    return dataclasses.replace(d, command=tuple(cmd))


def test_the_world_size_comes_from_torchrun_and_script_mode_has_no_limit_probe():
    d, job = script_job(
        definition(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc-per-node=4",
                "train.py",
                "--lr",
                "3e-4",
            ],
            global_batch=128,
        )  # fmt: skip
    )
    assert (job.world_size, job.global_batch, job.name) == (4, 128, "script-train")
    assert d.world_size == 4 and d.limit is False and d.concurrent_trials == 1
    assert d.placement == "strict_pack"  # the command runs on the placement group's one node


@pytest.mark.parametrize(
    ("cmd", "settings", "says"),
    [
        (["no-such-command-xyz", "train.py"], {"global_batch": 64}, "no such command"),
        ([sys.executable, "train.py"], {}, "--global-batch"),
        ([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "t.py"],
         {"global_batch": 64}, "one node"),
        ([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "t.py"],
         {"global_batch": 64, "world_size": 4}, "disagrees"),
        ([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "t.py"],
         {"global_batch": 64}, "not divisible"),
        ([sys.executable, "t.py"], {"global_batch": 64, "concurrent_trials": 2}, "one trial"),
        ([sys.executable, "t.py"], {"global_batch": 64, "placement": "spread"}, "one node"),
    ],
)  # fmt: skip
def test_script_mode_refuses_what_it_cannot_run_with_the_fix(cmd, settings, says):
    with pytest.raises(ConfigError, match=says):
        script_job(definition(cmd, **settings))
