"""Per-trial overhead of the default CPU workload: the warm pool against fresh processes.

Run from the repository root:  python bench/pool_overhead.py [TRIALS]
"""

import statistics
import sys
import time

import ray

from autotune.core.config import MeasureSettings, TrialConfig
from autotune.core.target import Target
from autotune.definition.space import SearchSpace
from autotune.launch.launcher import TrialRunner

TRAINER, OPTIONS = "mlp", {"width": 2048, "layers": 4, "global_batch": 128}
TARGET = Target(
    backend="gloo", device="cpu", world_size=2, global_batch=128, cpus_per_rank=1, bf16=True
)
SPACE = SearchSpace.load("default").resolve(TARGET)
VARIANTS = [  # ddp/data settings vary, the env (OMP_NUM_THREADS=1) does not
    {},
    {"bucket_cap_mb": 5.0},
    {"gradient_as_bucket_view": True},
    {"micro_batch": 32},
    {"bucket_cap_mb": 100.0},
    {"static_graph": True},
    {"num_workers": 1},
    {"bucket_cap_mb": 50.0},
]
N = int(sys.argv[1]) if len(sys.argv) > 1 else len(VARIANTS)


def configs():
    for i in range(N):
        values = {**SPACE.defaults(), **VARIANTS[i % len(VARIANTS)]}
        assert SPACE.illegal(values) is None, values
        yield TrialConfig.from_values(values, TARGET)


def measure(reuse: bool) -> list[dict]:
    runner = TrialRunner(world_size=2, backend="gloo", reuse=reuse)
    rows = []
    try:
        envs = set()
        for i, cfg in enumerate(configs()):
            envs.add(tuple(sorted(cfg.env.items())))
            res = runner.run(
                trial=i,
                trainer=TRAINER,
                trainer_options=OPTIONS,
                config=cfg,
                measure=MeasureSettings(),
                seed=0,
                timeout_s=300,
            )
            r = max(res.ranks, key=lambda r: r.setup_s)  # the slower rank's breakdown
            row = {
                "wall": res.wall_s,
                "window": res.window_s,
                "overhead": res.overhead_s,
                "init": r.setup_s - r.warmup_s,
                "warmup": r.warmup_s,
                "warmup_steps": r.warmup_steps,
                "gaps": r.measure_s - r.window_s,
                "outside": res.wall_s - r.setup_s - r.measure_s,
                "reused": all(x.reused for x in res.ranks),
                "tput": res.throughput,
                "windows": len(res.windows),
            }
            rows.append(row)
            print(
                f"  {'pool ' if reuse else 'fresh'} trial {i}: "
                + " ".join(
                    f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                ),
                flush=True,
            )
        assert len(envs) == 1
    finally:
        runner.close()
    return rows


def summary(rows):
    med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
    share = sum(r["window"] for r in rows) / sum(r["wall"] for r in rows)
    return {
        "overhead_median_s": med("overhead"),
        "window_share": share,
        "init_median_s": med("init"),
        "warmup_median_s": med("warmup"),
        "warmup_steps_median": med("warmup_steps"),
        "gaps_median_s": med("gaps"),
        "outside_rank_median_s": med("outside"),
        "throughput_median": med("tput"),
    }


if __name__ == "__main__":
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    t = time.monotonic()
    pool = measure(reuse=True)
    fresh = measure(reuse=False)
    a, b = summary(pool), summary(fresh)
    print(f"\n{N} trials each, {time.monotonic() - t:.0f}s in all")
    print(f"{'':24}{'pool':>10}{'fresh':>10}")
    for k in a:
        print(f"{k:24}{a[k]:10.3f}{b[k]:10.3f}")
    ray.shutdown()
