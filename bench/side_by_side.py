"""Side-by-side benchmark: PyTorch defaults, the hand recipe, random search, this tuner and an
exhaustive grid (the oracle), on one workload, at one budget, in one invocation.

    python bench/side_by_side.py --budget 10m --seeds 5          # the issue's setting
    python bench/side_by_side.py --budget 3m --seeds 5           # what the README quotes

What it does, in order (one local Ray instance for all of it):

1. For each seed: ``autotune run`` with the TPE sampler (this tuner, as shipped) and with
   Optuna's RandomSampler, at the same budget, same study definition, same measurement
   protocol, pruning and re-validation. Each exports its profile.
2. The oracle: Optuna's GridSampler over every point of a reduced space
   (``bench/oracle_space.yaml``: bucket size, gradient_as_bucket_view, fp16 hook, micro-batch),
   with its own re-validation; its profile is the best grid point.
3. The hand recipe from the seed articles, mapped onto the workload: bucket 100 MB, fp16
   compression hook, AMP (bf16 on a CPU, where fp16 autocast is not a setting; fp16 on a GPU),
   4 DataLoader workers, accumulation 4 at the same global batch.
4. Every contender's configuration (defaults, recipe, oracle, each run's exported profile) is
   measured again, interleaved (Williams design), ``--rounds`` rounds, by the same runner. Ratios
   against the defaults and against the oracle are paired by round, with 95 % intervals
   (``autotune.stats.speedup_ci``). Identical configurations are measured once.

Printed and saved under ``--out``: ``contenders.csv`` (one row per contender), ``runs.csv``
(one row per tuning run: trials, overhead, budget efficiency, exported vs re-measured
speedup), ``results.json`` (everything, raw samples included) and ``ratios.png``.

Budget efficiency of a run = seconds inside timed windows (search trials and re-validation
runs) / the run's wall time from start to exported profile. Trial overhead = a trial's wall
time outside its timed windows (process start when fresh, process group, model, warm-up,
result transfer).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune import tuner
from autotune.config import TrialConfig
from autotune.durations import parse_duration
from autotune.errors import AutotuneError, TrialFailed
from autotune.knobs import Target
from autotune.launcher import TrialRunner, connect
from autotune.profile import Profile
from autotune.progress import RunView
from autotune.space import SearchSpace
from autotune.stats import Interval, interleave, median_ci, speedup_ci
from autotune.storage import default_url
from autotune.studydef import StudyDefinition

HERE = Path(__file__).resolve().parent
#: The goals of the issue, checked against the numbers at the end.
GOAL_ORACLE_SHARE = 0.97
GOAL_WINS = 4  # of 5 seeds
GOAL_REPRODUCE = 0.10
GOAL_OVERHEAD_S = 3.0
GOAL_EFFICIENCY = 0.60


def args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--study", default="default", help="study definition (name or path)")
    p.add_argument("--budget", default="10m", help="budget of each tuning run (tuner, random)")
    p.add_argument("--seeds", type=int, default=5, help="seeds for the tuner and random search")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the final runs")
    p.add_argument("--oracle-space", default=str(HERE / "oracle_space.yaml"))
    p.add_argument("--oracle-budget", default="60m", help="cap on the grid (stops when done)")
    p.add_argument("--out", default=str(HERE / "results"), help="where results are written")
    return p


def _view(budget_s: float) -> RunView:
    from rich.console import Console

    return RunView(Console(highlight=False), budget_s=budget_s, live=False)


def tuning_run(d: StudyDefinition, out: Path, name: str, **changes: Any) -> dict[str, Any]:
    """One ``autotune run`` (the library call the CLI makes) and what it cost."""
    from optuna.trial import TrialState

    d = replace(d, **changes)
    print(f"\n=== {name}: sampler {d.sampler}, seed {d.seed}, budget {d.budget_s:.0f}s", flush=True)
    started = time.monotonic()
    req = tuner.RunRequest(definition=d, run_dir=out / "runs", study_name=name)
    with _view(d.budget_s) as view:
        summary = tuner.run(req, view)
    wall = time.monotonic() - started
    study = summary.study
    measured = [
        t
        for t in study.trials
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and "window_s" in t.user_attrs
    ]
    validation = study.user_attrs.get("validation") or {}
    timed = sum(t.user_attrs["window_s"] for t in measured) + validation.get("timed_s", 0.0)
    profile = Profile.load(summary.profile_path)
    return {
        "name": name,
        "sampler": d.sampler,
        "seed": d.seed,
        "budget_s": d.budget_s,
        "wall_s": round(wall, 1),
        "trials": len(study.trials),
        "complete": sum(t.state == TrialState.COMPLETE for t in study.trials),
        "pruned": sum(t.state == TrialState.PRUNED for t in study.trials),
        "failed": sum(t.state == TrialState.FAIL for t in study.trials),
        "overheads_s": [t.user_attrs["overhead_s"] for t in measured],
        "overhead_median_s": round(
            statistics.median(t.user_attrs["overhead_s"] for t in measured), 2
        ),
        "timed_s": round(timed, 1),
        "efficiency": round(timed / wall, 3),
        "search_best": summary.best,
        "search_best_speedup": None if not summary.baseline else summary.best / summary.baseline,
        "exported_speedup": profile.measured.get("speedup"),
        "exported_interval": profile.measured.get("speedup_interval"),
        "validated": bool((validation or {}).get("beats_baseline")),
        "config": profile.trial_config().to_dict(),
    }


def recipe_config(defaults: TrialConfig, target: Target) -> tuple[TrialConfig, list[str]]:
    """The hand recipe mapped onto the workload; the notes say what had to be mapped."""
    notes = []
    per_rank = target.per_rank_batch
    accum = 4 if per_rank % 4 == 0 else 1
    if accum == 1:
        notes.append(f"accumulation 4 does not divide the per-rank batch {per_rank}: kept at 1")
    amp = "fp16" if target.device == "cuda" else ("bf16" if target.bf16 else "fp32")
    if target.device != "cuda":
        notes.append(f"AMP as {amp} autocast (fp16 autocast is a GPU setting)")
    cfg = replace(
        defaults,
        ddp={**defaults.ddp, "bucket_cap_mb": 100.0},
        comm_hook={"name": "fp16"},
        data={**defaults.data, "num_workers": 4, "prefetch_factor": 2, "persistent_workers": False},
        precision=amp,
        micro_batch=per_rank // accum,
        accumulation_steps=accum,
    )
    return cfg, notes


def side_by_side(
    d: StudyDefinition, target: Target, configs: dict[str, TrialConfig], rounds: int
) -> tuple[dict[str, list[float]], dict[str, str], list[str]]:
    """Measure every configuration ``rounds`` times, interleaved; returns samples by key, the
    failures, and the order."""
    runner = TrialRunner(world_size=target.world_size, backend=target.backend)
    order = interleave(list(configs), rounds)
    samples: dict[str, list[float]] = {k: [] for k in configs}
    failed: dict[str, str] = {}
    print(f"\n=== side by side: {len(configs)} configurations x {rounds} rounds", flush=True)
    try:
        for i, key in enumerate(order):
            if key in failed:
                continue
            try:
                res = runner.run(
                    trial=i,
                    trainer=d.trainer,
                    trainer_options=d.trainer_options,
                    config=configs[key],
                    measure=d.measure,
                    seed=d.seed or 0,
                    timeout_s=300,
                )
            except TrialFailed as e:
                failed[key] = f"{e.reason}: {e.detail}"
                print(f"  {key:>14}  FAIL {failed[key]}", flush=True)
                continue
            samples[key].append(res.throughput)
            print(f"  {key:>14} {res.throughput:9.1f} samples/s", flush=True)
    finally:
        runner.close()
    return samples, failed, order


def _ratio(a: list[float], b: list[float]) -> Interval | None:
    return speedup_ci(a, b) if len(a) >= 2 and len(a) == len(b) else None


def _fmt(ci: Interval | None) -> str:
    if ci is None:
        return "-"
    return f"{ci.median:.3f} [{ci.low:.3f}, {ci.high:.3f}]"


def main(argv: list[str] | None = None) -> int:
    a = args_parser().parse_args(argv)
    try:
        d = StudyDefinition.load(a.study)
        budget = parse_duration(a.budget)
        oracle_budget = parse_duration(a.oracle_budget)
        SearchSpace.load(a.oracle_space)  # a bad space stops here, before any run
    except AutotuneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(a.out)
    if out.exists() and any(out.iterdir()):
        print(f"error: --out {out}: not empty; pick a new folder or remove it", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    conn = connect(None)
    try:
        runs = []
        for seed in range(a.seeds):
            for sampler in ("tpe", "random"):
                name = f"{'tuner' if sampler == 'tpe' else 'random'}-s{seed}"
                runs.append(tuning_run(d, out, name, sampler=sampler, seed=seed, budget_s=budget))
        oracle = tuning_run(
            d, out, "oracle", sampler="grid", seed=0, budget_s=oracle_budget, space=a.oracle_space
        )

        # The contenders' configurations: the baseline's defaults come from a finished study.
        import optuna

        base_study = optuna.load_study(
            study_name=runs[0]["name"], storage=default_url(out / "runs")
        )
        baseline = tuner._baseline_trial(base_study)
        defaults = TrialConfig.from_dict(baseline.user_attrs["config"])
        record = base_study.user_attrs[tuner.ATTR]
        wl = record["workload"]
        target = Target(
            backend=wl["backend"],
            device=record["hardware"]["device"],
            world_size=wl["world_size"],
            global_batch=wl["global_batch"],
            cpus_per_rank=1,  # not used by the recipe
            bf16=record["hardware"]["device"] == "cpu",  # every CPU runs bf16 autocast
        )
        recipe, recipe_notes = recipe_config(defaults, target)
        named = {
            "defaults": defaults,
            "recipe": recipe,
            "oracle": TrialConfig.from_dict(oracle["config"]),
        }
        named.update({r["name"]: TrialConfig.from_dict(r["config"]) for r in runs})
        # Identical configurations are measured once and share their samples.
        keys: dict[str, str] = {}
        unique: dict[str, TrialConfig] = {}
        for name, cfg in named.items():
            same = next((k for k, c in unique.items() if c == cfg), None)
            keys[name] = same or name
            if same is None:
                unique[name] = cfg
        samples, failed, order = side_by_side(d, target, unique, a.rounds)
    finally:
        conn.close()

    def of(name: str) -> list[float]:
        return samples.get(keys[name], [])

    rows = []
    for name in named:
        xs = of(name)
        rows.append(
            {
                "contender": name,
                "measured_as": keys[name],
                "samples_per_s": median_ci(xs) if len(xs) >= 2 else None,
                "vs_defaults": _ratio(xs, of("defaults")),
                "vs_oracle": _ratio(xs, of("oracle")),
                "failed": failed.get(keys[name], ""),
            }
        )
    by_run = {r["name"]: r for r in runs}
    for r in [*runs, oracle]:
        re = _ratio(of(r["name"]), of("defaults"))
        r["remeasured_speedup"] = None if re is None else re.median
        exp = r["exported_speedup"]
        r["reproduces"] = (
            None if re is None or not exp else abs(re.median / exp - 1) <= GOAL_REPRODUCE
        )

    # Goals.
    tuners = [r for r in runs if r["sampler"] == "tpe"]
    wins, wins_beyond_noise, shares = 0, 0, []
    for r in tuners:
        rival = by_run[f"random-s{r['seed']}"]
        vs = _ratio(of(r["name"]), of(rival["name"]))
        if vs is not None and keys[r["name"]] != keys[rival["name"]]:
            wins += vs.median > 1
            wins_beyond_noise += vs.low > 1
        share = _ratio(of(r["name"]), of("oracle"))
        if share is not None:
            shares.append(share.median)
    all_overheads = [o for r in tuners for o in r["overheads_s"]]
    goals = {
        "tuner_vs_oracle_median_share": round(statistics.median(shares), 3) if shares else None,
        "seeds_at_or_above_97pct_of_oracle": f"{sum(x >= GOAL_ORACLE_SHARE for x in shares)}"
        f"/{len(shares)}",
        "seeds_tuner_beats_random": f"{wins}/{len(tuners)} ({wins_beyond_noise} beyond the noise)",
        "tuner_runs_reproducing_within_10pct": f"{sum(bool(r['reproduces']) for r in tuners)}"
        f"/{len(tuners)}",
        "median_trial_overhead_s": round(statistics.median(all_overheads), 2)
        if all_overheads
        else None,
        "budget_efficiency_median": round(statistics.median(r["efficiency"] for r in tuners), 3),
    }

    # Output.
    from rich.console import Console
    from rich.table import Table

    table = Table("contender", "measured as", "samples/s [95 %]", "vs defaults", "vs oracle")
    for row in rows:
        ci = row["samples_per_s"]
        tp = "-" if ci is None else f"{ci.median:.1f} [{ci.low:.1f}, {ci.high:.1f}]"
        ratios = (_fmt(row["vs_defaults"]), _fmt(row["vs_oracle"]))
        table.add_row(row["contender"], row["measured_as"], tp, *ratios)
    runs_table = Table(
        "run", "trials", "overhead (median)", "efficiency", "exported", "re-measured"
    )
    for r in [*runs, oracle]:
        exp, re = r["exported_speedup"], r["remeasured_speedup"]
        runs_table.add_row(
            r["name"],
            str(r["trials"]),
            f"{r['overhead_median_s']:.2f}s",
            f"{r['efficiency']:.0%}",
            "-" if exp is None else f"{exp:.3f}x",
            "-" if re is None else f"{re:.3f}x",
        )
    console = Console(highlight=False)
    console.print(table, runs_table)
    print("\nrecipe: " + ("; ".join(recipe_notes) or "as written"))
    print("goals: " + json.dumps(goals, indent=1))
    print(f"total {time.monotonic() - started:.0f}s; written to {out}")

    with open(out / "contenders.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "contender",
                "measured_as",
                "samples_per_s",
                "low",
                "high",
                "vs_defaults",
                "vs_defaults_low",
                "vs_defaults_high",
                "vs_oracle",
                "vs_oracle_low",
                "vs_oracle_high",
                "failed",
            ]
        )
        for row in rows:
            cells = []
            for k in ("samples_per_s", "vs_defaults", "vs_oracle"):
                ci = row[k]
                cells += (
                    [None, None, None]
                    if ci is None
                    else [round(ci.median, 4), round(ci.low, 4), round(ci.high, 4)]
                )
            w.writerow([row["contender"], row["measured_as"], *cells, row["failed"]])
    run_cols = [
        "name",
        "sampler",
        "seed",
        "budget_s",
        "wall_s",
        "trials",
        "complete",
        "pruned",
        "failed",
        "overhead_median_s",
        "timed_s",
        "efficiency",
        "search_best",
        "search_best_speedup",
        "exported_speedup",
        "remeasured_speedup",
        "reproduces",
    ]
    with open(out / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, run_cols, extrasaction="ignore")
        w.writeheader()
        w.writerows([*runs, oracle])
    everything = {
        "args": vars(a),
        "goals": goals,
        "recipe_notes": recipe_notes,
        "order": order,
        "samples": samples,
        "measured_as": keys,
        "failed": failed,
        "runs": [*runs, oracle],
        "contenders": [
            {k: (v.to_dict() if isinstance(v, Interval) else v) for k, v in row.items()}
            for row in rows
        ],
    }
    (out / "results.json").write_text(json.dumps(everything, indent=1, default=str))
    _chart(rows, out / "ratios.png")
    return 0


def _chart(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = [r for r in rows if r["vs_defaults"] is not None or r["contender"] == "defaults"]
    names = [r["contender"] for r in drawn]
    med = [1.0 if r["vs_defaults"] is None else r["vs_defaults"].median for r in drawn]
    lo = [
        0.0 if r["vs_defaults"] is None else r["vs_defaults"].median - r["vs_defaults"].low
        for r in drawn
    ]
    hi = [
        0.0 if r["vs_defaults"] is None else r["vs_defaults"].high - r["vs_defaults"].median
        for r in drawn
    ]
    hi = [0.0 if not math.isfinite(h) else h for h in hi]
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(names)), 4))
    ax.bar(names, med, yerr=[lo, hi], capsize=3, color="#4c72b0")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylabel("throughput / defaults (95 % interval)")
    ax.set_title("Side by side, re-measured interleaved")
    plt.setp(ax.get_xticklabels(), rotation=45, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
