"""``compile=default`` on a real 2-rank gloo trial (Ray ranks, CPU): the trial completes, every
rank compiled its model, and the compilation fell before the timed windows: the graphs Dynamo
captured are counted when the session is handed over and again after the last window, and no
graph was captured in between (nothing compiled in the settle warm-up or in a window).

Inductor builds C++ kernels on a CPU: the smallest built-in model (the tiny MLP, 64 wide)
keeps its cold compile to about 10-20 s per rank on a 2-core machine. Skipped where the ranks
cannot compile (no C++ compiler): the probe says why."""

from __future__ import annotations

import pytest

from tests.integration.conftest import QUICK, config

pytestmark = pytest.mark.integration

TRAINER = "autotune_test_trainers:tiny"


def run(runner, cfg):
    return runner.run(
        trial=0,
        trainer=TRAINER,
        trainer_options={},
        config=cfg,
        measure=QUICK,
        seed=0,
        timeout_s=240,
    )


def test_a_compiled_trial_compiles_in_its_first_steps_and_never_in_a_window(runner):
    problem = runner.probe()["compile_problem"]
    if problem is not None:
        pytest.skip(f"torch.compile cannot run on these ranks: {problem}")
    res = run(runner, config(compile="default"))
    assert [r.rank for r in res.ranks] == [0, 1]
    for r in res.ranks:
        facts = r.applied["compile"]
        assert facts["mode"] == "default"
        assert facts["graphs"] >= 1, facts  # the model was compiled, on every rank
        assert facts["late_graphs"] == 0, facts  # nothing after the first steps
        assert 2 <= facts["steps"] <= 10
        # the compile steps are inside the time before the first window (the trial's setup)
        assert facts["seconds"] <= r.setup_s
        assert QUICK.min_windows <= len(r.windows) and r.stop in ("converged", "cap")
    assert res.ranks[0].windows == res.ranks[1].windows  # all ranks ran the same steps
    assert res.throughput > 0


def test_an_uncompiled_trial_says_so(runner):
    res = run(runner, config())
    assert all(r.applied["compile"] == {"mode": "none"} for r in res.ranks)
