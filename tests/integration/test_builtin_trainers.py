"""Each built-in trainer tunes end to end on CPU: `autotune run` with real Ray, real 2-rank gloo
DDP and a real SQLite study, at sizes that keep a trial to a few seconds."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from tests.integration.conftest import autotune

pytestmark = pytest.mark.integration

SMALL = {
    "convnet": ["size=16", "width=8", "decode_passes=4", "global_batch=32"],
    "transformer": ["vocab=256", "seq_len=32", "dim=64", "heads=2", "global_batch=32"],
}


@pytest.mark.parametrize("trainer", sorted(SMALL))
def test_builtin_trainer_tunes_end_to_end(trainer, ray_address, run_env, tmp_path):
    options = [arg for opt in SMALL[trainer] for arg in ("--trainer-option", opt)]
    # --trainer replaces the quick study's MLP, and its options with these
    # A trial count, not a short budget, decides how many trials run: on a loaded machine a
    # 25-second budget held the baseline alone. --no-limit: the trials are what is checked
    # here, not the limit probe (test_limit.py, test_run_cli.py)
    p = autotune(
        run_env,
        "run",
        "--study",
        "quick",
        "--trainer",
        trainer,
        *options,
        "--budget",
        "5m",
        "--n-trials",
        "3",
        "--validate-top",
        "0",
        "--no-limit",
        "--address",
        ray_address,
    )
    name = f"quick-{trainer}-gloo-2r"
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path}/home/autotune.db")
    record = study.user_attrs["autotune"]["workload"]
    assert record["trainer"] == trainer and record["global_batch"] == 32
    # exactly the options given: none of the quick study's MLP options leaked in
    assert record["options"] == {k: int(v) for k, v in (o.split("=") for o in SMALL[trainer])}
    measured = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert study.trials[0].state == TrialState.COMPLETE and len(measured) >= 2, p.stdout
    for t in measured:
        a = t.user_attrs
        assert a["config"]["global_batch"] == 32 and a["throughput"] > 0
        if trainer == "transformer":
            assert a["tokens_per_s"] == pytest.approx(32 * a["throughput"], rel=1e-3)
        else:
            assert "tokens_per_s" not in a
    assert (tmp_path / "home" / "profiles" / f"{name}.yaml").exists()
