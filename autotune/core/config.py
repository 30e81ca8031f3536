"""One trial's configuration, in the sections the profile uses and the ranks apply.

``TrialConfig.from_values`` turns a full assignment of knob values (``ResolvedSpace.suggest``)
into the settings each rank applies where they act:

* ``env``: process environment (``NCCL_*``, ``OMP_NUM_THREADS``, and glibc's allocator pinned
  in every trial alike, ``autotune.core.allocator.ENV``), put in every rank's process when Ray
  starts it, before the process group exists;
* ``ddp``: ``DistributedDataParallel`` kwargs, plus ``comm_hook`` registered after wrapping, and
  ``compile`` (a ``torch.compile`` mode, only when not ``none``) applied before wrapping;
* ``data``: ``DataLoader`` kwargs;
* ``precision``: autocast dtype and GradScaler (or TF32 matmuls);
* ``batch``: micro-batch per rank and the accumulation steps that keep the global batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, ClassVar

from autotune.core import allocator
from autotune.core.compiling import NONE
from autotune.core.errors import ConfigError
from autotune.core.knobs import KNOBS, UNSET, defaults
from autotune.core.target import Target
from autotune.core.validate import FILE_FIX, check_config

__all__ = ["TrialConfig", "as_it_runs"]

#: How a study's configuration that fails the check is dealt with.
STUDY_FIX = "autotune never stores this: the study is not one to run; start a new study"
#: PowerSGD compresses from this iteration on; small so that warm-up covers the switch.
#: (torch's default of 1000 would make every short trial measure plain all-reduce.)
POWERSGD_START_ITER = 2


@dataclass(frozen=True, kw_only=True)
class TrialConfig:
    """Everything one trial sets, grouped by where it acts."""

    env: dict[str, str] = field(default_factory=dict)
    """Environment variables of every rank process."""
    ddp: dict[str, Any] = field(default_factory=dict)
    """DistributedDataParallel kwargs, and ``compile`` (``core.apply.wrap`` takes it out)."""
    comm_hook: dict[str, Any] = field(default_factory=lambda: {"name": "none"})
    """``{name: none|fp16|bf16|powersgd, ...}`` with PowerSGD's options."""
    data: dict[str, Any] = field(default_factory=dict)
    """DataLoader kwargs."""
    precision: str = "fp32"
    """fp32, tf32, bf16 or fp16."""
    micro_batch: int = 1
    """Samples per rank per forward/backward."""
    accumulation_steps: int = 1
    """Micro-steps per optimizer step (all-reduce only on the last)."""
    global_batch: int = 1
    """micro_batch x accumulation_steps x world size."""
    threads: int = 1
    """torch intra-op threads per rank."""

    @classmethod
    def defaults(cls, target: Target) -> TrialConfig:
        """Every knob at its default on ``target``: the baseline's configuration."""
        return cls.from_values(defaults(target), target)

    @classmethod
    def from_values(cls, values: Mapping[str, Any], target: Target) -> TrialConfig:
        """Every knob's value (defaults included) -> the configuration of one trial."""
        env = {
            name: str(values[name])
            for name, k in KNOBS.items()
            if k.section == "nccl" and values[name] != UNSET
        }
        env["OMP_NUM_THREADS"] = str(values["threads"])
        env.update(allocator.ENV)  # not a knob: how every trial runs, so the profile keeps it
        hook: dict[str, Any] = {"name": values["comm_hook"]}
        if hook["name"] == "powersgd":
            hook["matrix_approximation_rank"] = values["powersgd_rank"]
            hook["start_powerSGD_iter"] = POWERSGD_START_ITER
        data: dict[str, Any] = {
            "num_workers": values["num_workers"],
            "pin_memory": values["pin_memory"],
        }
        if values["num_workers"] > 0:
            data["prefetch_factor"] = values["prefetch_factor"]
            data["persistent_workers"] = values["persistent_workers"]
        ddp: dict[str, Any] = {
            "bucket_cap_mb": float(values["bucket_cap_mb"]),
            "gradient_as_bucket_view": values["gradient_as_bucket_view"],
            "static_graph": values["static_graph"],
        }
        if values.get("compile", NONE) != NONE:  # not a DDP kwarg: core.apply.wrap takes it out
            ddp["compile"] = values["compile"]
        micro = values["micro_batch"]
        # --free-batch: the micro-batch is the per-rank batch (the global batch follows it)
        per_rank = micro if target.free_batch else target.per_rank_batch
        return cls(
            env=env,
            ddp=ddp,
            comm_hook=hook,
            data=data,
            precision=values["precision"],
            micro_batch=micro,
            accumulation_steps=per_rank // micro,
            global_batch=micro * (per_rank // micro) * target.world_size,
            threads=values["threads"],
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], *, where: str = "configuration", fix: str = STUDY_FIX
    ) -> TrialConfig:
        """The configuration a trial stored (``to_dict``), checked (``check``): a mapping with
        other keys or a value out of its bounds (a study from someone else's database) is a
        ConfigError naming ``where`` and ending with ``fix``."""
        names = {f.name for f in fields(cls)}
        if not isinstance(data, Mapping) or set(data) != names:
            got = sorted(map(str, data))[:12] if isinstance(data, Mapping) else type(data).__name__
            raise ConfigError(
                f"{where}: not an autotune trial configuration (expected keys "
                f"{', '.join(sorted(names))}; got {got})"
            )
        config = cls(**dict(data))
        config.check(where=where, fix=fix)
        return config

    def check(self, *, where: str = "configuration", fix: str | None = None) -> None:
        """Every value known, of its type and inside its bounds (``autotune.core.validate``:
        the one check of whatever will run); a ``ConfigError`` naming ``where`` and the key."""
        check_config(self, where=where, fix=fix or FILE_FIX)


def as_it_runs(
    config: TrialConfig, environ: Mapping[str, str], ranks_per_node: int | None
) -> TrialConfig:
    """``config`` (the defaults) as the user's own job runs it today, without anything autotune
    adds: no allocator pin (``allocator.ENV`` left out: glibc keeps its dynamic thresholds),
    and the threads torchrun gives each rank: the user's ``OMP_NUM_THREADS`` from ``environ``
    when it is a legal value, else 1 when several ranks share a node (torchrun sets it then),
    else the defaults' (every CPU of the rank). Re-validation measures it against the pinned
    defaults and the winner (``search.validation``)."""
    env = {k: v for k, v in config.env.items() if k not in allocator.ENV}
    threads = config.threads
    own = environ.get("OMP_NUM_THREADS", "").strip()
    if own.isdigit() and KNOBS["threads"].legal(int(own)) is None:
        threads = int(own)
    elif ranks_per_node is None or ranks_per_node > 1:
        threads = 1
    env["OMP_NUM_THREADS"] = str(threads)
    return replace(config, env=env, threads=threads)


#: How far off a warming-up window's size its steps must run before the next window is sized
#: again (``MeasureSettings.resized``): a fraction of the size.
RESIZE_OFF = 0.25


@dataclass(frozen=True, kw_only=True)
class MeasureSettings:
    """How a trial measures throughput (the rules are in ``autotune.core.stats``).

    Warm-up is ``min_warmup_steps`` steps and whatever first windows still run slower than
    the ones after them (``stats.SettleRule.kept_from``); then timed windows of about
    ``window_s`` each until the 95 % interval of their median is within
    ``target_rel_half_width`` of it, or ``max_windows``. From ``prune_after`` windows on, a
    trial whose interval lies wholly below the incumbent's is stopped (PRUNED), and so is one
    whose windows run ``hopeless_factor`` times below it, settled or not.
    """

    min_warmup_steps: int = 2
    """Optimizer steps always discarded before timing starts (at least one is run: its time
    sizes the windows)."""
    settle_window: int = 1
    """Windows after the first ones that settle them: a leading window is warm-up while its
    throughput is more than ``settle_tol`` below the median of this many windows after it."""
    settle_tol: float = 0.05
    """How far below the windows after it a leading window may run and still be kept."""
    max_warmup_steps: int = 100
    """Steps discarded at most, warm-up windows included: the window after them is kept
    whatever follows."""
    window_s: float = 1.0
    """Target length of one timed window, in seconds."""
    min_steps: int = 2
    """Fewest optimizer steps per window."""
    max_steps: int = 100_000
    """Most optimizer steps per window."""
    min_windows: int = 3
    """Fewest windows before the trial may stop (the interval needs them)."""
    max_windows: int = 10
    """The cap: stop here even if the interval is still wide."""
    target_rel_half_width: float = 0.03
    """Stop once the interval's half-width is at most this fraction of the median."""
    prune_after: int = 2
    """Windows measured before a trial may be pruned."""
    hopeless_factor: float = 4.0
    """A trial whose windows run this many times below the incumbent is pruned from
    ``prune_after`` windows on, settled or not (a bf16 step emulated on a CPU ran 20x below
    fp32's)."""
    rerun_windows: int = 3
    """Windows of each re-measurement run (re-validation, ablation): a fixed number, no stop
    or prune rule."""

    FLOORS: ClassVar[tuple[tuple[str, int | str], ...]] = (
        ("settle_window", 1),
        ("max_warmup_steps", "min_warmup_steps"),
        ("min_steps", 1),
        ("max_steps", "min_steps"),
        ("min_windows", 1),
        ("max_windows", "min_windows"),
        ("prune_after", 2),
        ("rerun_windows", 2),
    )
    """Each field's least value beyond >= 0, a number or the field it may not go below: the
    rules of ``autotune.core.stats`` (a study asks more: two windows for an interval)."""

    def __post_init__(self) -> None:
        """Each field within its rule; messages start with the field's name (a study definition
        prefixes ``measure.``), state the rule and the value seen."""
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(f.default, float):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                    raise ConfigError(f"{f.name} must be a positive number, got {v!r}")
            elif isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{f.name} must be a whole number >= 0, got {v!r}")
        for name, low in self.FLOORS:
            floor = low if isinstance(low, int) else getattr(self, low)
            v = getattr(self, name)
            if v < floor:
                of = f"{floor}" if isinstance(low, int) else f"{low} ({floor})"
                raise ConfigError(f"{name} must be a whole number >= {of}, got {v}")
        if not self.hopeless_factor > 1:
            raise ConfigError(
                f"hopeless_factor must be a number > 1 (times below the incumbent), "
                f"got {self.hopeless_factor!r}"
            )

    def settle_rule(self) -> Any:
        from autotune.core.stats import SettleRule

        return SettleRule(
            window=self.settle_window,
            rel_tol=self.settle_tol,
            min_steps=self.min_warmup_steps,
            max_steps=self.max_warmup_steps,
        )

    def rerun(self) -> MeasureSettings:
        """The settings of a re-measurement run (re-validation, ablation): ``rerun_windows``
        windows after the same warm-up. The noise of such a comparison is between runs, so
        short runs in more rounds say more than long runs in few."""
        return replace(self, min_windows=self.rerun_windows, max_windows=self.rerun_windows)

    @property
    def discarded_steps(self) -> int:
        """Steps a measurement discards before its first window: ``min_warmup_steps``, at
        least one (its time sizes the first window)."""
        return max(self.min_warmup_steps, 1)

    def judge(
        self, windows: Sequence[float], sizes: Sequence[int], incumbent: Any
    ) -> tuple[int | None, str]:
        """What a measurement's windows so far decide (``windows``: samples/s, ``sizes``:
        their steps; ``incumbent``: an ``stats.Interval`` or None): the first window kept
        (``SettleRule.kept_from``; None while the windows are still warming up), and why the
        measurement stops - ``hopeless``, ``pruned``, ``converged`` or ``cap`` - or "" while
        it goes on. Built-in ranks and script mode both decide by it."""
        kept = self.settle_rule().kept_from(windows, sizes)
        counted = windows if kept is None else windows[kept:]
        prune_rule = self.prune_rule()
        if prune_rule.hopeless(counted, incumbent) is not None:
            return kept, "hopeless"
        if kept is None:
            return None, ""
        if prune_rule.should_prune(counted, incumbent):
            return kept, "pruned"
        done, why = self.stop_rule().decide(counted)
        return kept, why if done else ""

    def window_steps(self, step_s: float) -> int:
        """Steps in a window of about ``window_s`` at ``step_s`` seconds a step, within
        ``min_steps`` and ``max_steps``."""
        n = math.ceil(self.window_s / step_s) if step_s > 0 else self.min_steps
        return min(max(n, self.min_steps), self.max_steps)

    def resized(self, steps: int, seconds: float) -> int:
        """The next window's steps after a window of ``steps`` steps took ``seconds``, while
        the windows are still warming up: sized again where that one's steps ran more than a
        quarter off the size's, else the same (``stats.SettleRule.kept_from``)."""
        n = self.window_steps(seconds / steps)
        return n if abs(n - steps) > RESIZE_OFF * steps else steps

    def stop_rule(self) -> Any:
        from autotune.core.stats import StopRule

        return StopRule(
            rel_half_width=self.target_rel_half_width,
            min_windows=self.min_windows,
            max_windows=self.max_windows,
        )

    def prune_rule(self) -> Any:
        from autotune.core.stats import PruneRule

        return PruneRule(min_windows=self.prune_after, hopeless_factor=self.hopeless_factor)
