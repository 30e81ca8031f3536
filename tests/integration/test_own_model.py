"""The README's own-model example, exactly as written: its module saved as my_model.py, its
command run from that directory (a local Ray instance, which gives the ranks that directory and
leaves no process behind), ended by three trials within a 3-minute budget, with the quick
study's short windows added."""

from __future__ import annotations

import re
import uuid

import optuna
import pytest
from optuna.trial import TrialState

from tests.conftest import REPO, with_env
from tests.integration.conftest import autotune

pytestmark = pytest.mark.integration

#: Set in the run's environment: every process it starts inherits it.
TEST_MARK = "AUTOTUNE_TEST_MARK"


def example() -> tuple[str, list[str]]:
    section = (REPO / "README.md").read_text().split("## Your own model", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    command = re.search(r"```bash\n(.*?)```", section, re.S).group(1).split()
    return code, command


def test_the_readme_example_is_at_most_30_lines():
    code, command = example()
    assert len(code.strip().splitlines()) <= 30
    assert command[:2] == ["autotune", "run"]


def test_the_readme_example_tunes_its_own_model_and_leaves_nothing_running(run_env, tmp_path):
    mark = f"own-model-{uuid.uuid4()}"  # in every process the run starts, Ray's included
    code, command = example()
    (tmp_path / "my_model.py").write_text(code)
    args = command[2:]
    args[args.index("--budget") + 1] = "3m"  # the example says 10m
    # three trials end it, without re-validation: about 20 s on an idle machine; the budget is
    # room for a loaded one (45 s held only the baseline with the suite in two workers), and
    # for a first measurement taken twice (a crashed traced probe is measured again
    # untraced: limit.probe.probe_one)
    p = autotune(
        {**run_env, TEST_MARK: mark},
        "run",
        *args,
        "--study",
        "quick",
        "--n-trials",
        "3",
        "--validate-top",
        "0",
        cwd=tmp_path,
        timeout=300,
    )
    study = optuna.load_study(
        study_name="quick-my_model.workload-gloo-2r",
        storage=f"sqlite:///{tmp_path}/home/autotune.db",
    )
    assert study.user_attrs["autotune"]["workload"]["options"] == {"hidden": 256}
    measured = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert study.trials[0].state == TrialState.COMPLETE and len(measured) >= 2, p.stdout
    assert all(t.user_attrs["config"]["global_batch"] == 256 for t in measured)
    assert (tmp_path / "home" / "profiles" / "quick-my_model.workload-gloo-2r.yaml").exists()
    assert not with_env(TEST_MARK, mark)  # the local instance it started is gone


def test_a_trainer_that_breaks_the_contract_is_refused_before_any_trial(run_env, tmp_path):
    code, _ = example()
    (tmp_path / "my_model.py").write_text(code.replace("        dataset=Points(),", ""))
    p = autotune(
        run_env, "run", "--trainer", "my_model:workload", "--budget", "10s", cwd=tmp_path, rc=2
    )
    assert p.stderr.strip().count("\n") == 0 and "my_model:workload" in p.stderr
    assert "dataset" in p.stderr
    assert not (tmp_path / "home").exists()  # nothing written, no Ray started for it
