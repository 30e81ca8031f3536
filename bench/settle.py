"""How many warm-up steps a trial needs: every step's time recorded from the third step on, in
fresh and in pooled (reused) rank processes, and candidate settle rules judged on them.

    python bench/settle.py                         # 16 trials of the default workload, ~3 minutes
    python bench/settle.py --trials 24 --out bench/results/settle.json
    python bench/settle.py --analyse bench/results/settle.json

Each trial runs the default study's model with one optimizer step per timed window (so every
window is one step) for ``--steps`` steps after the two steps every rule discards; the
configurations cycle through the defaults and three DDP/DataLoader variants; every fourth
trial starts a new pool (fresh processes, as the first trial of ``autotune run``), the others
run in the warm pool as ``autotune run`` uses it.

A rule (``stats.SettleRule``: discard ``min_steps``, then two adjacent medians of ``window``
steps that agree within ``rel_tol``) cuts each recorded run at some step; its *bias* is the
median throughput of the ``--judge`` steps after its cut over the run's steady state (the median
of its last ``--judge`` steps). A rule is good when its bias is within the run-to-run noise
(about 1 % here) and it cuts early: every step it saves is saved in every trial.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

from autotune.core.config import MeasureSettings, TrialConfig
from autotune.core.stats import SettleRule
from autotune.core.target import Target
from autotune.definition.space import SearchSpace
from autotune.definition.studydef import StudyDefinition
from autotune.launch.cluster import connect
from autotune.launch.launcher import TrialRunner

VARIANTS: list[dict[str, Any]] = [
    {},
    {"static_graph": True},
    {"gradient_as_bucket_view": True, "bucket_cap_mb": 5.0},
    {"num_workers": 2, "persistent_workers": True},
]
#: (min_steps, window, rel_tol) of the step-level rule (``SettleRule.settled_at``, the rule
#: before this release; window 0: a fixed count of steps).
RULES = [(2, 2, 0.05), (2, 1, 0.05), (4, 0, 0.0), (2, 0, 0.0)]
#: (min_steps, window, rel_tol) of the rule a measurement warms up with now: ``min_steps``
#: steps, then windows of about ``WINDOW_S`` (``SettleRule.kept_from``).
WINDOW_RULES = [(2, 1, 0.05), (2, 2, 0.05)]
WINDOW_S = 1.0
SEEN_FROM = 2  # the steps before this are not recorded (the recording's own warm-up)
FRESH_EVERY = 4  # every 4th trial starts a new pool of rank processes


def args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--study", default="default")
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--steps", type=int, default=40, help="steps recorded per trial")
    p.add_argument("--judge", type=int, default=10, help="steps a rule's bias is judged on")
    p.add_argument("--out", help="write the recorded step times here (JSON)")
    p.add_argument("--analyse", help="judge the rules on a file written by --out")
    return p


def record(study: str, trials: int, steps: int) -> list[dict[str, Any]]:
    d = StudyDefinition.load(study)
    opts = dict(d.trainer_options)
    world = d.world_size or 2
    target = Target(
        backend="gloo",
        device="cpu",
        world_size=world,
        global_batch=int(opts.get("global_batch", 128)),
        cpus_per_rank=1,
        bf16=False,
    )
    space = SearchSpace.load(d.space).resolve(target)
    # one step per window, exactly ``steps`` windows, a warm-up of exactly SEEN_FROM steps
    each = MeasureSettings(
        min_warmup_steps=SEEN_FROM,
        settle_window=1,
        settle_tol=1e9,
        window_s=1e-6,
        min_steps=1,
        max_steps=1,
        min_windows=steps,
        max_windows=steps,
        target_rel_half_width=1e-9,
    )
    conn = connect(None)
    runner = None
    out = []
    try:
        for i in range(trials):
            if i % FRESH_EVERY == 0:  # a new pool: this trial's ranks are fresh processes
                if runner is not None:
                    runner.close()
                runner = TrialRunner(world_size=world, backend="gloo")
            values = {**space.defaults(), **VARIANTS[i % len(VARIANTS)]}
            cfg = TrialConfig.from_values(values, target)
            res = runner.run(
                trial=i,
                trainer=d.trainer,
                trainer_options=opts,
                config=cfg,
                measure=each,
                seed=0,
                timeout_s=300,
            )
            samples = cfg.global_batch
            row = {
                "variant": VARIANTS[i % len(VARIANTS)],
                "reused": all(r.reused for r in res.ranks),
                "step_s": [samples / w for w in res.windows],
                "setup_s": max(r.setup_s - r.warmup_s for r in res.ranks),
            }
            out.append(row)
            print(
                f"trial {i} reused={row['reused']} first steps "
                f"{[round(s, 3) for s in row['step_s'][:8]]}",
                flush=True,
            )
    finally:
        if runner is not None:
            runner.close()
        conn.close()
    return out


def _cut(t: list[float], rule: tuple[int, int, float], windowed: bool) -> int | None:
    """Where ``rule`` starts timing in the step times ``t`` (the first SEEN_FROM unread)."""
    min_steps, window, tol = rule
    if windowed:  # as a measurement's windows: sized from the step before, until one is kept
        rule_ = SettleRule(window=window, rel_tol=tol, min_steps=min_steps, max_steps=len(t))
        start, rates, sizes = min_steps, [], []
        k = max(2, math.ceil(WINDOW_S / t[max(min_steps - 1, SEEN_FROM)]))
        while start + k <= len(t):
            sizes.append(k)
            rates.append(k / sum(t[start : start + k]))
            start += k
            kept = rule_.kept_from(rates, sizes)
            if kept is not None:
                return min_steps + sum(sizes[:kept])
            k = max(2, math.ceil(WINDOW_S * rates[-1]))
        return None
    if window == 0:  # a fixed count, no settling
        return min_steps
    return SettleRule(window=window, rel_tol=tol, min_steps=min_steps, max_steps=len(t)).settled_at(
        t
    )


def judge(runs: list[dict[str, Any]], judge_n: int) -> list[dict[str, Any]]:
    """Each rule: its median cut (steps of warm-up, counting the unrecorded ones), the median
    and worst bias over the runs, fresh and pooled apart."""
    table = []
    rules = [(r, False) for r in RULES] + [(r, True) for r in WINDOW_RULES]
    for (min_steps, window, tol), windowed in rules:
        for reused in (False, True):
            cuts, biases = [], []
            for r in runs:
                if r["reused"] != reused:
                    continue
                t = [0.0] * SEEN_FROM + r["step_s"]  # the unrecorded steps: never read
                cut = _cut(t, (min_steps, window, tol), windowed)
                if cut is None or cut + judge_n > len(t) - judge_n:
                    continue
                after = statistics.median(t[cut : cut + judge_n])
                steady = statistics.median(t[-judge_n:])
                cuts.append(cut)
                biases.append(after / steady - 1)  # > 0: the judged steps are slower
            if not cuts:
                continue
            if windowed:
                name = f"min_steps={min_steps}, then windows settled over {window} window(s)"
            elif window:
                name = f"min_steps={min_steps} window={window} rel_tol={tol}"
            else:
                name = f"a fixed {min_steps} steps"
            table.append(
                {
                    "rule": name,
                    "processes": "pooled" if reused else "fresh",
                    "runs": len(cuts),
                    "median_cut": statistics.median(cuts),
                    "median_bias": round(statistics.median(biases), 4),
                    "worst_bias": round(max(biases, key=abs), 4),
                }
            )
    return table


def main() -> None:
    a = args_parser().parse_args()
    if a.analyse:
        runs = json.loads(Path(a.analyse).read_text())["runs"]
    else:
        started = time.monotonic()
        runs = record(a.study, a.trials, a.steps)
        print(f"recorded {len(runs)} trials in {time.monotonic() - started:.0f} s")
    table = judge(runs, a.judge)
    print("rule | processes | runs | median warm-up steps | median bias | worst bias")
    for row in table:
        print(
            f"{row['rule']} | {row['processes']} | {row['runs']} | {row['median_cut']} | "
            f"{row['median_bias']:+.1%} | {row['worst_bias']:+.1%}"
        )
    if a.out and not a.analyse:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps({"runs": runs, "table": table}, indent=1))


if __name__ == "__main__":
    main()
