"""The first measurement of a user's script: what bounds its step, in the record the built-in
limit probe makes (``autotune.rank.limit_probe``), so that the screening order, the "Not
screened" lines and the advice come from the same model (``autotune.limit.evidence``).

Right after the baseline trial, ``first_measurement`` runs the defaults once more with
``core.step_report.PROBE_ENV`` set, on the same nodes and measured the same way
(``script.nodes.run_on_nodes``) but for the fewest windows: ``Profile.wrap`` then times each
step's forward pass, its backward up to DDP's last bucket, the all-reduce still running after
that (exposed), and the optimizer, and counts the gradient bytes and buckets DDP itself made
(``core.step_report``).
Then autotune's own ranks, one per rank of the script in the same bundles, all-reduce a few
message sizes (``autotune.rank.link.sweep``) for the link's alpha-beta fit. The record:

* ``ddp``: per optimizer step, the step (from the measured windows), forward, backward with
  its exposed all-reduce, the optimizer, and data: the rest of the step (loading, and what
  else the script does between steps);
* ``compute``: the backward alone, and the step without its exposed all-reduce;
* ``comm``: the fit's points (``fit_bytes``, ``fit_s``), the gradients' bytes and buckets,
  and from the fit the all-reduce of every bucket back to back (``comm_s``) and of the last
  one (``last_bucket_s``).

A script that does not call ``wrap``, or wraps with a comm hook of its own, gives no
all-reduce figures: the measurement fails in one line saying why, and the screening goes in
the priors' listed order (``search.first_look``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from autotune.core.config import MeasureSettings, TrialConfig
from autotune.core.errors import FailureReason, TrialFailed
from autotune.core.results import TrialResult
from autotune.launch.failures import first_line
from autotune.launch.launcher import TrialRunner
from autotune.rank.link import sweep
from autotune.script.nodes import Files, rendezvous, run_on_nodes

__all__ = ["FIT_BYTES", "first_measurement", "record_of"]

#: Message sizes of the link's fit (bytes): latency-sized, middling, bucket-sized, and the
#: gradients' own bytes where smaller than ``FIT_MAX_BYTES`` (capped: a slow link takes seconds
#: per gigabyte).
FIT_BYTES = (1 << 10, 1 << 17, 1 << 22)
FIT_MAX_BYTES = 1 << 25
#: All-reduces of each size, after one unmeasured.
FIT_REPEATS = 3
#: How long the other ranks' sweeps get to end after rank 0's has answered.
SWEEP_END_S = 10.0


def first_measurement(
    runner: TrialRunner,
    *,
    command: tuple[str, ...],
    files: Files,
    config: TrialConfig,
    measure: MeasureSettings,
    timeout_s: float,
    log_dir: str | None = None,
) -> TrialResult:
    """The defaults' run with its step timed, and the link fitted (module doc): the result of
    the run, its rank's ``limit`` the record. Raises ``TrialFailed``."""
    short = replace(measure, max_windows=measure.min_windows)  # medians of a few steps
    result = run_on_nodes(
        runner,
        command=command,
        files=files,
        config=config,
        measure=short,
        timeout_s=timeout_s,
        log_dir=log_dir,
        probe=True,
    )
    rank = result.ranks[0]
    got = (rank.limit or {}).get("phases") or {}
    if "f" not in got:
        raise TrialFailed(
            FailureReason.CRASH,
            "the script's steps were not timed: wrap the model with autotune.Profile.load()"
            ".wrap(model) (its forward, backward and all-reduce are timed there)",
        )
    if "g" not in got:
        raise TrialFailed(
            FailureReason.CRASH,
            "the script's all-reduce was not timed: the wrapped model has a comm hook of its "
            "own, or DDP made no bucket",
        )
    sizes = sorted({*FIT_BYTES, int(min(got["g"], FIT_MAX_BYTES))})
    points = link_sweep(runner, sizes)
    rank.limit = record_of(got, points, result, config, runner.world_size)
    return result


def link_sweep(runner: TrialRunner, sizes: list[int]) -> list[tuple[int, float]]:
    """One all-reduce of each of ``sizes`` by autotune's own ranks, one per rank of the script
    in the same bundles (``rank.link.sweep``)."""
    import ray

    addr, port = rendezvous(runner)
    k = runner.ranks_per_bundle
    tasks = [
        runner.start_task(
            sweep,
            r // k,
            per_rank=True,
            rank=r,
            world_size=runner.world_size,
            addr=addr,
            port=port,
            backend=runner.backend,
            sizes=sizes,
            repeats=FIT_REPEATS,
        )
        for r in range(runner.world_size)
    ]
    try:
        return ray.get(tasks[0], timeout=120 + 30 * len(sizes))
    except ray.exceptions.RayError as e:
        why = first_line(str(e))
        raise TrialFailed(FailureReason.CRASH, f"the link's all-reduces failed: {why}") from None
    finally:  # every rank does the same all-reduces: the others end with rank 0
        runner.end_tasks(tasks, grace_s=SWEEP_END_S)


def record_of(
    got: dict[str, float],
    points: list[tuple[int, float]],
    result: TrialResult,
    config: TrialConfig,
    world_size: int,
) -> dict[str, Any]:
    """The limit probe's record from a script's timed phases (``got``: medians per step of
    ``core.step_report``'s kinds) and the link's points (module doc)."""
    from autotune.limit.evidence import fit_alpha_beta

    a = max(config.accumulation_steps, 1)
    step = config.global_batch / result.throughput  # seconds per optimizer step
    forward, backward = got["f"] * a, got.get("b", 0.0) * a
    exposed, optimizer = got.get("x", 0.0), got.get("o", 0.0)
    timed = forward + backward + exposed + optimizer
    if not timed < step:  # the script's own figures: a step they do not fit is no breakdown
        raise TrialFailed(
            FailureReason.CRASH,
            f"the script's timed phases ({timed:.4g} s) do not fit in its measured step "
            f"({step:.4g} s): not a breakdown of it",
        )
    data = step - timed
    fit_bytes = [b for b, _ in points]
    fit_s = [s for _, s in points]
    alpha, per_byte = fit_alpha_beta(fit_bytes, fit_s) or (0.0, 0.0)
    grad_bytes, buckets = got["g"], max(int(got.get("k", 1)), 1)
    return {
        "source": "script",
        "world_size": world_size,
        "samples_per_step": config.global_batch,
        "accumulation_steps": a,
        "ddp": {
            "step": step,
            "data": data,
            "forward": forward,
            "backward": backward + exposed,
            "optimizer": optimizer,
        },
        "compute": {"step": step - exposed, "backward": backward},
        "comm": {
            "comm_s": buckets * alpha + grad_bytes * per_byte,
            "last_bucket_s": alpha + got.get("z", 0.0) * per_byte,
            "wire_bytes": grad_bytes,
            "buckets": buckets,
            "fit_bytes": fit_bytes,
            "fit_s": fit_s,
        },
    }
