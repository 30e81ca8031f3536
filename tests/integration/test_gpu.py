"""One real nccl rank on a GPU: the nccl path, precision and pinned memory. Skipped without
CUDA (the project's CI machines have no GPU); run it where one is lent."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU for nccl"),
]


def test_single_rank_nccl_trial_applies_env_precision_and_pinning(ray_address):
    import ray

    if ray.cluster_resources().get("GPU", 0) < 1:
        pytest.skip("the test's Ray instance sees no GPU")
    from autotune.config import MeasureSettings, TrialConfig
    from autotune.knobs import Target
    from autotune.launcher import TrialRunner
    from autotune.space import SearchSpace

    runner = TrialRunner(world_size=1, backend="nccl")
    try:
        hw = runner.probe()
        target = Target(
            backend="nccl",
            device="cuda",
            world_size=1,
            global_batch=64,
            cpus_per_rank=1,
            bf16=hw["bf16"],
            tf32=hw["tf32"],
        )
        r = SearchSpace.load("default").resolve(target)
        values = {
            **r.defaults(),
            "NCCL_ALGO": "Ring",
            "NCCL_BUFFSIZE": 8388608,
            "precision": "bf16" if hw["bf16"] else "fp16",
            "pin_memory": True,
            "num_workers": 1,
        }
        cfg = TrialConfig.from_values(values, target)
        res = runner.run(
            trial=0,
            trainer="autotune_test_trainers:tiny",
            trainer_options={"global_batch": 64},
            config=cfg,
            measure=MeasureSettings(window_s=0.5),
            seed=0,
            timeout_s=300,
        )
        rank = res.ranks[0]
        assert rank.env_at_start["NCCL_ALGO"] == "Ring"
        assert rank.env_at_start["NCCL_BUFFSIZE"] == "8388608"
        assert rank.applied["pin_memory"] is True
        assert rank.applied["grad_scaler"] is (values["precision"] == "fp16")
        assert res.throughput > 0
    finally:
        runner.close()
