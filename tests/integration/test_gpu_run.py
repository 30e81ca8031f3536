"""`autotune run` on a GPU, end to end: one nccl rank, the profile's hardware record.

Its own module: the runner of ``test_gpu.py`` holds the GPU's placement group until that
module ends, and this run's ranks need the GPU. Skipped without CUDA.
"""

from __future__ import annotations

import pytest

from autotune.profile.profile import Profile
from tests.integration.conftest import autotune

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU for nccl"),
]


def test_autotune_run_on_the_gpu_exports_an_nccl_profile(ray_address, run_env, tmp_path):
    p = autotune(
        run_env,
        "run",
        "--study",
        "transformer",
        "--backend",
        "nccl",
        "--n-trials",
        "4",
        "--no-screening",
        "--validate-top",
        "0",
        "--seed",
        "1",
        "--budget",
        "3m",
        "--address",
        ray_address,
    )
    print(p.stdout)
    profiles = list((tmp_path / "home").rglob("profiles/*.yaml"))
    assert len(profiles) == 1, p.stdout
    prof = Profile.load(profiles[0])
    print(profiles[0].read_text())
    assert prof.workload["backend"] == "nccl" and prof.workload["world_size"] == 1
    hw = prof.hardware
    assert hw["device"] == "cuda" and hw["cuda"] == torch.version.cuda
    assert hw["device_name"] == torch.cuda.get_device_name(0) and hw["driver"]
    assert prof.measured["trials"]["total"] == 4 and "--n-trials 4: 4 trials run" in p.stdout
