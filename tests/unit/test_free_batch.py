"""--free-batch: the per-rank batch becomes a knob and the global batch follows it; without it
every trial keeps the workload's global batch through accumulation."""

from __future__ import annotations

import optuna
from optuna.trial import create_trial

from autotune.core.config import TrialConfig
from autotune.core.knobs import illegal_combination
from autotune.core.target import Target
from autotune.definition.space import SearchSpace
from autotune.profile.export import study_profile
from tests.unit.test_report_and_progress import HARDWARE, WORKLOAD

FIXED = Target(backend="gloo", device="cpu", world_size=2, global_batch=128, cpus_per_rank=1)
FREE = Target(
    backend="gloo", device="cpu", world_size=2, global_batch=128, cpus_per_rank=1, free_batch=True
)


def test_a_fixed_global_batch_is_kept_by_accumulation():
    space = SearchSpace.load("default").resolve(FIXED)
    assert space.distributions["micro_batch"].choices == (8, 16, 32, 64)  # divisors of 64
    cfg = TrialConfig.from_values({**space.defaults(), "micro_batch": 16}, FIXED)
    assert (cfg.micro_batch, cfg.accumulation_steps, cfg.global_batch) == (16, 4, 128)
    assert illegal_combination({"static_graph": True, "micro_batch": 16}, FIXED)


def test_a_free_batch_makes_the_per_rank_batch_a_knob():
    space = SearchSpace.load("default").resolve(FREE)
    assert space.distributions["micro_batch"].choices == (8, 16, 32, 64, 128, 256)
    assert space.defaults()["micro_batch"] == 64  # the baseline keeps the declared batch
    for micro, global_batch in ((256, 512), (16, 32)):
        cfg = TrialConfig.from_values({**space.defaults(), "micro_batch": micro}, FREE)
        assert (cfg.accumulation_steps, cfg.global_batch) == (1, global_batch)
    # no accumulation, so static_graph goes with any batch
    assert illegal_combination({"static_graph": True, "micro_batch": 16}, FREE) is None
    assert "static_graph" in space.active({**space.defaults(), "micro_batch": 16})


def test_the_profile_says_when_the_global_batch_changed():
    space = SearchSpace.load("default").resolve(FREE)
    study = optuna.create_study(direction="maximize")
    study.set_user_attr(
        "autotune",
        {"workload": {**WORKLOAD, "global_batch": 128, "free_batch": True}, "hardware": HARDWARE},
    )
    for i, (micro, value) in enumerate(((64, 400.0), (256, 520.0))):
        cfg = TrialConfig.from_values({**space.defaults(), "micro_batch": micro}, FREE)
        attrs = {"config": cfg.to_dict(), **({"baseline": True} if i == 0 else {})}
        study.add_trial(create_trial(params={}, distributions={}, value=value, user_attrs=attrs))
    p = study_profile(study)
    assert p.batch == {"micro_batch": 256, "accumulation_steps": 1, "global_batch": 512}
    assert "global batch 512 instead of the workload's 128" in p.measured["batch_changed"]
    assert "training dynamics change" in p.measured["batch_changed"]
    p.to_yaml()  # the strict loader accepts it
