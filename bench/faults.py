"""Inject each trial fault into a real 2-rank gloo trial and report how it ended.

    PYTHONPATH=tests python bench/faults.py

For every fault: the reason the trial was recorded with, seconds from launch to that verdict,
and how many of the trial's processes (ranks and DataLoader workers) were still alive 10 s
later. The README's fault table comes from this script.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import ray

from autotune.core.config import MeasureSettings, TrialConfig
from autotune.core.errors import TrialFailed
from autotune.core.target import Target
from autotune.definition.space import SearchSpace
from autotune.launch.launcher import TrialRunner

TARGET = Target(
    backend="gloo", device="cpu", world_size=2, global_batch=32, cpus_per_rank=1, bf16=True
)
HANG_TIMEOUT_S = 10.0

FAULTS = [  # (name, trainer, options, extra config, runner kwargs)
    (
        "rank stuck in a collective",
        "hanging",
        {},
        {"num_workers": 1, "prefetch_factor": 2},
        {"timeout_s": HANG_TIMEOUT_S},
    ),
    ("rank raises", "raising_with_pids", {}, {}, {}),
    ("NaN loss", "nan_loss", {}, {}, {}),
    (
        "host memory over --max-memory 1GiB",
        "memory_hog",
        {"mib": 1536},
        {},
        {"max_memory_mb": 1024},
    ),
    ("CUDA out of memory (simulated)", "cuda_oom", {}, {}, {}),
]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def main() -> None:
    env = {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}  # ranks import the test trainers
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="ERROR",
        runtime_env={"env_vars": env},
    )
    runner = TrialRunner(world_size=2, backend="gloo")
    space = SearchSpace.load("default").resolve(TARGET)
    print("| fault | recorded as | seconds to verdict | processes alive 10 s later |")
    print("| --- | --- | --- | --- |")
    try:
        for name, trainer, options, changes, kwargs in FAULTS:
            pid_dir = tempfile.mkdtemp()
            config = TrialConfig.from_values({**space.defaults(), **changes}, TARGET)
            kwargs = {"timeout_s": 120.0, **kwargs}
            options = {**options, "pid_dir": pid_dir}
            started = time.monotonic()
            try:
                runner.run(
                    trial=0,
                    trainer=f"autotune_test_trainers:{trainer}",
                    trainer_options=options,
                    config=config,
                    measure=MeasureSettings(min_warmup_steps=2, window_s=0.3),
                    seed=0,
                    **kwargs,
                )
                verdict = "COMPLETE (fault not detected)"
            except TrialFailed as e:
                verdict = f"FAIL `{e.reason}`"
            seconds = time.monotonic() - started
            time.sleep(10)
            pids = [int(p.name) for p in Path(pid_dir).iterdir()]
            left = sum(alive(p) for p in pids)
            extra = f" (trial timeout {HANG_TIMEOUT_S:.0f} s)" if trainer == "hanging" else ""
            tracked = f"{left} of {len(pids)}"
            print(f"| {name} | {verdict} | {seconds:.1f}{extra} | {tracked} |")
    finally:
        runner.close()
        ray.shutdown()


if __name__ == "__main__":
    main()
