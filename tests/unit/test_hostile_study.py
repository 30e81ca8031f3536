"""A study from elsewhere is untrusted input: resuming it runs what it holds. A study whose
stored configuration or queued parameters fail the one check of a configuration is refused in
one line naming the study, the trial and the key, before Ray starts and before anything is
written; a configuration out of its bounds that reaches the measurer fails its trial as
``illegal``. Each case is a row of docs/security.md."""

from __future__ import annotations

import hashlib
from pathlib import Path

import optuna
import pytest
from optuna.distributions import IntDistribution
from optuna.trial import create_trial

from autotune.core.config import TrialConfig
from autotune.core.errors import FailureReason, TrialFailed
from autotune.core.target import Target
from autotune.definition.space import SearchSpace
from autotune.definition.studydef import StudyDefinition
from autotune.launch.measurer import RayMeasurer
from tests.conftest import in_process

CPU = Target(backend="gloo", device="cpu", world_size=2, global_batch=64, cpus_per_rank=1)


def good_config() -> dict:
    values = SearchSpace.load("default").resolve(CPU).defaults()
    return TrialConfig.from_values(values, CPU).to_dict()


def stored(url: str, name: str, *, config: dict | None = None, queued: dict | None = None):
    study = optuna.create_study(study_name=name, storage=url, direction="maximize")
    if config is not None:
        study.add_trial(
            create_trial(
                params={},
                distributions={},
                value=1.0,
                user_attrs={"config": config, "baseline": True},
            )
        )
    if queued is not None:
        study.enqueue_trial(queued, skip_if_exists=False)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_resuming(tmp_path: Path, *extra: str):
    db = tmp_path / "shared.db"
    out = in_process(
        "run",
        "--space",
        "default",
        "--budget",
        "1m",
        "--storage",
        f"sqlite:///{db}",
        "--run-dir",
        str(tmp_path / "run"),
        *extra,
        cwd=tmp_path,
    )
    return out, db


ENV_CASES = [
    pytest.param({"LD_PRELOAD": "/tmp/evil.so"}, "env key 'LD_PRELOAD' is not allowed", id="H-D01"),
    pytest.param({"PATH": "/tmp/evil"}, "env key 'PATH' is not allowed", id="H-D02"),
    pytest.param(
        {"NCCL_NET_PLUGIN": "evil"}, "env key 'NCCL_NET_PLUGIN' is not allowed", id="H-D03"
    ),
    pytest.param(
        {"GLOO_SOCKET_IFNAME": "eth0"}, "env key 'GLOO_SOCKET_IFNAME' is not allowed", id="H-D04"
    ),
    pytest.param(
        {"OMP_NUM_THREADS": "100000"}, "env.OMP_NUM_THREADS must be an integer in", id="H-D05"
    ),
]


@pytest.mark.parametrize("env, message", ENV_CASES)
def test_a_stored_configuration_out_of_bounds_refuses_the_resume_before_ray(tmp_path, env, message):
    """The stored configuration's environment is what re-validation, ablation and the limit
    probe would run: refused by name, exit 2, nothing started (``in_process`` fails the test
    if Ray starts), the database unchanged."""
    db = tmp_path / "shared.db"
    stored(f"sqlite:///{db}", "shared", config={**good_config(), "env": env})
    before = digest(db)
    out, _ = run_resuming(tmp_path, "--study-name", "shared")
    assert out.returncode == 2, out.stderr
    line = out.stderr.strip()
    assert "\n" not in line
    assert line.startswith("autotune: error: study 'shared' in sqlite:///")
    assert "trial 0: " + message in line
    assert line.endswith("do not resume it (choose another --study-name or --storage)")
    assert digest(db) == before
    assert not (tmp_path / "run").exists()


def test_a_study_under_the_default_name_is_checked_too(tmp_path):
    """Without --study-name the run resumes its default name (``default-mlp-gloo-2r``): a
    hostile study of that name in the run directory's database is refused alike (H-D06)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    db = run_dir / "autotune.db"
    stored(
        f"sqlite:///{db}",
        "default-mlp-gloo-2r",
        config={**good_config(), "data": {"num_workers": 100000}},
    )
    out = in_process(
        "run", "--space", "default", "--budget", "1m", "--run-dir", str(run_dir), cwd=tmp_path
    )
    assert out.returncode == 2, out.stderr
    assert "study 'default-mlp-gloo-2r'" in out.stderr
    assert "trial 0: data.num_workers must be an integer in [0, 256], got 100000" in out.stderr


@pytest.mark.parametrize(
    "queued, message",
    [
        pytest.param(
            {"num_workers": 100000},
            "parameter num_workers must be an integer in [0, 256]",
            id="H-D07",
        ),
        pytest.param(
            {"bucket_cap_mb": 1e300}, "parameter bucket_cap_mb must be a number above 0", id="H-D08"
        ),
        pytest.param(
            {"__import__('os')": 1}, "parameter \"__import__('os')\" is not a knob", id="H-D09"
        ),
    ],
)
def test_a_queued_trial_out_of_bounds_refuses_the_resume(tmp_path, queued, message):
    """A trial queued in the study (``enqueue_trial``) runs with its parameters as given:
    Optuna runs a fixed parameter outside its distribution with a warning."""
    db = tmp_path / "shared.db"
    stored(f"sqlite:///{db}", "shared", queued=queued)
    out, _ = run_resuming(tmp_path, "--study-name", "shared")
    assert out.returncode == 2, out.stderr
    assert message in out.stderr, out.stderr


def test_a_completed_trial_with_a_hostile_parameter_refuses_the_resume(tmp_path):
    """The sampler learns from completed trials' parameters; a name that is not a knob is not a
    study autotune wrote (H-D10)."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    study = optuna.create_study(study_name="shared", storage=url, direction="maximize")
    dist = {"threads": IntDistribution(1, 10000)}
    study.add_trial(create_trial(params={"threads": 5000}, distributions=dist, value=1.0))
    out, _ = run_resuming(tmp_path, "--study-name", "shared")
    assert out.returncode == 2, out.stderr
    assert "trial 0: parameter threads must be an integer in [1, 1024], got 5000" in out.stderr


def test_another_study_of_the_storage_is_not_read(tmp_path):
    """Only the studies this run may resume are checked: a hostile study of another name in a
    shared storage does not stop a run that will not touch it (H-D11)."""
    from autotune.record.vet import check_studies

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    stored(url, "someone-else", config={**good_config(), "env": {"LD_PRELOAD": "x"}})
    check_studies(url, name="mine", prefix="default-mlp-")
    check_studies(url, name=None, prefix="default-mlp-")
    with pytest.raises(Exception, match="LD_PRELOAD"):
        check_studies(url, name="someone-else", prefix="default-mlp-")


def test_a_missing_database_is_not_created_by_the_check(tmp_path):
    from autotune.record.vet import check_studies

    check_studies(f"sqlite:///{tmp_path / 'none.db'}", name=None, prefix="x-")
    assert not (tmp_path / "none.db").exists()


def test_a_configuration_out_of_bounds_fails_its_trial_as_illegal_at_the_measurer():
    """The last gate before anything runs: whatever built the configuration (H-D12)."""
    bad = TrialConfig(**{**good_config(), "data": {"num_workers": 100000, "pin_memory": False}})
    measurer = RayMeasurer(study=None, runners=[], definition=StudyDefinition(name="x"))
    with pytest.raises(TrialFailed) as e:
        measurer(7, bad)
    assert e.value.reason is FailureReason.ILLEGAL
    assert "trial 7: data.num_workers must be an integer in [0, 256], got 100000" in e.value.detail
