"""``autotune compare A B -- CMD`` (``autotune.script.compare``) without running a command: bad
input is one line, exit 2, nothing written and the command not started; the plan each side gets
(the profile's configuration, or for ``asis`` PyTorch's defaults with no environment); the
ratio and the verdict from given measurements. The runs themselves:
tests/integration/test_compare_cmd.py."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pytest

from autotune.core import allocator
from autotune.core.choice import interleave
from autotune.core.config import MeasureSettings, TrialConfig
from autotune.core.knobs import KNOBS
from autotune.core.target import Target
from autotune.profile.profile import Profile
from autotune.script.compare import (
    AS_IS,
    KEYS,
    Arm,
    Plan,
    Run,
    add_compare_parser,
    as_is_config,
    make_plan,
    ratio,
    split_words,
    summary,
    verdict,
)
from tests.conftest import in_process

#: torchrun beside this interpreter (the virtualenv's), whether or not its bin is on PATH.
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
#: A command that leaves a file behind if it ever runs, of the profiles' world size (2: the
#: option is read from anywhere in the command, as for torchrun; python -c ignores it).
MARKER = "started-marker"
TOUCH = ["--", sys.executable, "-c", f"open({MARKER!r}, 'w')", "--nproc-per-node", "2"]


def write_profile(path: Path, *, world_size: int = 2, global_batch: int = 64, **knobs) -> Path:
    """A profile as ``autotune run`` exports it: the defaults of a gloo CPU target with
    ``knobs`` changed (the allocator pin and the threads in its environment)."""
    t = Target(
        backend="gloo",
        device="cpu",
        world_size=world_size,
        global_batch=global_batch,
        cpus_per_rank=1,
    )
    values = {**{n: k.default_for(t) for n, k in KNOBS.items()}, **knobs}
    return Profile.from_config(
        TrialConfig.from_values(values, t),
        study={"name": "compare-test", "best_trial": 1, "baseline_trial": 0},
        workload={
            "trainer": "script",
            "options": {},
            "world_size": world_size,
            "backend": "gloo",
            "global_batch": global_batch,
        },
        hardware={"device": "cpu"},
        measured={"baseline_samples_per_s": 100.0, "best_samples_per_s": 120.0, "speedup": 1.2},
    ).save(path)


@pytest.fixture
def here(tmp_path):
    """A fresh directory holding ``best.yaml`` (2 ranks, global batch 64), ``other.yaml`` (the
    same at global batch 128) and ``broken.yaml`` (not YAML)."""
    write_profile(tmp_path / "best.yaml", gradient_as_bucket_view=True)
    write_profile(tmp_path / "other.yaml", global_batch=128)
    (tmp_path / "broken.yaml").write_text("version: [1\n")
    return tmp_path


#: (arguments after `autotune compare`, what the one line must name)
BAD = {
    "no --": (["asis", "best.yaml", "touch", MARKER], "no command after --"),
    "nothing after --": (["asis", "best.yaml", "--"], "no command after --"),
    "one profile": (["best.yaml", *TOUCH], "give two profiles"),
    "missing profile": (["asis", "nope.yaml", *TOUCH], "B nope.yaml: no such file"),
    "not YAML": (["broken.yaml", "asis", *TOUCH], "not valid YAML"),
    "both asis, no batch": (["asis", "asis", *TOUCH], "give --global-batch"),
    "batches differ": (["best.yaml", "other.yaml", *TOUCH], "different global batches"),
    "batch flag differs": (
        ["--global-batch", "32", "asis", "best.yaml", *TOUCH],
        "--global-batch 32",
    ),
    "world differs": (
        ["asis", "best.yaml", "--", TORCHRUN, "--nproc-per-node", "4", "x.py"],
        "measured with 2 ranks and the command starts 4",
    ),
    "several nodes": (
        ["asis", "best.yaml", "--", TORCHRUN, "--nnodes", "2", "x.py"],
        "spans 2 nodes (--nnodes): give --address",
    ),
    "not on PATH": (["asis", "best.yaml", "--", "no-such-command-here"], "no such command"),
    "one round": (["--rounds", "1", "asis", "best.yaml", *TOUCH], "--rounds"),
    "rounds after B": (["asis", "best.yaml", "--rounds", "x", *TOUCH], "--rounds"),
    "a word after B": (["asis", "best.yaml", "stray", *TOUCH], "unexpected 'stray'"),
    "output kind": (["-o", "result.txt", "asis", "best.yaml", *TOUCH], ".yaml or .json"),
    "bad timeout": (["--timeout", "soon", "asis", "best.yaml", *TOUCH], "--timeout"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_one_line_exit_2_and_nothing_runs(name, here):
    args, said = BAD[name]
    before = sorted(here.rglob("*"))
    p = in_process("compare", *args, cwd=here)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, p.stdout + p.stderr
    assert len(lines) == 1 and "Traceback" not in p.stderr and said in lines[0], p.stderr
    assert p.stdout == ""
    assert sorted(here.rglob("*")) == before  # the command never ran: no marker, no output


def test_asis_beside_a_file_of_that_name_is_refused_and_dot_slash_names_the_file(here):
    write_profile(here / AS_IS)
    p = in_process("compare", AS_IS, "best.yaml", *TOUCH, cwd=here)
    assert p.returncode == 2 and f"write ./{AS_IS} for the file" in p.stderr, p.stderr
    # ./asis is the file: both sides are profiles now, and the plan gets to the command's own
    # check (its world size, 1, is not the profiles' 2) without running it
    p = in_process("compare", f"./{AS_IS}", "best.yaml", "--", "true", cwd=here)
    assert p.returncode == 2 and "measured with 2 ranks and the command starts 1" in p.stderr
    assert not (here / MARKER).exists()


def test_the_command_is_what_follows_the_first_double_dash():
    assert split_words(["asis", "b.yaml", "--", "torchrun", "--", "x"]) == (
        "asis",
        "b.yaml",
        [],
        ["torchrun", "--", "x"],
    )
    assert split_words(["a.yaml", "b.yaml", "--rounds", "3", "--", "cmd"])[2] == ["--rounds", "3"]


def test_asis_is_pytorchs_defaults_at_the_global_batch_with_no_environment():
    c = as_is_config(128, 4, "gloo")
    assert c.env == {}  # no allocator pin, no OMP_NUM_THREADS, no NCCL_*
    assert (c.micro_batch, c.accumulation_steps, c.global_batch) == (32, 1, 128)
    assert c.comm_hook == {"name": "none"} and c.precision == "fp32"
    assert c.ddp == {"bucket_cap_mb": 25.0, "gradient_as_bucket_view": False, "static_graph": False}


def parsed(*words: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="autotune")
    add_compare_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["compare", *words])


def test_the_plan_gives_each_side_its_configuration_and_reads_options_after_b(here):
    args = parsed("asis", "best.yaml", "--rounds", "6", "-o", "r.json", *TOUCH)
    plan = make_plan(args, here)
    a, b = plan.arms
    assert (a.key, a.name, a.profile) == ("A", AS_IS, None)
    assert a.config == as_is_config(64, 2, "gloo")  # the profile's global batch, no env
    profile = Profile.load(here / "best.yaml")
    assert (b.key, b.name) == ("B", "best.yaml") and b.config == profile.trial_config()
    assert allocator.ENV.items() <= b.config.env.items()  # the profile's pin goes with it
    assert b.config.ddp["gradient_as_bucket_view"] is True
    assert (plan.world_size, plan.global_batch, plan.rounds) == (2, 64, 6)
    assert plan.output == Path("r.json") and plan.command == tuple(TOUCH[1:])
    assert plan.measure == MeasureSettings() and plan.timeout_s == 600  # autotune run's
    assert not (here / MARKER).exists() and not (here / "r.json").exists()


def test_both_asis_run_the_given_global_batch():
    plan = make_plan(parsed("--global-batch", "96", "asis", "asis", *TOUCH), Path.cwd())
    assert [a.config for a in plan.arms] == [as_is_config(96, 2, "gloo")] * 2


def test_the_ratio_pairs_rounds_so_a_drift_common_to_both_cancels():
    # the machine slows down round by round; B is 1.2x A in every round
    a = [300.0, 200.0, 100.0]
    b = [360.0, 240.0, 120.0]
    r = ratio(a, b)
    assert r.median == pytest.approx(1.2) and r.low == pytest.approx(1.2) == r.high
    assert verdict(r) == "B is faster: B/A 1.20x [1.20, 1.20]"


def test_the_ratio_is_the_geometric_mean_of_the_rounds_ratios_with_a_t_interval():
    a, b = [100.0, 100.0, 100.0, 100.0], [110.0, 130.0, 120.0, 125.0]
    r = ratio(a, b)
    logs = [math.log(y / x) for x, y in zip(a, b, strict=True)]
    mean = sum(logs) / 4
    sd = math.sqrt(sum((v - mean) ** 2 for v in logs) / 3)
    half = 3.182446 * sd / 2  # t(0.975, 3) * sd / sqrt(4)
    assert r.median == pytest.approx(math.exp(mean))
    assert (r.low, r.high) == pytest.approx((math.exp(mean - half), math.exp(mean + half)))
    assert r.low > 1 and verdict(r).startswith("B is faster: B/A 1.21x [")


def test_the_verdict_says_slower_and_no_difference_only_when_the_interval_says_so():
    slower = ratio([100.0, 102.0, 98.0], [80.0, 83.0, 78.0])
    assert slower.high < 1 and verdict(slower) == "B is slower: B/A 0.80x [0.78, 0.83]"
    noise = ratio([100.0, 100.0, 100.0], [95.0, 106.0, 101.0])
    assert noise.low < 1 < noise.high
    assert verdict(noise) == "no difference beyond the noise: B/A 1.01x [0.88, 1.15]"


def test_fewer_than_two_paired_rounds_give_no_ratio():
    with pytest.raises(ValueError, match="two or more paired rounds"):
        ratio([100.0], [120.0])
    with pytest.raises(ValueError, match="two or more paired rounds"):
        ratio([100.0, 101.0], [120.0])


def plan(rounds: int = 2) -> Plan:
    arms = (
        Arm("A", AS_IS, as_is_config(64, 2, "gloo")),
        Arm("B", "best.yaml", as_is_config(64, 2, "gloo"), profile=object()),
    )
    return Plan(arms, ("torchrun", "train.py"), 2, 64, "gloo", rounds, MeasureSettings(), 60.0)


def test_the_summary_pairs_each_round_and_gives_no_ratio_once_a_run_failed():
    order = interleave(KEYS, 2)
    assert order == ["A", "B", "B", "A"]  # the order the runs are made in
    values = {"A": [100.0, 110.0], "B": [130.0, 140.0]}
    runs, seen = [], {"A": 0, "B": 0}
    for key in order:
        runs.append(
            Run(
                round=seen[key] + 1,
                key=key,
                samples_per_s=values[key][seen[key]],
                interval=(90.0, 150.0),
                windows=[1.0, 2.0],
                stop="converged",
            )
        )
        seen[key] += 1
    s = summary(plan(), runs)
    assert s["arms"]["A"]["samples_per_s"] == [100.0, 110.0] and s["arms"]["A"]["as_is"]
    expected = ratio(values["A"], values["B"])
    assert s["ratio"]["b_over_a"] == expected.to_dict() and s["verdict"] == verdict(expected)
    runs[-1] = Run(round=2, key="A", failure="crash: the command exited with status 1")
    failed = summary(plan(), runs)
    assert "ratio" not in failed and failed["runs"][-1]["failure"].startswith("crash")
