"""Study definitions: which trainer, world size, backend, space, objective, budget.

A definition is a YAML file in ``studies/`` (picked by name: ``--study default``) or anywhere
(``--study path/to/mine.yaml``). Command-line flags override its fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from autotune import _yaml
from autotune.config import MeasureSettings
from autotune.durations import parse_duration, parse_size_mb
from autotune.errors import ConfigError
from autotune.numerics import DEFAULT_TOLERANCE

__all__ = ["SAMPLERS", "StudyDefinition", "available_studies"]

BUILTIN_PACKAGE = "autotune.studies"
SAMPLERS = ("tpe", "gp", "random", "cmaes", "grid")
BACKENDS = ("auto", "gloo", "nccl")
#: Ray placement-group strategies for one trial's ranks.
PLACEMENTS = ("pack", "spread", "strict_pack", "strict_spread")
OBJECTIVES = ("throughput", "throughput,memory")
_KEYS = (
    "description",
    "trainer",
    "trainer_options",
    "world_size",
    "backend",
    "space",
    "objective",
    "budget",
    "sampler",
    "seed",
    "trial_timeout",
    "measure",
    "max_memory",
    "validate_top",
    "validate_rounds",
    "allow_drift",
    "free_batch",
    "drift_tolerance",
    "placement",
    "concurrent_trials",
)
_MEASURE_KEYS = tuple(f.name for f in fields(MeasureSettings))
_MEASURE_FLOATS = ("settle_tol", "window_s", "target_rel_half_width")


@dataclass(frozen=True, kw_only=True)
class StudyDefinition:
    """A ready study: what to tune and how long."""

    name: str
    """The definition's name (its file's stem); the default study name builds on it."""
    description: str = ""
    """One line for ``autotune studies``."""
    trainer: str = "mlp"
    """Built-in trainer name or ``package.module:function``."""
    trainer_options: dict[str, Any] = field(default_factory=dict)
    """Keyword options passed to the trainer function."""
    world_size: int | None = None
    """DDP ranks per trial; None: one per GPU with nccl, 2 with gloo."""
    backend: str = "auto"
    """``gloo``, ``nccl``, or ``auto`` (nccl when the cluster has GPUs)."""
    space: str = "default"
    """Search space name or path."""
    objective: str = "throughput"
    """What the study maximises: samples/s over all ranks."""
    budget_s: float = 600.0
    """Wall-clock seconds one ``autotune run`` may launch trials for."""
    sampler: str = "tpe"
    """tpe, gp, random, cmaes or grid."""
    seed: int | None = None
    """Sampler and data seed."""
    trial_timeout_s: float | None = None
    """Seconds before a trial is killed; None: derived from the baseline."""
    measure: MeasureSettings = field(default_factory=MeasureSettings)
    """Warm-up and timed-window settings."""
    max_memory_mb: float | None = None
    """Peak host memory per rank; a trial over it fails with ``oom``."""
    validate_top: int = 3
    """How many of the best configurations are re-measured against the baseline, interleaved,
    before the profile is chosen (0: no re-validation)."""
    validate_rounds: int = 5
    """Interleaved rounds of that re-measurement (each measures every candidate once)."""
    free_batch: bool = False
    """Let the tuner change the global batch (the per-rank batch is a knob); training dynamics
    change with it, and the profile says so."""
    allow_drift: bool = False
    """Keep configurations whose loss drifts from the fp32 baseline's (``autotune.numerics``)."""
    drift_tolerance: float = DEFAULT_TOLERANCE
    """Relative drift of the first steps' loss above which a trial is ``numerics_drift``."""
    placement: str = "pack"
    """How one trial's ranks are placed on the Ray cluster's nodes (a Ray placement-group
    strategy): ``pack`` (as few nodes as possible), ``spread`` (as many as possible), or
    their ``strict_`` forms, which fail rather than fall back."""
    concurrent_trials: int | None = None
    """Trials measured at once, each in its own placement group; None: as many as the
    cluster holds with every rank owning its share of its node's CPUs (1 on one machine)."""

    @classmethod
    def load(cls, name_or_path: str) -> StudyDefinition:
        path = _find(name_or_path)
        data = _yaml.read_mapping(path, what="study definition")
        return cls.from_mapping(data, where=f"study definition {path}", name=path.stem)

    @classmethod
    def from_mapping(cls, data: dict[str, Any], *, where: str, name: str) -> StudyDefinition:
        _yaml.check_keys(data, where=where, allowed=_KEYS, required=("trainer",))
        measure = data.get("measure") or {}
        if not isinstance(measure, dict):
            raise ConfigError(f"{where}: measure must be a mapping")
        _yaml.check_keys(measure, where=f"{where}: measure", allowed=_MEASURE_KEYS)
        options = data.get("trainer_options") or {}
        if not isinstance(options, dict):
            raise ConfigError(f"{where}: trainer_options must be a mapping of keyword options")
        d = cls(
            name=name,
            description=str(data.get("description", "")),
            trainer=str(data["trainer"]),
            trainer_options=options,
            world_size=data.get("world_size"),
            backend=data.get("backend", "auto"),
            space=str(data.get("space", "default")),
            objective=_objective(data.get("objective", "throughput")),
            budget_s=parse_duration(data.get("budget", "10m"), what=f"{where}: budget"),
            sampler=data.get("sampler", "tpe"),
            seed=data.get("seed"),
            trial_timeout_s=(
                None
                if data.get("trial_timeout") is None
                else parse_duration(data["trial_timeout"], what=f"{where}: trial_timeout")
            ),
            measure=MeasureSettings(**measure),
            max_memory_mb=(
                None
                if data.get("max_memory") is None
                else parse_size_mb(data["max_memory"], what=f"{where}: max_memory")
            ),
            validate_top=data.get("validate_top", 3),
            validate_rounds=data.get("validate_rounds", 5),
            allow_drift=data.get("allow_drift", False),
            free_batch=data.get("free_batch", False),
            drift_tolerance=data.get("drift_tolerance", DEFAULT_TOLERANCE),
            placement=str(data.get("placement", "pack")).lower(),
            concurrent_trials=data.get("concurrent_trials"),
        )
        d.check(where)
        return d

    def check(self, where: str = "--study") -> None:
        """Every field within its rules; messages name the flag that fixes it."""
        ws = self.world_size
        if ws is not None and (isinstance(ws, bool) or not isinstance(ws, int) or ws < 1):
            raise ConfigError(f"{where}: world_size must be a positive integer, got {ws!r}")
        if self.backend not in BACKENDS:
            raise ConfigError(
                f"{where}: backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}"
            )
        if self.placement not in PLACEMENTS:
            raise ConfigError(
                f"{where}: placement must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}"
            )
        n = self.concurrent_trials
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ConfigError(f"{where}: concurrent_trials must be a whole number >= 1, got {n!r}")
        if self.objective == "throughput,memory" and self.sampler == "cmaes":
            raise ConfigError(
                "--sampler cmaes: Optuna's CMA-ES optimises one objective; use tpe, gp, random "
                "or grid with --objective throughput,memory"
            )
        if self.objective not in OBJECTIVES:
            raise ConfigError(
                f"{where}: objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}"
            )
        if self.sampler not in SAMPLERS:
            raise ConfigError(
                f"--sampler: unknown sampler {self.sampler!r}; choose one of {', '.join(SAMPLERS)}"
            )
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int)
        ):
            raise ConfigError(f"{where}: seed must be an integer, got {self.seed!r}")
        for key, low in (("validate_top", 0), ("validate_rounds", 2)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError(f"{where}: {key} must be a whole number >= {low}, got {v!r}")
        for key in ("allow_drift", "free_batch"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"{where}: {key} must be true or false")
        tol = self.drift_tolerance
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 < tol < 10:
            raise ConfigError(
                f"{where}: drift_tolerance must be a relative difference above 0 (0.05 = 5 %), "
                f"got {tol!r}"
            )
        m = self.measure
        for key in _MEASURE_KEYS:
            v = getattr(m, key)
            if key in _MEASURE_FLOATS:
                if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                    raise ConfigError(f"{where}: measure.{key} must be positive, got {v!r}")
            elif isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{where}: measure.{key} must be a whole number >= 0, got {v!r}")
        if m.min_steps < 1 or m.max_steps < m.min_steps:
            raise ConfigError(f"{where}: measure needs 1 <= min_steps <= max_steps")
        if m.min_windows < 2 or m.max_windows < m.min_windows:
            raise ConfigError(
                f"{where}: measure needs 2 <= min_windows <= max_windows (an interval needs "
                f"two windows)"
            )
        if m.settle_window < 1 or m.max_warmup_steps < m.min_warmup_steps:
            raise ConfigError(
                f"{where}: measure needs settle_window >= 1 and "
                f"min_warmup_steps <= max_warmup_steps"
            )
        if m.prune_after < 2:
            raise ConfigError(f"{where}: measure.prune_after must be at least 2 windows")

    @property
    def multi_objective(self) -> bool:
        """Throughput and peak memory: a Pareto front instead of one best."""
        return self.objective == "throughput,memory"

    def override(self, **changes: Any) -> StudyDefinition:
        """A copy with the given non-None fields replaced, checked again."""
        d = replace(self, **{k: v for k, v in changes.items() if v is not None})
        d.check()
        return d


def _objective(value: Any) -> Any:
    """``throughput, memory`` and ``[throughput, memory]`` are ``throughput,memory``."""
    if isinstance(value, (list, tuple)):
        value = ",".join(map(str, value))
    return value.replace(" ", "") if isinstance(value, str) else value


def available_studies() -> list[str]:
    return _yaml.builtin_names(BUILTIN_PACKAGE)


def _find(name_or_path: str) -> Path:
    return _yaml.find_builtin(
        BUILTIN_PACKAGE, name_or_path, flag="--study", kind="study definition"
    )
