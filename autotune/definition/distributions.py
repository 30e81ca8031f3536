"""One dimension of a search space: the YAML form of an Optuna distribution and back, checked
by Optuna's own distribution classes, and the finite values a distribution holds."""

from __future__ import annotations

import math
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from autotune.core import safe_yaml as _yaml
from autotune.core.errors import ConfigError

__all__ = ["contains", "distribution_from_yaml", "distribution_to_yaml", "values_of"]

_DIST_KEYS = ("type", "low", "high", "step", "log", "choices")


def distribution_from_yaml(spec: Any, *, where: str) -> BaseDistribution:
    """One ``{type, low, high, step, log, choices}`` mapping -> an Optuna distribution."""
    if not isinstance(spec, dict):
        raise ConfigError(
            f"{where}: expected a mapping like {{type: int, low: 1, high: 8}}, got {spec!r}"
        )
    _yaml.check_keys(spec, where=where, allowed=_DIST_KEYS, required=("type",))
    kind = spec["type"]
    if kind == "categorical":
        _yaml.check_keys(spec, where=where, allowed=("type", "choices"), required=("choices",))
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{where}: choices must be a non-empty list, got {choices!r}")
        if len(set(map(repr, choices))) != len(choices):
            raise ConfigError(f"{where}: choices must not repeat, got {choices!r}")
        return _optuna_checked(CategoricalDistribution, where, choices=choices)
    if kind not in ("float", "int"):
        raise ConfigError(f"{where}: type must be float, int or categorical, got {kind!r}")
    _yaml.check_keys(
        spec,
        where=where,
        allowed=("type", "low", "high", "step", "log"),
        required=("low", "high"),
    )
    for key in ("low", "high", "step"):
        v = spec.get(key)
        if v is not None and (
            isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
        ):
            raise ConfigError(f"{where}: {key} must be a finite number, got {v!r}")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"{where}: log must be true or false, got {log!r}")
    if kind == "int":
        for key in ("low", "high", "step"):
            v = spec.get(key)
            if v is not None and not float(v).is_integer():
                raise ConfigError(f"{where}: an int dimension needs whole numbers, {key}={v!r}")
        return _optuna_checked(
            IntDistribution,
            where,
            low=int(spec["low"]),
            high=int(spec["high"]),
            log=log,
            step=int(spec.get("step") or 1),
        )
    return _optuna_checked(
        FloatDistribution,
        where,
        low=float(spec["low"]),
        high=float(spec["high"]),
        log=log,
        step=None if spec.get("step") is None else float(spec["step"]),
    )


def _optuna_checked(cls: type[BaseDistribution], where: str, **kwargs: Any) -> BaseDistribution:
    """Let Optuna check the bounds; its message already states the rule and the values."""
    try:
        return cls(**kwargs)
    except ValueError as e:
        msg = " ".join(str(e).split())
        raise ConfigError(f"{where}: {msg}") from None


def distribution_to_yaml(dist: BaseDistribution) -> dict[str, Any]:
    """The inverse of distribution_from_yaml: the smallest mapping that loads back equal."""
    if isinstance(dist, CategoricalDistribution):
        return {"type": "categorical", "choices": list(dist.choices)}
    if isinstance(dist, (IntDistribution, FloatDistribution)):
        kind = "int" if isinstance(dist, IntDistribution) else "float"
        out: dict[str, Any] = {"type": kind, "low": dist.low, "high": dist.high}
        if dist.log:
            out["log"] = True
        if dist.step is not None and not (kind == "int" and dist.step == 1):
            out["step"] = dist.step
        return out
    raise TypeError(f"unsupported distribution {dist!r}")


def contains(dist: BaseDistribution, value: Any) -> bool:
    """Whether ``value`` is one of ``dist``'s values."""
    if isinstance(dist, CategoricalDistribution):
        return any(type(c) is type(value) and c == value for c in dist.choices)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if not dist.low <= value <= dist.high:
        return False
    step = dist.step
    return step is None or math.isclose((value - dist.low) / step, round((value - dist.low) / step))


def values_of(dist: BaseDistribution) -> list[Any] | None:
    """Every value of a finite distribution, or None when there are too many to list."""
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    if isinstance(dist, IntDistribution):
        n = (dist.high - dist.low) // dist.step + 1
        return list(range(dist.low, dist.high + 1, dist.step)) if n <= 64 else None
    if dist.step is not None:
        n = int(round((dist.high - dist.low) / dist.step)) + 1
        return [dist.low + i * dist.step for i in range(n)] if n <= 64 else None
    return None
