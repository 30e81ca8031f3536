"""What glibc's allocator pin is worth to your own torchrun job (``autotune.core.allocator``).

    python bench/allocator.py --rounds 3 --steps 300

Runs the default study's MLP as a plain torchrun script (``bench/mlp_script.py``, 2 gloo
ranks, global batch 128) with the defaults' profile, ``--rounds`` times with glibc's
thresholds left dynamic and as many times pinned (``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` in the environment, as ``autotune launch`` sets them from a
profile), interleaved. Each run's steps are timed by the same hook a script-mode trial reads
(``AUTOTUNE_REPORT_DIR``); the table gives each run's median step (the first 20 steps and the
rest apart) and the ratio of the medians, dynamic over pinned. Written under ``--out``:
``raw.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
from pathlib import Path

from script_mode import refused

from autotune.core import allocator
from autotune.core.config import TrialConfig
from autotune.core.target import Target
from autotune.definition.space import SearchSpace
from autotune.profile.profile import Profile

SCRIPT = Path(__file__).resolve().parent / "mlp_script.py"
TARGET = Target(backend="gloo", device="cpu", world_size=2, global_batch=128, cpus_per_rank=1)


def defaults_profile(path: Path) -> Path:
    """The defaults as a profile, without the pin (each run adds it or not)."""
    config = TrialConfig.from_values(SearchSpace.load("default").resolve(TARGET).defaults(), TARGET)
    env = {k: v for k, v in config.env.items() if k not in allocator.ENV}
    return Profile.from_config(
        TrialConfig(**{**config.to_dict(), "env": env}),
        study={"name": "bench-allocator"},
        workload={"trainer": "script", "world_size": 2, "backend": "gloo", "global_batch": 128},
        hardware={"device": "cpu"},
        measured={"baseline_samples_per_s": 1.0, "best_samples_per_s": 1.0, "speedup": 1.0},
    ).save(path)


def one_run(torchrun: str, profile: Path, where: Path, steps: int, pinned: bool) -> list[float]:
    """Step times (s) of one run, from rank 0's stamps."""
    where.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in allocator.ENV}
    env.update(AUTOTUNE_PROFILE=str(profile), AUTOTUNE_REPORT_DIR=str(where), OMP_NUM_THREADS="1")
    if pinned:
        env.update(allocator.ENV)
    with open(where / "log", "wb") as log:
        subprocess.run(
            [torchrun, "--nproc-per-node", "2", str(SCRIPT), "--steps", str(steps)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=True,
            timeout=600,
        )
    lines = (where / "rank-0.steps").read_text().splitlines()
    stamps = [float(x.split()[1]) for x in lines if x.startswith("t ")]
    return [b - a for a, b in zip(stamps, stamps[1:], strict=False)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--out", default="bench/results/allocator")
    a = p.parse_args(argv)
    out, torchrun = Path(a.out), shutil.which("torchrun")
    if refused(out, torchrun):
        return 2
    profile = defaults_profile(out / "defaults.yaml")
    runs: dict[str, list[list[float]]] = {"dynamic": [], "pinned": []}
    for r in range(a.rounds):
        for mode in runs:
            steps = one_run(torchrun, profile, out / f"{mode}-{r}", a.steps, mode == "pinned")
            runs[mode].append(steps)
            first, rest = statistics.median(steps[:20]), statistics.median(steps[20:])
            print(
                f"round {r} {mode:8s} first 20 steps {first * 1e3:6.1f} ms, "
                f"the rest {rest * 1e3:6.1f} ms"
            )
    (out / "raw.json").write_text(json.dumps({"args": vars(a), "steps": runs}))
    med = {m: statistics.median(statistics.median(s) for s in runs[m]) for m in runs}
    pairs = [
        statistics.median(d) / statistics.median(q)
        for d, q in zip(runs["dynamic"], runs["pinned"], strict=True)
    ]
    print(
        f"median step: dynamic {med['dynamic'] * 1e3:.1f} ms, pinned {med['pinned'] * 1e3:.1f}"
        f" ms; dynamic / pinned {med['dynamic'] / med['pinned']:.2f}x "
        f"(rounds {min(pairs):.2f}-{max(pairs):.2f}x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
