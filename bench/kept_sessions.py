"""Re-measurement runs on kept sessions against sessions built anew for every run, side by side.

The default CPU workload's defaults and two tuned configurations (one compiled) are measured
as the re-validation measures them (``MeasureSettings.rerun``, interleaved rounds, the warm
pool), in blocks of ``ROUNDS`` rounds that alternate the two ways (``rank.kept``): each way's
share of wall time inside timed windows, each arm's median throughput, and each tuned arm's
paired speedup over the defaults with its 95 % interval, so that both what kept sessions save
and whether they read the same are in one run.

Run from the repository root:  python bench/kept_sessions.py [BLOCKS] [ROUNDS]
"""

import statistics
import sys
import time

import ray
from pool_overhead import OPTIONS, SPACE, TARGET, TRAINER

from autotune.core.config import MeasureSettings, TrialConfig
from autotune.core.stats import speedup_ci
from autotune.launch.launcher import TrialRunner

ARMS = {
    "defaults": {},
    "bf16 + views + compile": {
        "precision": "bf16",
        "gradient_as_bucket_view": True,
        "compile": "default",
    },
    "bf16 + views": {"precision": "bf16", "gradient_as_bucket_view": True},
}
BLOCKS = int(sys.argv[1]) if len(sys.argv) > 1 else 4
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
WAYS = ("built anew", "kept")


def main() -> None:
    configs = {
        k: TrialConfig.from_values({**SPACE.defaults(), **v}, TARGET) for k, v in ARMS.items()
    }
    rerun = MeasureSettings().rerun()
    runner = TrialRunner(world_size=2, backend="gloo", reuse=True)
    runs = {w: {k: [] for k in ARMS} for w in WAYS}
    wall = dict.fromkeys(WAYS, 0.0)
    timed = dict.fromkeys(WAYS, 0.0)
    started = time.monotonic()
    try:
        for block in range(BLOCKS):
            for way in WAYS if block % 2 == 0 else WAYS[::-1]:
                before = {k: len(v) for k, v in runs[way].items()}
                for _ in range(ROUNDS):
                    for key, config in configs.items():
                        res = runner.run(
                            trial=block,
                            trainer=TRAINER,
                            trainer_options=OPTIONS,
                            config=config,
                            measure=rerun,
                            seed=0,
                            timeout_s=300,
                            keep=way == "kept",
                        )
                        runs[way][key].append(res.throughput)
                        wall[way] += res.wall_s
                        timed[way] += res.window_s
                block_runs = {k: v[before[k] :] for k, v in runs[way].items()}
                ratios = "  ".join(
                    f"{k} {speedup_ci(block_runs[k], block_runs['defaults']).median:.3f}x"
                    for k in ARMS
                    if k != "defaults"
                )
                print(
                    f"  block {block + 1}/{BLOCKS}, {way}: {ratios} "
                    f"({time.monotonic() - started:.0f} s)",
                    flush=True,
                )
    finally:
        runner.close()
    print(
        f"\n{BLOCKS} blocks of {ROUNDS} rounds each way, {time.monotonic() - started:.0f} s in all"
    )
    for way in WAYS:
        share = timed[way] / wall[way]
        print(f"{way}: {timed[way]:.0f} s of {wall[way]:.0f} s in timed windows ({share:.1%})")
        for key in ARMS:
            line = f"  {key:24} median {statistics.median(runs[way][key]):7.1f} samples/s"
            if key != "defaults":
                ci = speedup_ci(runs[way][key], runs[way]["defaults"])
                line += f"   {ci.median:.3f}x [{ci.low:.3f}, {ci.high:.3f}]"
            print(line)


if __name__ == "__main__":
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    try:
        main()
    finally:
        ray.shutdown()
