"""The replay benchmark's table: per strategy, the oracle shares of many replayed runs
(``autotune.replay.simulate``) and the paired comparison with a bar (random search) seed by seed."""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["TIE", "summarise"]

#: Two exported points within this fraction of each other's true throughput tie.
TIE = 0.01


def summarise(results: list[dict[str, Any]], bar: str = "random") -> dict[str, dict[str, Any]]:
    """Per strategy: oracle shares and the paired comparison with ``bar`` by seed."""
    by: dict[str, dict[int, dict[str, Any]]] = {}
    for r in results:
        by.setdefault(r["strategy"], {})[r["seed"]] = r
    out: dict[str, dict[str, Any]] = {}
    for name, runs in by.items():
        shares = sorted(r["share"] for r in runs.values())
        row: dict[str, Any] = {
            "seeds": len(shares),
            "median_share": round(statistics.median(shares), 4),
            "p10_share": round(shares[len(shares) // 10], 4),
            "at_98": round(sum(s >= 0.98 for s in shares) / len(shares), 3),
            "median_trials": statistics.median(r["trials"] for r in runs.values()),
        }
        if all("efficiency" in r for r in runs.values()):
            row["median_efficiency"] = round(
                statistics.median(r["efficiency"] for r in runs.values()), 3
            )
        if bar in by and name != bar:
            w = t = lo = 0
            for seed, r in runs.items():
                other = by[bar].get(seed)
                if other is None:
                    continue
                if abs(r["value"] - other["value"]) <= TIE * other["value"]:
                    t += 1
                elif r["value"] > other["value"]:
                    w += 1
                else:
                    lo += 1
            n = w + t + lo
            row.update(wins=w, ties=t, losses=lo, win_share=round(w / n, 3) if n else None)
            row["beats_or_ties"] = round((w + t) / n, 3) if n else None
        out[name] = row
    return out
