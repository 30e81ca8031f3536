"""autotune: tune PyTorch DDP throughput with an Optuna study of real DDP trials on Ray.

Public surface: ``Profile`` (load and apply a tuned profile), ``Workload`` (what a trainer
returns), ``SearchSpace`` and the error classes.
"""

from __future__ import annotations

from autotune.core.errors import AutotuneError, BaselineFailed, ConfigError, TrialFailed
from autotune.definition.space import SearchSpace
from autotune.profile.profile import Profile
from autotune.rank.workload import Workload

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
