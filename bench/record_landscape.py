"""Record a throughput landscape once, for the replay benchmark (``bench/replay.py``).

    python bench/record_landscape.py                       # the default workload, ~25 minutes
    python bench/record_landscape.py --rounds 3 --out bench/landscapes/mine.json

Every point of a grid (``--grid``: a search-space YAML whose dimensions are all categorical;
``bench/landscape_default.yaml``) is measured ``--rounds`` times, interleaved (every point once
per round, in a shuffled order that differs per round), by one runner with the warm process pool
autotune's search uses. Each run measures exactly ``--windows`` timed windows (no early stop, no
pruning), so the replay can apply the stop and prune rules window by window. Recorded per run:
the windows (samples/s), the seconds outside them (overhead: process group, model, warm-up) and
inside them, the warm-up steps, the round and the run's start time.

Before the grid, the cold-baseline experiment (issue: the first baseline of a run reads low):
the defaults measured (a) in fresh rank processes right after Ray started, (b) again twice in
the same, now warm, processes, then (c) in a new pool of fresh processes after one discarded
run of the defaults, (d) the same in yet another fresh pool without the discarded run. Each
with the full ``--windows``.

After it, the **first measurement**: the limit probe of the defaults, as ``autotune run``
takes it right after its baseline trial (``autotune.limit.probe.probe_one``; phases, the all-reduce
alone and the alpha-beta sweep), stored as ``first_measurement`` with its wall seconds; the
replay orders its screening from it. ``--probe-only`` adds just that to an existing landscape
(``--out``), measured on the same setup now (on other hardware than the grid's it says so, and
the landscape keeps the grid's ``hardware``; the first measurement records its own):

    autotune lab up --nodes 2 --rate 1gbit --cpus-per-node 1
    autotune lab exec -- python bench/record_landscape.py --study lab --probe-only \
        --address auto --out bench/landscapes/lab-1gbit.json

The file is small JSON (a few hundred kB): it is shipped under ``bench/landscapes/``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.core.config import TrialConfig
from autotune.core.errors import TrialFailed
from autotune.core.target import Target
from autotune.definition.space import SearchSpace
from autotune.definition.studydef import StudyDefinition
from autotune.launch.cluster import connect
from autotune.launch.launcher import TrialRunner
from autotune.limit.probe import probe_one
from autotune.rank.workload import load_workload
from autotune.replay.simulate import point_key
from autotune.search.first_look import probe_steps

HERE = Path(__file__).resolve().parent


def args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--study", default="default", help="study definition (name or path)")
    p.add_argument("--grid", default=str(HERE / "landscape_default.yaml"))
    p.add_argument("--rounds", type=int, default=2, help="runs of every grid point")
    p.add_argument("--windows", type=int, default=4, help="timed windows per run")
    p.add_argument("--seed", type=int, default=0, help="order of the points in each round")
    p.add_argument("--out", default=str(HERE / "landscapes" / "default-loopback.json"))
    p.add_argument("--address", help="an existing Ray cluster (auto or HOST:PORT)")
    p.add_argument(
        "--probe-only",
        action="store_true",
        help="add only the first measurement (the defaults' limit probe) to the landscape --out",
    )
    return p


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    names = sorted(grid)
    return [
        dict(zip(names, combo, strict=True))
        for combo in itertools.product(*(grid[n] for n in names))
    ]


def _median(run: dict[str, Any]) -> float | None:
    """A ``measure`` record's median window (samples/s); None when the run failed."""
    windows = run.get("windows")
    return statistics.median(windows) if windows else None


def main() -> None:
    a = args_parser().parse_args()
    d = StudyDefinition.load(a.study)
    workload = load_workload(d.trainer, d.trainer_options)
    space = SearchSpace.load(a.grid)
    exact = replace(
        d.measure, min_windows=a.windows, max_windows=a.windows, target_rel_half_width=1e-9
    )
    conn = connect(a.address, trainer_dir=os.getcwd())
    started = time.monotonic()
    out: dict[str, Any] = {"study": d.name, "trainer": d.trainer, "windows": a.windows}
    path = Path(a.out)
    if a.probe_only:
        out = json.loads(path.read_text())
    path.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        path.write_text(json.dumps(out, indent=None, separators=(",", ":")) + "\n")

    def runner() -> TrialRunner:
        # the study's placement: the lab study spreads its ranks one per node
        return TrialRunner(world_size=d.world_size or 2, backend="gloo", strategy=d.placement)

    def measure(r: TrialRunner, config: TrialConfig, n: int) -> dict[str, Any]:
        t = time.monotonic() - started
        try:
            res = r.run(
                trial=n,
                trainer=d.trainer,
                trainer_options=dict(d.trainer_options),
                config=config,
                measure=exact,
                seed=d.seed or 0,
                timeout_s=600,
            )
        except TrialFailed as e:
            return {"t": round(t, 1), "failed": f"{e.reason}: {e.detail}"}
        return {
            "t": round(t, 1),
            "windows": [round(w, 2) for w in res.windows],
            "window_s": round(res.window_s, 3),
            "overhead_s": round(res.overhead_s, 3),
            "warmup_s": round(res.warmup_s, 3),
            "warmup_steps": max(x.warmup_steps for x in res.ranks),
            "reused": res.ranks[0].reused,
        }

    first = runner()
    try:
        hw = first.probe()
        target = Target(
            backend="gloo",
            device=hw["device"],
            world_size=d.world_size or 2,
            global_batch=workload.global_batch,
            cpus_per_rank=1,
            bf16=hw["bf16"],
            bf16_native=bool(hw.get("bf16_native")),
        )
        resolved = space.resolve(target)
        defaults = resolved.defaults()
        grid = resolved.grid()
        base_point = {k: defaults[k] for k in grid}
        base_cfg = TrialConfig.from_values(defaults, target)
        here = {
            k: hw.get(k) for k in ("device", "device_name", "cpus", "torch", "bf16", "bf16_native")
        }
        if a.probe_only and out.get("hardware", here) != here:
            # the grid's hardware stays the landscape's: it decides the replayed space
            print(f"probe-only on other hardware than the grid's: {here}", flush=True)
        else:
            out["hardware"] = here

        def first_measurement(r: TrialRunner, baseline: dict[str, Any]) -> dict[str, Any]:
            """The defaults' probe in ``r``'s warm processes, right after ``baseline`` (a
            ``measure`` of the defaults there)."""

            def run(trial: int, config: TrialConfig, limit: dict[str, Any]) -> Any:
                return r.run(
                    trial=trial,
                    trainer=d.trainer,
                    trainer_options=dict(d.trainer_options),
                    config=config,
                    measure=d.measure,
                    seed=d.seed or 0,
                    timeout_s=600,
                    limit=limit,
                )

            # as ``autotune run`` takes it (``search.first_look``): the steps its baseline's
            # step time gives, no trace (the run takes the defaults' trace after the search)
            rec = probe_one(
                run,
                0,
                base_cfg,
                device=hw["device"],
                steps=probe_steps(_median(baseline), target.global_batch),
            )
            rec["measured_at"] = time.strftime("%Y-%m-%d")
            rec["hardware"] = here
            print("first measurement", json.dumps(rec["bounds"]), rec["wall_s"], flush=True)
            return rec

        if a.probe_only:  # the pool warm, as after a run's baseline trial
            out["first_measurement"] = first_measurement(first, measure(first, base_cfg, 0))
            save()
            first.close()
            return
        out["grid"] = grid
        out["baseline_key"] = point_key(base_point)
        # the warm-up rule the runs were measured with (``replay.simulate.Landscape.load``)
        out["settle"] = "windows"
        # The cold-baseline experiment.
        cold: dict[str, list[dict[str, Any]]] = {}
        cold["fresh_after_ray_start"] = [measure(first, base_cfg, 0)]
        cold["warm_pool"] = [measure(first, base_cfg, 1), measure(first, base_cfg, 2)]
        first.close()
        second = runner()
        measure(second, base_cfg, 3)  # discarded
        cold["fresh_after_discarded_run"] = [measure(second, base_cfg, 4)]
        second.close()
        third = runner()
        cold["fresh_again"] = [measure(third, base_cfg, 5)]
        out["cold_baseline"] = cold
        print(json.dumps(cold), flush=True)
        out["first_measurement"] = first_measurement(third, cold["fresh_again"][0])
        save()
        # The grid, interleaved by round.
        points = grid_points(grid)
        runs: dict[str, list[dict[str, Any]]] = {point_key(p): [] for p in points}
        out["points"] = runs
        rng = random.Random(a.seed)
        n = 10
        for rnd in range(a.rounds):
            order = points[:]
            rng.shuffle(order)
            for p in order:
                values = {**defaults, **p}
                rec = measure(third, TrialConfig.from_values(values, target), n)
                rec["round"] = rnd
                runs[point_key(p)].append(rec)
                n += 1
                print(rnd, point_key(p), rec.get("windows") or rec.get("failed"), flush=True)
            save()
        out["wall_s"] = round(time.monotonic() - started, 1)
        save()
        third.close()
    finally:
        conn.close()


if __name__ == "__main__":
    main()
