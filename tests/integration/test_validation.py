"""Re-validation before export, through real 2-rank gloo trials: the search's best is measured
again against the baseline, interleaved, and the profile follows those numbers only."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import create_trial

from autotune.core.compare import NO_WINNER_REASON
from autotune.definition.space import SearchSpace
from autotune.definition.studydef import StudyDefinition
from autotune.launch.measure import RayMeasurer
from autotune.profile.export import export_profile
from autotune.profile.profile import Profile
from autotune.record.attrs import ValidationRecord, load
from autotune.record.study import ATTR
from autotune.report.events import ValidationDone, ValidationStarted
from autotune.search.validation import revalidate
from tests.integration.conftest import QUICK, TARGET, config

pytestmark = pytest.mark.integration

WORKLOAD = {"trainer": "autotune_test_trainers:tiny", "options": {}, "world_size": 2,
            "backend": "gloo", "global_batch": 32}  # fmt: skip
HARDWARE = {"device": "cpu", "device_name": "cpu", "device_count": 2, "node_count": 1,
            "torch": "2.13.0", "nccl": None}  # fmt: skip


def test_a_search_winner_that_remeasures_slower_is_not_exported(runner, tmp_path):
    # The search "saw" trial 1 at 10x the baseline (a lucky, noisy measurement, as the best of
    # many trials is); in truth it runs 4 micro-steps per optimizer step and is slower.
    study = optuna.create_study(direction="maximize")
    study.set_user_attr(ATTR, {"workload": WORKLOAD, "hardware": HARDWARE, "left_out": []})
    dist = {"micro_batch": CategoricalDistribution([4, 16])}
    for micro, value, baseline in ((16, 1000.0, True), (4, 10_000.0, False)):
        study.add_trial(
            create_trial(
                params={"micro_batch": micro},
                distributions=dist,
                value=value,
                user_attrs={"baseline": baseline, "config": config(micro_batch=micro).to_dict()},
            )
        )
    definition = StudyDefinition(
        name="t", trainer="autotune_test_trainers:tiny", measure=QUICK, seed=0
    )
    events = []
    record = revalidate(
        study=study,
        definition=definition,
        plan=(1, 2),  # one candidate, two interleaved rounds
        measure=RayMeasurer(study=study, runners=[runner], definition=definition),
        emit=events.append,
        defaults=SearchSpace.load("default").resolve(TARGET).defaults(),
    )

    assert record is not None
    assert record.order == ["baseline", "trial 1", "trial 1", "baseline"]  # A B B A
    assert [len(v) for v in record.measurements.values()] == [2, 2]
    assert record.winner == "baseline" and record.beats_baseline is False
    assert record.reason == NO_WINNER_REASON
    assert load(study, ValidationRecord) == record  # stored, and read back the same
    assert isinstance(events[0], ValidationStarted) and events[0].runs == 4
    assert events[-1] == ValidationDone(
        winner="baseline", beats_baseline=False, speedup=(1.0, 1.0, 1.0), reason=NO_WINNER_REASON
    )

    profile = Profile.load(export_profile(study, tmp_path / "p.yaml"))
    assert profile.study["best_trial"] == 0  # the defaults, not the search's 10x trial
    assert profile.batch["micro_batch"] == 16
    assert profile.measured["note"] == NO_WINNER_REASON
    assert profile.measured["speedup"] == 1.0
    res = profile.measured["validation"]["results"]
    assert res["trial 1"]["speedup"][1] < 1.0  # re-measured slower than the defaults
    assert res["trial 1"]["beats_baseline"] is False
