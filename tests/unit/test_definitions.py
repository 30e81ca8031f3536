"""Study definitions and the trainer contract."""

import sys

import pytest

from autotune.core.errors import ConfigError
from autotune.definition.studydef import StudyDefinition, available_studies
from autotune.rank.workload import Workload, available_trainers, load_workload


def test_builtin_studies_load_and_name_existing_spaces_and_trainers():
    assert {"default", "quick"} <= set(available_studies())
    for name in available_studies():
        d = StudyDefinition.load(name)
        assert d.trainer in available_trainers()
        d.check()


@pytest.mark.parametrize(
    "text, message",
    [
        ("trainer: mlp\nbudgett: 5m\n", r"unknown key 'budgett'"),
        ("space: default\n", r"missing required key 'trainer'"),
        ("trainer: mlp\nbudget: soon\n", r"budget: cannot read 'soon'"),
        (
            "trainer: mlp\nsampler: bayes\n",
            r"mine.yaml: sampler must be one of tpe, gp, random, cmaes, grid, got 'bayes'",
        ),
        ("trainer: mlp\nbackend: mpi\n", r"backend must be one of"),
        (
            "trainer: mlp\nworld_size: 0\n",
            r"mine.yaml: world_size must be a whole number >= 1, got 0",
        ),
        ("trainer: mlp\nmeasure: {window: 3}\n", r"measure: unknown key 'window'"),
        ("trainer: mlp\nobjective: latency\n", r"objective must be one of"),
        ("trainer: mlp\ndrift_tolerance: 0\n", r"drift_tolerance must be a relative difference"),
        ("trainer: mlp\nallow_drift: maybe\n", r"allow_drift must be true or false"),
    ],
)
def test_bad_study_definitions(tmp_path, text, message):
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        StudyDefinition.load(str(path))


def test_unknown_study_name_lists_the_builtin_ones():
    with pytest.raises(ConfigError, match=r"unknown study definition 'nope'.*default"):
        StudyDefinition.load("nope")


def test_builtin_trainer_meets_the_contract():
    wl = load_workload("mlp", {"width": 32, "layers": 2, "global_batch": 8})
    model = wl.model()
    x, y = wl.dataset[3]
    assert wl.loss(model(x[None]), y[None]).ndim == 0
    assert wl.global_batch == 8
    assert (wl.dataset[3][0] == x).all()  # data is a function of the index


def _write_module(tmp_path, monkeypatch, body):
    (tmp_path / "user_trainer.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("user_trainer", None)


@pytest.mark.parametrize(
    "body, ref, message",
    [
        ("x = 1\n", "user_trainer:build", r"has no function 'build'"),
        (
            "def build():\n    return 3\n",
            "user_trainer:build",
            r"returned int, expected autotune.Workload",
        ),
        (
            "from autotune import Workload\n"
            "def build():\n"
            "    return Workload(model=1, dataset=[], loss=len, optimizer=len, global_batch=4)\n",
            "user_trainer:build",
            r"Workload.model must be callable",
        ),
        (
            "from autotune import Workload\n"
            "def build():\n"
            "    return Workload(model=len, dataset=[], loss=len, optimizer=len, global_batch=0)\n",
            "user_trainer:build",
            r"global_batch must be a positive integer",
        ),
        ("x = 1\n", "no_such_module:build", r"cannot import no_such_module"),
    ],
)
def test_a_trainer_that_breaks_the_contract_is_named(tmp_path, monkeypatch, body, ref, message):
    _write_module(tmp_path, monkeypatch, body)
    with pytest.raises(ConfigError, match=message):
        load_workload(ref)


def test_unknown_builtin_trainer_lists_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown trainer 'resnet'.*mlp"):
        load_workload("resnet")


def test_trainer_options_are_checked_against_the_function():
    with pytest.raises(ConfigError, match=r"refused its options"):
        load_workload("mlp", {"depth": 3})
    assert isinstance(load_workload("mlp", {"width": 16}), Workload)
