"""autotune: tune PyTorch DDP throughput with an Optuna study of real DDP trials on Ray.

Public surface: ``Profile`` (load and apply a tuned profile), ``Workload`` (what a trainer
returns), ``SearchSpace`` and the error classes.

Applying a profile needs only torch and PyYAML: ``import autotune`` and ``Profile`` import
nothing of the tuner (Optuna, Ray, SQLAlchemy, rich, plotly, SciPy). ``SearchSpace``, which
builds Optuna distributions, is imported on first use (tests/unit/test_light_import.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.core.errors import AutotuneError, BaselineFailed, ConfigError, TrialFailed
from autotune.profile.profile import Profile
from autotune.rank.workload import Workload

if TYPE_CHECKING:
    from autotune.definition.space import SearchSpace

__all__ = [
    "AutotuneError",
    "BaselineFailed",
    "ConfigError",
    "Profile",
    "SearchSpace",
    "TrialFailed",
    "Workload",
]
__version__ = "0.1.0"  # pyproject.toml's version (tests/unit/test_layout.py)
#: The distribution's name on a package index (the import package and the command are
#: ``autotune``; an unrelated ``autotune`` exists on the public index).
DISTRIBUTION = "ddp-autotune"


def __getattr__(name: str) -> Any:
    """``autotune.SearchSpace``, imported when first asked for (it imports Optuna)."""
    if name == "SearchSpace":
        from autotune.definition.space import SearchSpace

        return SearchSpace
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")
