"""Search spaces: YAML in Optuna's own distribution shape <-> Optuna distributions.

A space file groups knobs (see ``core.knobs``) by section; each knob is one distribution
(``definition.distributions``)::

    ddp:
      bucket_cap_mb: {type: float, low: 1, high: 400, log: true}
      comm_hook: {type: categorical, choices: [none, fp16, bf16, powersgd]}
    nccl:
      NCCL_ALGO: {type: categorical, choices: [default, Ring, Tree]}

``type`` is ``float``, ``int`` or ``categorical``; ``low``/``high`` are inclusive; ``step`` and
``log`` mean what they mean to Optuna, whose distribution classes check them.

A ``SearchSpace`` is what the file says. ``SearchSpace.resolve(target)`` turns it into the
``ResolvedSpace`` a study runs: knobs and choices that cannot act on the target's backend and
device are left out (with the reason), micro-batch choices become divisors of the per-rank
batch, and the baseline (every knob at its default) is checked to be a point of the space.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    IntDistribution,
)

from autotune.core import safe_yaml as _yaml
from autotune.core.errors import ConfigError
from autotune.core.knobs import KNOBS, SECTIONS, defaults, illegal_combination
from autotune.core.target import Target
from autotune.definition.distributions import (
    contains,
    distribution_from_yaml,
    distribution_to_yaml,
    values_of,
)

__all__ = [
    "Dropped",
    "ResolvedSpace",
    "SearchSpace",
    "available_spaces",
]

BUILTIN_PACKAGE = "autotune.search_spaces"
#: Points per continuous dimension when the grid sampler needs a finite grid.
GRID_POINTS = 5


@dataclass(frozen=True, slots=True)
class Dropped:
    """A knob, or one choice of it, left out of a study, and why."""

    name: str
    reason: str
    choice: Any = None
    whole: bool = True

    def __str__(self) -> str:
        what = self.name if self.whole else f"{self.name}={self.choice}"
        return f"{what}: {self.reason}"


@dataclass(frozen=True)
class SearchSpace:
    """A search space as written: knob name -> Optuna distribution, in suggestion order."""

    name: str
    distributions: Mapping[str, BaseDistribution]
    description: str = ""
    source: str = ""

    @classmethod
    def load(cls, name_or_path: str) -> SearchSpace:
        """A built-in space by name (``default``) or a YAML file by path."""
        path = _find(name_or_path)
        data = _yaml.read_mapping(path, what="search space")
        return cls.from_mapping(
            data, where=f"search space {path}", name=path.stem, source=str(path)
        )

    @classmethod
    def from_mapping(
        cls, data: Mapping[str, Any], *, where: str, name: str = "space", source: str = ""
    ) -> SearchSpace:
        _yaml.check_keys(data, where=where, allowed=("description", *SECTIONS))
        description = data.get("description", "")
        if not isinstance(description, str):
            raise ConfigError(f"{where}: description must be text")
        found: dict[str, BaseDistribution] = {}
        for section in SECTIONS:
            dims = data.get(section) or {}
            if not isinstance(dims, dict):
                raise ConfigError(f"{where}: section {section!r} must be a mapping of knobs")
            names = [k.name for k in KNOBS.values() if k.section == section]
            _yaml.check_keys(dims, where=f"{where}: section {section!r}", allowed=names)
            for key, spec in dims.items():
                found[key] = _checked_dimension(key, spec, where=f"{where}: {section}.{key}")
        if not found:
            raise ConfigError(f"{where}: no dimensions; add knobs under {', '.join(SECTIONS)}")
        ordered = {k: found[k] for k in KNOBS if k in found}
        return cls(name=name, distributions=ordered, description=description, source=source)

    def to_mapping(self) -> dict[str, Any]:
        out: dict[str, Any] = {"description": self.description} if self.description else {}
        for name, dist in self.distributions.items():
            out.setdefault(KNOBS[name].section, {})[name] = distribution_to_yaml(dist)
        return out

    def resolve(self, target: Target) -> ResolvedSpace:
        """The space a study on ``target`` runs (see the module docstring)."""
        kept: dict[str, BaseDistribution] = {}
        dropped: list[Dropped] = []
        for name, dist in self.distributions.items():
            knob = KNOBS[name]
            reason = knob.drop(target)
            if reason:
                dropped.append(Dropped(name, reason))
                continue
            dist, lost = _drop_choices(name, dist, target)
            dropped += lost
            default = knob.default_for(target)
            micro = name == "micro_batch" and isinstance(dist, CategoricalDistribution)
            if micro and not contains(dist, default):  # accumulation 1 is always a candidate
                dist = CategoricalDistribution(sorted([*dist.choices, default]))
            values = values_of(dist)
            if values is not None and len(values) == 1 and not lost and values[0] != default:
                raise ConfigError(  # the user's own one value: the default would never be left
                    f"search space {self.source or self.name}: {knob.section}.{name} has the "
                    f"one value {values[0]!r}, not the default {default!r}; add the default to "
                    f"its choices (the baseline trial is a point of the space)"
                )
            if values is not None and len(values) == 1:
                dropped.append(Dropped(name, f"only {values[0]!r} is possible here"))
                continue
            if not contains(dist, default):
                raise ConfigError(
                    f"search space {self.source or self.name}: {knob.section}.{name} must "
                    f"contain the default {default!r} (the baseline trial is a point of the "
                    f"space); widen it or add the choice"
                )
            kept[name] = dist
        if not kept:
            raise self._nothing_left(target, dropped)
        return ResolvedSpace(target=target, distributions=kept, dropped=dropped)

    def nothing_acts_on(self, backend: str) -> ConfigError | None:
        """Before anything starts: ``resolve``'s one-line error where nothing of this space can
        act on ``backend`` even on the most capable machine of it (every core, bf16 and TF32
        units, ``torch.compile``); None where something may (``resolve`` then decides against
        the machine the run gets). A space of NCCL variables alone on gloo was refused only
        after Ray had started."""
        device = "cuda" if backend == "nccl" else "cpu"
        best = Target(
            backend=backend,
            device=device,
            world_size=2,
            global_batch=1 << 20,
            cpus_per_rank=1 << 10,
            bf16=True,
            bf16_native=True,
            tf32=device == "cuda",
            compile_problem=None,
        )
        dropped: list[Dropped] = []
        for name, dist in self.distributions.items():
            reason = KNOBS[name].drop(best)
            if reason:
                dropped.append(Dropped(name, reason))
                continue
            dist, lost = _drop_choices(name, dist, best)
            values = values_of(dist)
            if not (lost and values is not None and len(values) <= 1):
                return None  # this one may act
            dropped += lost
        return self._nothing_left(best, dropped)

    def _nothing_left(self, target: Target, dropped: list[Dropped]) -> ConfigError:
        return ConfigError(
            f"search space {self.source or self.name}: nothing left to tune on "
            f"{target.backend}/{target.device}; left out: " + "; ".join(map(str, dropped))
        )


def _checked_dimension(name: str, spec: Any, *, where: str) -> BaseDistribution:
    knob = KNOBS[name]
    dist = distribution_from_yaml(spec, where=where)
    if knob.choices_only and not isinstance(dist, CategoricalDistribution):
        raise ConfigError(f"{where}: this knob needs type: categorical with a list of choices")
    points = (
        list(dist.choices) if isinstance(dist, CategoricalDistribution) else [dist.low, dist.high]
    )
    for value in points:
        reason = knob.legal(value)
        if reason:
            raise ConfigError(f"{where}: {value!r} is not a legal value: {name} {reason}")
    return dist


def _drop_choices(
    name: str, dist: BaseDistribution, target: Target
) -> tuple[BaseDistribution, list[Dropped]]:
    knob = KNOBS[name]
    if name == "micro_batch" and not isinstance(dist, CategoricalDistribution):
        values = values_of(dist) or [
            d for d in range(1, target.per_rank_batch + 1) if dist.low <= d <= dist.high
        ]
        dist = CategoricalDistribution(values)
    if isinstance(dist, CategoricalDistribution):
        keep, lost = [], []
        for c in dist.choices:
            reason = knob.drop_choice(target, c)
            if reason:
                lost.append(Dropped(name, reason, choice=c, whole=False))
            else:
                keep.append(c)
        if lost and not keep:
            return dist, [Dropped(name, "; ".join({d.reason for d in lost}))]
        if name == "micro_batch" and len(lost) > 3:  # many divisibility drops: say it once
            lost = [
                Dropped(
                    name,
                    lost[0].reason.replace("does not", "do not"),
                    choice=", ".join(str(d.choice) for d in lost),
                    whole=False,
                )
            ]
        return (CategoricalDistribution(keep) if lost else dist), lost
    if name == "threads" and isinstance(dist, IntDistribution) and dist.high > target.cpus_per_rank:
        high = max(dist.low, target.cpus_per_rank)
        step = dist.step
        high = dist.low + (high - dist.low) // step * step
        lost = [
            Dropped(
                name,
                f"more threads than the {target.cpus_per_rank} CPUs each rank has",
                choice=f"{high + 1}..{dist.high}",
                whole=False,
            )
        ]
        return IntDistribution(dist.low, high, log=dist.log, step=step), lost
    return dist, []


@dataclass(frozen=True)
class ResolvedSpace:
    """The dimensions a study on one target actually searches."""

    target: Target
    distributions: Mapping[str, BaseDistribution]
    dropped: list[Dropped] = field(default_factory=list)

    def defaults(self) -> dict[str, Any]:
        """Every knob at its default: the baseline's full assignment."""
        return defaults(self.target)

    def active(self, values: Mapping[str, Any]) -> list[str]:
        """The dimensions suggested for ``values`` (a knob whose parent's value rules it out
        is not suggested)."""
        out = []
        for name in self.distributions:
            parent = KNOBS[name].parent
            if parent is None or parent[1](values[parent[0]], self.target):
                out.append(name)
        return out

    def baseline_params(self) -> dict[str, Any]:
        """The Optuna params of the baseline trial."""
        values = self.defaults()
        return {name: values[name] for name in self.active(values)}

    def suggest(self, trial: optuna.trial.BaseTrial) -> dict[str, Any]:
        """Suggest every active dimension on ``trial``; returns every knob's value."""
        values = self.defaults()
        for name, dist in self.distributions.items():
            parent = KNOBS[name].parent
            if parent is not None and not parent[1](values[parent[0]], self.target):
                continue
            values[name] = _suggest(trial, name, dist)
        return values

    def values_from_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        values = self.defaults()
        values.update(params)
        return values

    def illegal(self, values: Mapping[str, Any]) -> str | None:
        return illegal_combination(values, self.target)

    def grid(self) -> dict[str, list[Any]]:
        """A finite grid for Optuna's GridSampler: every choice of a finite dimension;
        ``GRID_POINTS`` points (log-spaced where the dimension is log), plus the default,
        for a continuous one."""
        grid: dict[str, list[Any]] = {}
        defaults = self.defaults()
        for name, dist in self.distributions.items():
            values = values_of(dist)
            if values is None or len(values) > 16:
                values = _spread(dist)
                if defaults[name] not in values:
                    values = sorted([*values, defaults[name]])
            grid[name] = values
        return grid

    def to_mapping(self) -> dict[str, Any]:
        return SearchSpace(name="resolved", distributions=self.distributions).to_mapping()


def _spread(dist: BaseDistribution) -> list[Any]:
    lo, hi = float(dist.low), float(dist.high)
    if dist.log:
        pts = [lo * (hi / lo) ** (i / (GRID_POINTS - 1)) for i in range(GRID_POINTS)]
    else:
        pts = [lo + (hi - lo) * i / (GRID_POINTS - 1) for i in range(GRID_POINTS)]
    if isinstance(dist, IntDistribution):
        return sorted({dist.low + round((p - dist.low) / dist.step) * dist.step for p in pts})
    if dist.step is not None:
        pts = [lo + round((p - lo) / dist.step) * dist.step for p in pts]
    return sorted({float(f"{p:.4g}") if lo <= float(f"{p:.4g}") <= hi else p for p in pts})


def _suggest(trial: optuna.trial.BaseTrial, name: str, dist: BaseDistribution) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, dist.choices)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)


def available_spaces() -> list[str]:
    return _yaml.builtin_names(BUILTIN_PACKAGE)


def _find(name_or_path: str) -> Path:
    return _yaml.find_builtin(BUILTIN_PACKAGE, name_or_path, flag="--space", kind="search space")
