"""Small purpose-built trainers for the integration tests (imported by the rank processes,
which find this directory through PYTHONPATH)."""

from __future__ import annotations

import os

import torch
from autotune.trainers import mlp

from autotune.workload import Workload


def tiny(**options) -> Workload:
    """The built-in MLP at a size whose trials take a second or two."""
    return mlp.workload(**{"width": 64, "layers": 2, "global_batch": 32, **options})


def raising(**options) -> Workload:
    """Rank 1 raises while building its model: a crash with a known first line."""
    wl = tiny(**options)
    build = wl.model

    def model():
        if os.environ.get("RANK_FOR_TEST") == "1" or (
            torch.distributed.is_initialized() and torch.distributed.get_rank() == 1
        ):
            raise RuntimeError("boom on purpose in rank 1")
        return build()

    wl.model = model
    return wl
