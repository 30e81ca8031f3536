"""The search benchmark on recorded measurements: the tuner's whole loop replayed against a
recorded landscape (``autotune.replay``), for many seeds, beside random search.

    python bench/replay.py                                    # default landscape, 100 seeds
    python bench/replay.py --landscape bench/landscapes/default-loopback.json --seeds 200
    python bench/replay.py --strategies screen+tpe,random --trials 15

Each strategy is one way of running the search (sampler, with or without the designed start);
``random`` is Optuna's RandomSampler without it, the bar. For each seed every strategy replays
one run of ``--trials`` trials (the baseline included) followed by re-validation and the
export's choice; what counts is the true throughput of the exported configuration (the median
of every recorded window of that grid point) over the best point's (the oracle).

Printed: per strategy the median and 10th percentile of the oracle share, the share of seeds
at >= 0.98 of the oracle, and against random search on the same seed wins / ties / losses (a
tie: both exported points within 1 % of each other in true throughput). ``--out`` writes
every replay as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from autotune.replay import Landscape, replay, summarise

HERE = Path(__file__).resolve().parent
DEFAULT_LANDSCAPE = HERE / "landscapes" / "default-loopback.json"
#: name -> (sampler, screening)
STRATEGIES = {
    "random": ("random", False),
    "tpe": ("tpe", False),
    "gp": ("gp", False),
    "screen+tpe": ("tpe", True),
    "screen+gp": ("gp", True),
    "grid": ("grid", False),
}
#: ``grid`` is the reference, not a contender: every point of the landscape measured once
#: (no trial or time limit), then the same re-validation, ablation and export. What it exports
#: is what this measurement protocol can get out of the landscape's noise with full coverage.
UNLIMITED = {"grid"}
#: The issue's goals for the replay: the tuner beats random search in this share of seeds,
#: and its median share of the oracle is at least GOAL_SHARE.
GOAL_WINS = 0.8
GOAL_SHARE = 0.98


def args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--landscape", default=str(DEFAULT_LANDSCAPE))
    p.add_argument("--seeds", type=int, default=100)
    p.add_argument("--trials", type=int, default=15, help="trials per run, the baseline included")
    p.add_argument("--budget", type=float, default=600.0, help="simulated seconds per run")
    p.add_argument(
        "--strategies",
        default=",".join(STRATEGIES),
        help="comma-separated; 'grid' measures every point once: the reference, not a contender",
    )
    p.add_argument("--cold-first", action="store_true", help="the first baseline reads cold")
    p.add_argument(
        "--rerun-windows", type=int, help="windows per re-measurement run (default: the study's)"
    )
    p.add_argument("--jobs", type=int, default=2, help="processes")
    p.add_argument("--out", help="write every replay here (JSON)")
    return p


def one(job: tuple[str, str, int, int, float, bool, int | None]) -> dict[str, Any]:
    path, strategy, seed, trials, budget, cold, rerun_windows = job
    sampler, screening = STRATEGIES[strategy]
    land = Landscape.load(path)
    if strategy in UNLIMITED:
        trials, budget = len(land.runs) * 2, 1e9
    r = replay(
        land,
        seed=seed,
        sampler=sampler,
        screening=screening,
        n_trials=trials,
        budget_s=budget,
        cold_first=cold,
        rerun_windows=rerun_windows,
    )
    return {"strategy": strategy, "seed": seed, "exported": r.exported, "value": r.value,
            "share": r.share, "trials": r.trials, "seconds": r.seconds,
            "efficiency": r.timed_s / r.seconds if r.seconds else 0.0}  # fmt: skip


def run_all(
    path: str,
    strategies: list[str],
    seeds: int,
    trials: int,
    budget: float,
    cold: bool,
    jobs: int,
    rerun_windows: int | None = None,
) -> list[dict[str, Any]]:
    todo = [
        (path, s, seed, trials, budget, cold, rerun_windows)
        for seed in range(seeds)
        for s in strategies
    ]
    if jobs <= 1:
        return [one(j) for j in todo]
    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(one, todo, chunksize=4))


def main() -> None:
    a = args_parser().parse_args()
    strategies = a.strategies.split(",")
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        sys.exit(f"--strategies: unknown {', '.join(unknown)}; choose from {', '.join(STRATEGIES)}")
    land = Landscape.load(a.landscape)
    best, value = land.oracle()
    base = land.value(land.baseline_key)
    print(f"landscape {a.landscape}: {len(land.runs)} points; oracle {best} {value:.1f} "
          f"samples/s ({value / base:.2f}x the defaults' {base:.1f}); cold first baseline "
          f"{land.cold_ratio:.2f}x the warm one")  # fmt: skip
    started = time.monotonic()
    results = run_all(
        a.landscape, strategies, a.seeds, a.trials, a.budget, a.cold_first, a.jobs,
        a.rerun_windows,
    )  # fmt: skip
    table = summarise(results)
    print(f"{a.seeds} seeds x {len(strategies)} strategies, {a.trials} trials each, "
          f"{time.monotonic() - started:.0f} s")  # fmt: skip
    head = ["strategy", "median share", "p10 share", ">=0.98", "vs random (W/T/L)", "beats",
            "trials", "efficiency"]  # fmt: skip
    print(" | ".join(head))
    for name, row in table.items():
        vs = f"{row['wins']}/{row['ties']}/{row['losses']}" if "wins" in row else "-"
        beats = f"{row['win_share']:.0%}" if row.get("win_share") is not None else "-"
        print(f"{name} | {row['median_share']:.3f} | {row['p10_share']:.3f} | "
              f"{row['at_98']:.0%} | {vs} | {beats} | {row['median_trials']} | "
              f"{row.get('median_efficiency', 0):.0%}")  # fmt: skip
    shipped = table.get("screen+tpe")
    if shipped and "win_share" in shipped:
        print(f"goals (screen+tpe): median share {shipped['median_share']:.3f} >= {GOAL_SHARE}: "
              f"{'met' if shipped['median_share'] >= GOAL_SHARE else 'not met'}; beats random "
              f"search in {shipped['win_share']:.0%} of seeds >= {GOAL_WINS:.0%}: "
              f"{'met' if shipped['win_share'] >= GOAL_WINS else 'not met'}")  # fmt: skip
    if a.out:
        Path(a.out).write_text(json.dumps({"summary": table, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
