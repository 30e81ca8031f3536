"""The only module that touches private Optuna or Ray API, each use named with why no public
API does the job. ``pyproject.toml`` bounds both packages from above, and
``tests/unit/test_compat.py`` fails loudly when this surface moves.

* ``STUDY_TRIALS_METHOD``: Optuna's samplers read a study's trials through the private
  ``Study._get_trials`` (public ``get_trials`` is a wrapper without ``use_cache``). A sampler
  that shows its model other trials (``samplers.FailureAwareTPESampler``) must override that
  very method on a view of the study; Optuna offers no public hook for "which trials a sampler
  sees".
* ``bootstrap_address("auto")``: where ``ray.init(address="auto")`` would connect (``RAY_ADDRESS``
  or the cluster recorded by ``ray start`` on this machine). Ray has no public call for it, and
  ``ray.init`` itself retries for minutes when nothing answers there; autotune asks first, to
  fail in seconds with a one-line error.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

__all__ = ["STUDY_TRIALS_METHOD", "bootstrap_address", "call_study_trials"]

#: The private method through which Optuna's samplers read a study's trials.
STUDY_TRIALS_METHOD = "_get_trials"


def call_study_trials(
    study: Any, *, deepcopy: bool, states: Container[Any] | None, use_cache: bool
) -> list[Any]:
    """``study._get_trials(...)``: the trials as Optuna's samplers read them."""
    return getattr(study, STUDY_TRIALS_METHOD)(
        deepcopy=deepcopy, states=states, use_cache=use_cache
    )


def bootstrap_address(address: str) -> str | None:
    """The ``HOST:PORT`` that ``ray.init(address=address)`` would connect to; None when
    ``auto`` finds no cluster on this machine."""
    import ray._private.services as services

    try:
        return services.canonicalize_bootstrap_address(address) or None
    except Exception:
        return None
