"""The numerics guard: does a faster setting still compute the same training?

Reduced precision (bf16/fp16 autocast, TF32) and gradient compression (fp16/bf16 hooks,
PowerSGD) make steps faster by computing less exactly. Usually the loss barely moves; sometimes
it does (gradients that underflow fp16, inputs whose signal bf16 rounds away, a PowerSGD rank too
low to carry the gradient). A throughput tuner that does not look would hand over a profile
that trains a different model.

Every trial runs the same model initialisation (same seed) on the same data in the same order
(the workload's global batch is fixed, so optimizer step ``k`` sees the same samples in every
trial), and records the loss of its first ``CURVE_STEPS`` optimizer steps (warm-up included).
For a candidate that changes numerics, the drift is

    sum_k |loss_k - baseline_k| / sum_k |baseline_k|      over the steps both have,

the mean absolute difference of the two loss curves relative to the baseline's mean loss. fp32
settings that only reorder sums (bucket sizes, accumulation at the same global batch) differ
by far less than 0.1 % here; a setting is marked ``numerics_drift`` when its drift is over the
tolerance (``DEFAULT_TOLERANCE``, 5 %; ``drift_tolerance`` in a study definition), which keeps it
out of the best configurations unless the study allows drift (``--allow-drift``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["CURVE_STEPS", "DEFAULT_TOLERANCE", "MIN_STEPS", "changes_numerics", "drift"]

#: Optimizer steps whose loss every trial records, from the first.
CURVE_STEPS = 16
#: Fewer steps in common than this and no verdict is given.
MIN_STEPS = 8
#: Relative drift of the loss curve above which a trial is ``numerics_drift``.
DEFAULT_TOLERANCE = 0.05


def changes_numerics(config: Any) -> list[str]:
    """The settings of ``config`` (a TrialConfig) that change what is computed, as
    ``name=value`` strings; empty when the configuration computes what fp32 computes."""
    out = []
    if config.precision != "fp32":
        out.append(f"precision={config.precision}")
    hook = config.comm_hook.get("name", "none")
    if hook != "none":
        out.append(f"comm_hook={hook}")
    return out


def drift(curve: Sequence[float], baseline: Sequence[float]) -> tuple[float, int] | None:
    """Relative difference of ``curve`` from ``baseline`` over their common first steps, and how
    many steps that was; None when there are fewer than ``MIN_STEPS`` or the baseline's loss is
    zero. A non-finite loss in ``curve`` is infinite drift."""
    n = min(len(curve), len(baseline), CURVE_STEPS)
    if n < MIN_STEPS:
        return None
    c, b = list(curve[:n]), list(baseline[:n])
    scale = sum(abs(x) for x in b)
    if scale == 0:
        return None
    diff = sum(abs(x - y) for x, y in zip(c, b, strict=True))
    return (diff / scale if diff == diff else float("inf")), n
