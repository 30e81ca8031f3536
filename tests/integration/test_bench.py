"""The side-by-side benchmark runs end to end at a tiny scale (the quick workload, a 12 s budget,
one seed, a two-point grid capped at 20 s, not the hour it may take by default: the grid is
measured in about 6 s, and a re-validation sized to the budget left would fill the rest -
at a 1-minute cap it ran 10 rounds and the test took 88 s, at 20 s 66 s) and writes what the
README says it writes. Its numbers are not checked here: they are measurements, reported by
the script, not asserted."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration

SCRIPT = REPO / "bench" / "side_by_side.py"


def bench(env, *args, rc=0):
    p = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == rc, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def test_the_benchmark_runs_every_contender_and_writes_its_results(ray_address, run_env, tmp_path):
    out = tmp_path / "bench"
    bench(
        run_env,
        "--study",
        "quick",
        "--budget",
        "12s",
        "--seeds",
        "1",
        "--rounds",
        "2",
        "--oracle-space",
        str(REPO / "tests" / "integration" / "oracle_tiny.yaml"),
        "--oracle-budget",
        "20s",
        "--out",
        str(out),
        "--address",
        ray_address,
    )
    raw = json.loads((out / "raw.json").read_text())
    runs = {r["name"]: r for r in raw["runs"]}
    assert set(runs) == {"tuner-s0", "random-s0", "oracle"} and not raw["errors"]
    assert runs["oracle"]["complete"] + runs["oracle"]["pruned"] >= 2  # both grid points ran
    assert runs["tuner-s0"]["sampler"] == "tpe" and runs["random-s0"]["sampler"] == "random"
    for r in runs.values():
        assert r["overheads_s"] and 0 < r["efficiency"] < 1 and r["timed_s"] > 0
    # the tuning runs' exported configuration against its ideal-overlap bound; not the oracle's
    assert runs["tuner-s0"]["share_of_ideal"] > 0 and runs["oracle"]["share_of_ideal"] is None
    # every distinct configuration measured once per round, interleaved: A B B A for two
    for key, xs in raw["samples"].items():
        assert len(xs) == 2, (key, xs)
    assert sorted(raw["order"]) == sorted(list(raw["samples"]) * 2)
    recipe = raw["configs"]["recipe"]
    assert recipe["comm_hook"] == {"name": "fp16"} and recipe["ddp"]["bucket_cap_mb"] == 100.0
    assert recipe["data"]["num_workers"] == 4 and recipe["accumulation_steps"] == 4
    with open(out / "contenders.csv") as f:
        rows = {r["contender"]: r for r in csv.DictReader(f)}
    assert {"defaults", "recipe", "tuner-s0", "random-s0", "oracle"} <= set(rows)
    assert float(rows["defaults"]["vs_defaults"]) == 1.0
    assert float(rows["recipe"]["vs_defaults"]) > 0
    goals = json.loads((out / "goals.json").read_text())
    assert goals["oracle"] in rows and "tuner_vs_random" in goals
    assert (out / "ratios.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(out / "runs.csv") as f:
        assert {r["name"] for r in csv.DictReader(f)} == set(runs)
    # the analysis runs again from raw.json alone
    again = bench(run_env, "--analyse", str(out / "raw.json"))
    assert "goals:" in again.stdout


def test_the_benchmark_refuses_bad_input_before_running_anything(run_env, tmp_path):
    out = tmp_path / "full"
    out.mkdir()
    (out / "x").write_text("")
    p = bench(run_env, "--out", str(out), rc=2)
    assert p.stderr.strip().count("\n") == 0 and "not empty" in p.stderr
    p = bench(run_env, "--seeds", "0", "--out", str(tmp_path / "new"), rc=2)
    assert "--seeds" in p.stderr and not (tmp_path / "new").exists()
