"""``autotune run --log-to tensorboard`` end to end: a real run's trials, as its study holds
them, each recorded once in TensorBoard's event files, read back with TensorBoard's own
reader, and the run's result beside them."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState
from tensorboard.backend.event_processing.event_accumulator import (
    SCALARS,
    TENSORS,
    EventAccumulator,
)

from tests.integration.conftest import STUDY, autotune

pytestmark = pytest.mark.integration


def test_a_run_logged_to_tensorboard_records_each_trial_once_and_its_result(ray_address, run_env):
    home = run_env["AUTOTUNE_HOME"]
    p = autotune(
        run_env,
        "run",
        "--study",
        "quick",
        # four trials, no re-validation, no limit probe: what is logged per trial and at the
        # end, not a budget's worth of trials
        "--budget",
        "3m",
        "--n-trials",
        "4",
        "--validate-top",
        "0",
        "--no-limit",
        "--address",
        ray_address,
        "--log-to",
        "tensorboard",
        "--quiet",
    )
    logdir = f"{home}/tensorboard/{STUDY}"
    assert f"Logging each trial to TensorBoard: {logdir}" in p.stdout
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{home}/autotune.db")
    ended = {t.number: t for t in study.get_trials() if t.state.is_finished()}
    assert len(ended) == 4 and 0 in ended, p.stdout  # the baseline and three more
    # TensorBoard's reader keeps 10 texts per tag unless told to keep all (0); a run here can
    # end more trials than that, as the --samples_per_plugin text=0 autotune prints says
    acc = EventAccumulator(logdir, size_guidance={TENSORS: 0, SCALARS: 0})
    acc.Reload()
    records = acc.Tensors("trial/record/text_summary")
    assert sorted(e.step for e in records) == sorted(ended)  # one record per trial
    for e in records:
        t = ended[e.step]
        assert e.tensor_proto.string_val[0].decode().startswith(f"trial {t.number}: {t.state.name}")
    measured = {
        n: t.user_attrs["throughput"]
        for n, t in ended.items()
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
    }
    got = {e.step: e.value for e in acc.Scalars("trial/throughput")}
    assert got == pytest.approx(measured)
    low = {e.step: e.value for e in acc.Scalars("trial/interval_low")}
    assert all(low[n] <= got[n] for n in measured)
    (result,) = acc.Tensors("run/result/text_summary")
    assert f"profile {home}/profiles/{STUDY}.yaml" in result.tensor_proto.string_val[0].decode()
