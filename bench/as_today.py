"""Does "your job as it runs today" hold on the user's own script? The figure a run reports
(the exported profile's ``measured.as_is.speedup``) against the user's own torchrun script
timed as it is and under the exported profile, interleaved, by ``autotune compare``.

    python bench/as_today.py --mode default --budget 3m     # the built-in default study
    python bench/as_today.py --mode script --budget 3m      # script mode on the same script
    python bench/as_today.py --mode default --repeats 2     # the whole check twice

For each repeat, in a fresh run directory: ``autotune run`` (``--space default``, or script
mode on ``bench/mlp_script.py``, the default study's model written as a plain torchrun
script), then ``autotune compare asis PROFILE -- torchrun --nproc-per-node 2
bench/mlp_script.py`` over ``--rounds`` interleaved rounds. The goal (issue 32): the run's
figure within +-10 % of the ratio the user measures. Prints one row per repeat and writes
``as_today.json`` under ``--out``. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "mlp_script.py"
AUTOTUNE = str(Path(sys.executable).with_name("autotune"))
TORCHRUN = [str(Path(sys.executable).with_name("torchrun")), "--nproc-per-node", "2"]
GOAL = 0.10


def tune(mode: str, budget: str, home: Path) -> Path:
    """One ``autotune run`` in ``home``; the exported profile's path."""
    if mode == "default":
        cmd = [AUTOTUNE, "run", "--space", "default", "--budget", budget]
    else:
        cmd = [
            AUTOTUNE,
            "run",
            "--global-batch",
            "128",
            "--budget",
            budget,
            "--",
            *TORCHRUN,
            str(SCRIPT),
        ]
    env = {**os.environ, "AUTOTUNE_HOME": str(home)}
    p = subprocess.run(cmd, cwd=home, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"as_today: autotune run failed ({p.returncode}):\n{p.stdout[-3000:]}{p.stderr}")
    (home / "run.txt").write_text(p.stdout + p.stderr)
    profiles = sorted((home / "profiles").glob("*.yaml"))
    if len(profiles) != 1:
        sys.exit(f"as_today: expected one exported profile in {home}/profiles")
    return profiles[0]


def compare(profile: Path, rounds: int, home: Path) -> dict[str, Any]:
    """``autotune compare asis PROFILE -- torchrun ... mlp_script.py``: its JSON output."""
    out = home / "compare.json"
    cmd = [
        AUTOTUNE,
        "compare",
        "asis",
        str(profile),
        "--rounds",
        str(rounds),
        "-o",
        str(out),
        "--",
        *TORCHRUN,
        str(SCRIPT),
    ]
    env = {**os.environ, "AUTOTUNE_HOME": str(home)}
    p = subprocess.run(cmd, cwd=home, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"as_today: autotune compare failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    return json.loads(out.read_text())


def one(mode: str, budget: str, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="as-today-") as tmp:
        home = Path(tmp)
        profile = tune(mode, budget, home)
        measured = yaml.safe_load(profile.read_text())["measured"]
        as_is = measured.get("as_is") or {}
        cmp = compare(profile, rounds, home)
    ratio = cmp["ratio"]["b_over_a"]
    row: dict[str, Any] = {
        "mode": mode,
        "budget": budget,
        "run_as_today": as_is.get("speedup"),
        "run_knobs": as_is.get("knobs"),
        "run_pin": as_is.get("pin"),
        "not_measured": as_is.get("not_measured"),
        "user_ratio": [ratio["low"], ratio["median"], ratio["high"]],
        "user_samples_per_s": {k: a["samples_per_s"] for k, a in cmp["arms"].items()},
    }
    if row["run_as_today"]:
        row["off_by"] = row["run_as_today"][1] / ratio["median"] - 1
        row["within_goal"] = abs(row["off_by"]) <= GOAL
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["default", "script"], default="default")
    p.add_argument("--budget", default="3m", help="each tuning run's budget")
    p.add_argument("--rounds", type=int, default=4, help="autotune compare's rounds")
    p.add_argument("--repeats", type=int, default=1, help="how many times the whole check")
    p.add_argument("--out", default=str(HERE / "results"), help="where as_today.json goes")
    a = p.parse_args()
    rows = []
    print("| mode | run: as today (95 % interval) | user's script: profile / as is | off by |")
    print("|---|---|---|---|")
    for _ in range(a.repeats):
        r = one(a.mode, a.budget, a.rounds)
        rows.append(r)
        ours = (
            ("not measured: " + str(r["not_measured"]))
            if not r["run_as_today"]
            else ("{1:.3f}x [{0:.3f}, {2:.3f}]".format(*r["run_as_today"]))
        )
        user = "{1:.3f}x [{0:.3f}, {2:.3f}]".format(*r["user_ratio"])
        off = f"{r['off_by']:+.1%}" if "off_by" in r else "-"
        print(f"| {a.mode} | {ours} | {user} | {off} |", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "as_today.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r.get("within_goal") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
