"""Script mode's pure parts: rank 0's step stamps turned into a measurement (``StepStream``),
and the checks of ``autotune run ... -- CMD`` before anything starts (``script_job``)."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from autotune.config import MeasureSettings
from autotune.errors import ConfigError
from autotune.script_job import script_job
from autotune.script_trial import Reports, StepStream
from autotune.stats import Interval
from autotune.studydef import StudyDefinition

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
