"""The numerics guard on real 2-rank trials: the fp16 compression hook zeroes gradients that
fp16 cannot hold, the model stops learning, and the trial is FAIL numerics_drift; bf16 autocast
on the same workload stays within the tolerance; --allow-drift keeps the drifting setting.

bf16 is searched only on a CPU with bf16 units (AVX512-BF16, AMX: ``hardware.bf16_native``);
elsewhere the run leaves it out, saying why, and its grid is the hook's two points: the bf16
arms are then checked to be absent, and the hook's drift all the same."""

from __future__ import annotations

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from autotune.launch.hardware import describe
from tests.conftest import REPO, TESTS
from tests.integration.conftest import autotune

pytestmark = pytest.mark.integration

#: Whether this machine's CPU runs bf16 in hardware, as the run's own hardware probe reads it.
BF16 = describe("gloo")["bf16_native"]
#: The precisions the run's grid holds here.
PRECISIONS = ("fp32", "bf16") if BF16 else ("fp32",)

SPACE = """
ddp:
  comm_hook: {type: categorical, choices: [none, fp16]}
precision:
  precision: {type: categorical, choices: [fp32, bf16]}
"""


def _study() -> str:
    """The quick study with the warm-up's hopeless rule out of reach: a trial it prunes ends
    after 6 steps, short of the 8 the guard compares, so it gets no verdict (on a loaded
    machine the fp16 hook's trial was pruned so, and had no drift recorded)."""
    data = yaml.safe_load((REPO / "studies" / "quick.yaml").read_text())
    data.setdefault("measure", {})["hopeless_factor"] = 1000
    return yaml.safe_dump(data)


def run(env, tmp_path, address, *extra):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    study_file = tmp_path / "quick.yaml"  # its name, as the study's: quick
    study_file.write_text(_study())
    p = autotune(
        env,
        "run",
        "--study",
        str(study_file),
        "--trainer",
        "autotune_test_trainers:underflow",
        "--space",
        str(space),
        "--sampler",
        "grid",
        "--budget",
        "3m",  # the grid's 4 points end the run (about 40 s); a loaded machine needs longer
        "--validate-top",
        "0",
        "--no-limit",  # the guard's verdicts are checked, not the limit probe
        "--address",
        address,
        *extra,
        cwd=TESTS,
    )
    study = optuna.load_study(
        study_name="quick-autotune_test_trainers.underflow-gloo-2r",
        storage=f"sqlite:///{tmp_path}/home/autotune.db",
    )
    # a precision left out of the space (only fp32 possible here) runs fp32
    by = {(t.params.get("comm_hook"), t.params.get("precision", "fp32")): t for t in study.trials}
    return p, study, by


def test_a_drifting_setting_fails_and_a_faithful_one_passes(ray_address, run_env, tmp_path):
    p, study, by = run(run_env, tmp_path, ray_address)
    assert len(by) == 2 * len(PRECISIONS), p.stdout  # the whole grid ran
    if not BF16:
        assert "precision=bf16: this CPU's bf16 matmuls took" in p.stdout  # timed by the probe
    base = study.trials[0]
    assert base.user_attrs["baseline"] and len(base.user_attrs["loss_curve"]) == 16
    curve = base.user_attrs["loss_curve"]
    assert curve[-1] < 0.5 * curve[0]  # fp32 learns
    for key in (("fp16", precision) for precision in PRECISIONS):
        t = by[key]
        assert t.state == TrialState.FAIL and t.user_attrs["reason"] == "numerics_drift", key
        assert t.user_attrs["numerics_drift"] > 0.2  # far over the 5 % tolerance
        assert "comm_hook=fp16" in t.user_attrs["reason_detail"]
        assert "differs from the fp32 baseline's by" in t.user_attrs["reason_detail"]
        assert t.user_attrs["throughput"] > 0  # its measurement is kept
    if BF16:  # lower precision, within the tolerance
        faithful = by[("none", "bf16")]
        assert faithful.state in (TrialState.COMPLETE, TrialState.PRUNED)
        assert faithful.user_attrs["numerics_drift"] < 0.05
    assert "numerics_drift" in p.stdout  # the failure is in the run's summary
    assert study.best_trial.params["comm_hook"] == "none"


def test_allow_drift_keeps_the_drifting_setting(ray_address, run_env, tmp_path):
    p, study, by = run(run_env, tmp_path, ray_address, "--allow-drift")
    for key in (("fp16", precision) for precision in PRECISIONS):
        t = by[key]
        assert t.state in (TrialState.COMPLETE, TrialState.PRUNED), (key, p.stdout)
        assert t.user_attrs["numerics_drift"] > 0.2 and "reason" not in t.user_attrs
