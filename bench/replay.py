"""The search benchmark on recorded measurements: the tuner's whole loop replayed against a
recorded landscape (``autotune.replay.simulate``), for many seeds, beside random search.

    python bench/replay.py                                    # default landscape, 100 seeds
    python bench/replay.py --landscape bench/landscapes/default-loopback.json --seeds 200
    python bench/replay.py --strategies screen+tpe,random --trials 15
    python bench/replay.py --landscape bench/landscapes/lab-300mbit.json --trials 100000 \
        --budget 300 --strategies screen+tpe,fixed+tpe,random        # budget-bound

Each strategy is one way of running the search (sampler, with or without the designed start);
``random`` is Optuna's RandomSampler without it, the bar. For each seed every strategy replays
one run of ``--trials`` trials (the baseline included) followed by re-validation and the
export's choice; what counts is the true throughput of the exported configuration (the median
of every recorded window of that grid point) over the best point's (the oracle).

``screen+tpe`` is the search as shipped: the screening ordered by the landscape's first
measurement (``autotune.limit.evidence``). ``fixed+tpe`` is the same search with the screening in
the priors' listed order (the previous releases' order). ``--trials 100000`` makes the budget
the only stop (with the convergence stop, unless ``--no-early-stop``).

Printed: per strategy the median and 10th percentile of the oracle share, the share of seeds
at >= 0.98 of the oracle, against random search on the same seed wins / ties / losses (a
tie: both exported points within 1 % of each other in true throughput), the median time to
0.98 of the oracle (the search's first measurement of such a point: trials and simulated
seconds; runs that never measured one count as never), the share of the budget used, the
search's stops by kind, and the budget efficiency. ``--out`` writes every replay as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from autotune.replay.simulate import Landscape, replay
from autotune.replay.table import summarise

HERE = Path(__file__).resolve().parent
DEFAULT_LANDSCAPE = HERE / "landscapes" / "default-loopback.json"
#: name -> (sampler, screening, screening ordered by the first measurement)
STRATEGIES = {
    "random": ("random", False, False),
    "tpe": ("tpe", False, False),
    "gp": ("gp", False, False),
    "screen+tpe": ("tpe", True, True),
    "fixed+tpe": ("tpe", True, False),
    "screen+gp": ("gp", True, True),
    "grid": ("grid", False, False),
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
    p.add_argument(
        "--no-early-stop", action="store_true", help="no convergence stop (the budget, --trials)"
    )
    p.add_argument("--jobs", type=int, default=2, help="processes")
    p.add_argument("--out", help="write every replay here (JSON)")
    return p


def one(job: tuple[str, str, int, int, float, bool, int | None, bool]) -> dict[str, Any]:
    path, strategy, seed, trials, budget, cold, rerun_windows, early_stop = job
    sampler, screening, evidence = STRATEGIES[strategy]
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
        evidence=evidence,
        early_stop=early_stop,
    )
    return {
        "strategy": strategy,
        "seed": seed,
        "exported": r.exported,
        "value": r.value,
        "share": r.share,
        "trials": r.trials,
        "seconds": r.seconds,
        "efficiency": r.timed_s / r.seconds if r.seconds else 0.0,
        "found_s": r.found_s,
        "found_trials": r.found_trials,
        "search_s": r.search_s,
        "stop": r.stop,
        "used": r.seconds / budget,
    }


def run_all(
    path: str,
    strategies: list[str],
    seeds: int,
    trials: int,
    budget: float,
    cold: bool,
    jobs: int,
    rerun_windows: int | None = None,
    early_stop: bool = True,
) -> list[dict[str, Any]]:
    todo = [
        (path, s, seed, trials, budget, cold, rerun_windows, early_stop)
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
    print(
        f"landscape {a.landscape}: {len(land.runs)} points; oracle {best} {value:.1f} "
        f"samples/s ({value / base:.2f}x the defaults' {base:.1f}); cold first baseline "
        f"{land.cold_ratio:.2f}x the warm one"
    )
    started = time.monotonic()
    results = run_all(
        a.landscape,
        strategies,
        a.seeds,
        a.trials,
        a.budget,
        a.cold_first,
        a.jobs,
        a.rerun_windows,
        not a.no_early_stop,
    )
    table = summarise(results)
    print(
        f"{a.seeds} seeds x {len(strategies)} strategies, {a.trials} trials each, "
        f"{time.monotonic() - started:.0f} s"
    )
    head = [
        "strategy",
        "median share",
        "p10 share",
        ">=0.98",
        "vs random (W/T/L)",
        "beats",
        "trials",
        "to 0.98: trials / s",
        "budget used",
        "stops",
        "efficiency",
    ]
    print(" | ".join(head))
    found = time_to_found(results)
    for name, row in table.items():
        vs = f"{row['wins']}/{row['ties']}/{row['losses']}" if "wins" in row else "-"
        beats = f"{row['win_share']:.0%}" if row.get("win_share") is not None else "-"
        f = found[name]
        print(
            f"{name} | {row['median_share']:.3f} | {row['p10_share']:.3f} | "
            f"{row['at_98']:.0%} | {vs} | {beats} | {row['median_trials']} | "
            f"{f['trials']} / {f['seconds']} | {f['used']:.0%} | {f['stops']} | "
            f"{row.get('median_efficiency', 0):.0%}"
        )
    shipped = table.get("screen+tpe")
    if shipped and "win_share" in shipped:
        print(
            f"goals (screen+tpe): median share {shipped['median_share']:.3f} >= {GOAL_SHARE}: "
            f"{'met' if shipped['median_share'] >= GOAL_SHARE else 'not met'}; beats random "
            f"search in {shipped['win_share']:.0%} of seeds >= {GOAL_WINS:.0%}: "
            f"{'met' if shipped['win_share'] >= GOAL_WINS else 'not met'}"
        )
    fixed, rnd = found.get("screen+tpe"), found.get("random")
    if fixed and rnd and rnd["seconds_raw"] not in (None, math.inf):
        half = fixed["seconds_raw"] <= rnd["seconds_raw"] / 2
        print(
            f"goal (screen+tpe): median time to 0.98 of the oracle {fixed['seconds']} s <= "
            f"half of random search's {rnd['seconds']} s: {'met' if half else 'not met'}"
        )
    if a.out:
        Path(a.out).write_text(
            json.dumps({"summary": table, "found": found, "runs": results}, indent=1)
        )


def time_to_found(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per strategy: the median time to 0.98 of the oracle (a run that never measured such a
    point counts as infinitely long, so the median is "never" when over half never did), the
    median share of the budget used, and the search's stops by kind."""
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r["strategy"] for r in results):
        runs = [r for r in results if r["strategy"] == name]
        secs = statistics.median(
            math.inf if r.get("found_s") is None else r["found_s"] for r in runs
        )
        trials = statistics.median(
            math.inf if r.get("found_trials") is None else r["found_trials"] for r in runs
        )
        stops: dict[str, int] = {}
        for r in runs:
            stops[str(r.get("stop"))] = stops.get(str(r.get("stop")), 0) + 1
        out[name] = {
            "seconds_raw": secs,
            "seconds": "never" if math.isinf(secs) else f"{secs:.0f}",
            "trials": "never" if math.isinf(trials) else f"{trials:g}",
            "used": statistics.median(r.get("used", 0.0) for r in runs),
            "stops": ", ".join(f"{k} {v}" for k, v in sorted(stops.items())),
        }
    return out


if __name__ == "__main__":
    main()
