"""Fixtures and helpers of the tests that drive TrialRunner directly."""

from __future__ import annotations

import pytest

from autotune.config import MeasureSettings, TrialConfig
from autotune.knobs import Target
from autotune.launcher import TrialRunner
from autotune.space import SearchSpace

TARGET = Target(
    backend="gloo", device="cpu", world_size=2, global_batch=32, cpus_per_rank=1, bf16=True
)
QUICK = MeasureSettings(warmup_steps=2, window_s=0.3)


@pytest.fixture(scope="module")
def runner(ray_address):
    r = TrialRunner(world_size=2, backend="gloo")
    yield r
    r.close()


def config(**changes) -> TrialConfig:
    """The baseline configuration of the test target with ``changes``."""
    r = SearchSpace.load("default").resolve(TARGET)
    return TrialConfig.from_values({**r.defaults(), **changes}, TARGET)
