"""The private Optuna and Ray surface autotune relies on (``autotune._compat``): these tests
fail loudly when an upgrade moves it, before a run misbehaves quietly."""

from __future__ import annotations

import inspect

import optuna
from optuna.samplers._tpe import sampler as tpe_sampler

from autotune import _compat
from autotune._compat import STUDY_TRIALS_METHOD, bootstrap_address, call_study_trials


def test_the_study_method_samplers_read_trials_through_is_still_there():
    method = getattr(optuna.Study, STUDY_TRIALS_METHOD)
    assert set(inspect.signature(method).parameters) >= {"deepcopy", "states", "use_cache"}
    # TPE reads trials through that method: a view that answers it decides what TPE sees
    assert f".{STUDY_TRIALS_METHOD}(" in inspect.getsource(tpe_sampler)


def test_call_study_trials_reads_the_trials():
    study = optuna.create_study()
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    got = call_study_trials(study, deepcopy=False, states=None, use_cache=False)
    assert [t.number for t in got] == [0, 1, 2]


def test_ray_bootstrap_lookup_is_still_there(monkeypatch):
    import ray._private.services as services

    assert callable(services.canonicalize_bootstrap_address)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6380")
    assert bootstrap_address("auto").endswith(":6380")  # Ray names loopback by the node's IP


def test_no_other_module_touches_private_optuna_or_ray_api():
    from pathlib import Path

    package = Path(_compat.__file__).parent
    offenders = []
    for path in sorted(package.glob("*.py")):
        if path.name == "_compat.py":
            continue
        text = path.read_text()
        for needle in (
            "ray._private",
            "._storage",
            "._get_trials",
            "optuna._",
            "._study_id",
            "._trial_id",
        ):
            if needle in text:
                offenders.append(f"{path.name}: {needle}")
    assert offenders == []
