"""Script mode beside built-in mode on the same model (issue 17's goals), in one invocation.

    python bench/script_mode.py --budget 10m --rounds 8      # the issue's setting
    python bench/script_mode.py --budget 4m --rounds 8       # docs/script-mode.md's figures

1. ``autotune run`` of the built-in ``default`` study (the MLP of ``trainers/mlp.py``), then
   script mode on the same model written as a plain torchrun script (``bench/mlp_script.py``),
   at the same budget, seed and measurement protocol; both on one local Ray instance.
2. The defaults and the two exported configurations, measured again side by side by the
   built-in trainer (``side_by_side.side_by_side``: interleaved short runs, one runner), so
   that the two profiles are compared on one harness: the goal is met when the ratio of the
   script's profile to the built-in one has an interval that holds 1 (within the noise).
3. Per run: trials, the median trial overhead (wall time outside timed windows; script trials
   start torchrun and Python afresh), budget efficiency (timed seconds / wall seconds), the
   exported speedup with its interval as each run measured it.

Written under ``--out``: ``raw.json`` and ``table.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from side_by_side import _fmt, _ratio, side_by_side, tuning_run

from autotune.core.config import TrialConfig
from autotune.core.target import Target
from autotune.definition.durations import parse_duration
from autotune.definition.studydef import StudyDefinition
from autotune.launch.cluster import connect

SCRIPT = Path(__file__).resolve().parent / "mlp_script.py"


def refused(out: Path, torchrun: str | None) -> bool:
    """Say why a run cannot start (``--out`` not empty, no torchrun on ``PATH``) and return
    True; otherwise create ``out`` and return False."""
    if out.exists() and any(out.iterdir()):
        print(f"error: --out {out}: not empty; pick a new folder or remove it", file=sys.stderr)
        return True
    if torchrun is None:
        print(
            "error: torchrun is not on PATH; activate the environment with torch", file=sys.stderr
        )
        return True
    out.mkdir(parents=True, exist_ok=True)
    return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", default="4m")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench/results/script-mode")
    p.add_argument("--analyse", metavar="RAW", help="the table again from a raw.json")
    a = p.parse_args(argv)
    if a.analyse:
        report(json.loads(Path(a.analyse).read_text()), Path(a.analyse).parent)
        return 0
    out, torchrun = Path(a.out), shutil.which("torchrun")
    if refused(out, torchrun):
        return 2
    d = replace(StudyDefinition.load("default"), seed=a.seed, budget_s=parse_duration(a.budget))
    command = (torchrun, "--nproc-per-node", "2", str(SCRIPT))
    raw: dict[str, Any] = {"args": vars(a), "runs": []}
    started = time.monotonic()
    conn = connect(None, trainer_dir=os.getcwd())
    try:
        raw["runs"].append(tuning_run(d, out, "builtin", None))
        raw["runs"].append(
            tuning_run(d, out, "script", None, command=command, global_batch=128, limit=False)
        )
        (out / "raw.json").write_text(json.dumps(raw, indent=1, default=str))
        t = raw["runs"][0]["target"]
        target = Target(**t, cpus_per_rank=1, bf16=t["device"] == "cpu")
        configs = {"defaults": TrialConfig.from_dict(raw["runs"][0]["defaults"])}
        for r in raw["runs"]:
            cfg = TrialConfig.from_dict(r["config"])
            same = next((k for k, c in configs.items() if c == cfg), None)
            raw.setdefault("measured_as", {})[r["name"]] = same or r["name"]
            if same is None:
                configs[r["name"]] = cfg
        raw["samples"], raw["failed"], raw["order"] = side_by_side(d, target, configs, a.rounds)
    finally:
        (out / "raw.json").write_text(json.dumps(raw, indent=1, default=str))
        conn.close()
    raw["wall_s"] = round(time.monotonic() - started)
    report(raw, out)
    return 0


def report(raw: dict[str, Any], out: Path) -> None:
    """``table.md`` from ``raw``: one row per run, and the two profiles' ratio re-measured."""
    s, as_ = raw["samples"], raw["measured_as"]
    rows = [
        "| run | trials | overhead (median) | efficiency | exported speedup (its own run) "
        "| re-measured vs defaults | changes |",
        "| --- | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for r in raw["runs"]:
        low, high = r["exported_interval"] or (None, None)
        vs = _ratio(s[as_[r["name"]]], s["defaults"])
        changed = {k: v for k, v in r["config"].items() if v != raw["runs"][0]["defaults"][k]}
        rows.append(
            f"| {r['name']} | {r['trials']} | {r['overhead_median_s']:.2f}s | "
            f"{r['efficiency']:.0%} | {r['exported_speedup']} [{low}, {high}] | {_fmt(vs)} | "
            f"{json.dumps(changed, sort_keys=True)} |"
        )
    ratio = _ratio(s[as_["script"]], s[as_["builtin"]])
    rows.append(f"\nscript profile / built-in profile, re-measured: {_fmt(ratio)}")
    met = ratio is not None and ratio.low <= 1.0 <= ratio.high
    rows.append(f"within the noise (interval holds 1): {met}; wall {raw.get('wall_s')} s")
    table = "\n".join(rows)
    (out / "table.md").write_text(table + "\n")
    (out / "raw.json").write_text(json.dumps(raw, indent=1, default=str))
    print(table)


if __name__ == "__main__":
    sys.exit(main())
