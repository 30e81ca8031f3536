"""Script mode across the network lab's nodes (issue 39's goals), in one invocation, as a user
types it: a communication-bound torchrun script tuned across N lab nodes, its first screening
trial, and the exported profile re-measured outside the run against the best single lever.

    autotune lab up --nodes 2 --rate 300mbit --cpus-per-node 1
    python bench/script_nodes.py --nodes 2 --budget 5m --rounds 4
    autotune lab down

1. ``autotune lab exec -- autotune run --address auto --budget B --global-batch 64N -- torchrun
   --nnodes N --nproc-per-node 1 bench/mlp_script.py --width 1536 --layers 6`` (a 14.2 M-parameter
   MLP: 56.7 MB of fp32 gradients a step), in a fresh run directory.
2. From the run's study: the first measurement's line, the screening order, the first screening
   trial and what it changed; the best single-knob trial (the best lever), exported with
   ``autotune export --trial``.
3. ``autotune compare --address auto LEVER BEST -- <the same torchrun>`` in ``--rounds``
   interleaved rounds: the exported profile over the best single lever (the goal: >= 0.95).
4. Script trial overhead (a trial's wall time outside its timed windows: start-up, warm-up and
   ending the command on every node), from the study, beside the one-node figure in
   docs/script-mode.md.

Written under ``--out``: ``run.log``, ``compare.log`` and ``result.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna

REPO = Path(__file__).resolve().parents[1]
AUTOTUNE = str(Path(sys.executable).parent / "autotune")
TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def command(nodes: int) -> list[str]:
    return [
        TORCHRUN,
        "--nnodes",
        str(nodes),
        "--nproc-per-node",
        "1",
        "bench/mlp_script.py",
        "--width",
        "1536",
        "--layers",
        "6",
    ]


def lab_exec(*args: str, log: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    p = subprocess.run(
        [AUTOTUNE, "lab", "exec", "--", AUTOTUNE, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    log.write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        raise SystemExit(f"autotune {args[0]} failed (exit {p.returncode}); see {log}")
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--budget", default="5m")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="script-nodes-")))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    home = args.out / "home"
    env = {**__import__("os").environ, "AUTOTUNE_HOME": str(home)}
    batch = 64 * args.nodes
    run = lab_exec(
        "run",
        "--address",
        "auto",
        "--budget",
        args.budget,
        "--global-batch",
        str(batch),
        "--",
        *command(args.nodes),
        log=args.out / "run.log",
        env=env,
    )
    lines = run.stdout.splitlines()
    name = f"default-script-mlp_script-gloo-{args.nodes}r"
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{home / 'autotune.db'}")
    trials = [t for t in study.trials if t.values]
    base = trials[0].values[0]
    screened = [t for t in study.trials if t.user_attrs.get("screen")]
    singles = [t for t in screened if t.values and "," not in t.user_attrs["screen"]]
    lever = max(singles, key=lambda t: t.values[0])
    lever_yaml = args.out / "lever.yaml"
    subprocess.run(
        [
            AUTOTUNE,
            "export",
            "--run-dir",
            str(home),
            "--trial",
            str(lever.number),
            "-o",
            str(lever_yaml),
        ],
        check=True,
        env=env,
    )
    best_yaml = home / "profiles" / f"{name}.yaml"
    cmp = lab_exec(
        "compare",
        "--address",
        "auto",
        "--rounds",
        str(args.rounds),
        str(lever_yaml),
        str(best_yaml),
        "--",
        *command(args.nodes),
        log=args.out / "compare.log",
        env=env,
    )
    ratio = next(ln for ln in cmp.stdout.splitlines() if ln.startswith("B/A"))
    from autotune.record.trial import measured

    done = [t for t in study.trials if t.values]
    before = [measured(t, "overhead_s") for t in done if measured(t, "overhead_s") is not None]
    result = {
        "first_measurement": next((ln for ln in lines if ln.startswith("First measurement")), None),
        "screening_order": next((ln for ln in lines if ln.startswith("Screening order")), None),
        "first_screening_trial": screened[0].user_attrs["screen"] if screened else None,
        "baseline_samples_per_s": base,
        "lever": {
            "trial": lever.number,
            "changes": lever.user_attrs["screen"],
            "samples_per_s": lever.values[0],
        },
        "exported": next((ln for ln in lines if ln.startswith("Exported")), None),
        "stopped": next((ln for ln in lines if ln.startswith("Stopped")), None),
        "best_over_lever": ratio,
        "median_overhead_s": statistics.median(before) if before else None,
        "trials": len(study.trials),
    }
    (args.out / "result.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    print(f"written under {args.out}")


if __name__ == "__main__":
    main()
