"""The private Optuna and Ray surface autotune relies on (``autotune.core.compat``): these tests
fail loudly when an upgrade moves it, before a run misbehaves quietly."""

from __future__ import annotations

import inspect

import optuna
from optuna.samplers._tpe import sampler as tpe_sampler

from autotune.core import compat as _compat
from autotune.core.compat import (
    STUDY_TRIALS_METHOD,
    bootstrap_address,
    call_study_trials,
    loopback_node_ip,
)


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


def test_rays_node_ip_is_loopback_only_inside_loopback_node_ip():
    """A local instance started inside ``loopback_node_ip`` takes 127.0.0.1 as its node IP
    (``tests/integration/test_listeners.py`` checks that everything then listens there)."""
    import ray
    import ray._private.ray_constants as ray_constants
    import ray._private.services as services

    assert isinstance(ray_constants.ENABLE_RAY_CLUSTER, bool)
    assert "ray_constants.ENABLE_RAY_CLUSTER" in inspect.getsource(services.get_node_ip_address)
    if ray.is_initialized():  # a node's IP is then that node's, whatever the flag says
        return
    before = ray_constants.ENABLE_RAY_CLUSTER
    with loopback_node_ip():
        assert ray_constants.ENABLE_RAY_CLUSTER is False
        assert services.get_node_ip_address() == "127.0.0.1"
    assert ray_constants.ENABLE_RAY_CLUSTER is before


def test_rays_own_node_ip_parameter_still_maps_loopback_away():
    """Why ``loopback_node_ip`` exists: ``ray.init(_node_ip_address="127.0.0.1")`` is mapped to
    the machine's outward address; when Ray stops doing that, the private parameter (or a
    public successor) is the simpler way."""
    import ray
    import ray._private.services as services

    assert "resolve_ip_for_localhost(_node_ip_address)" in inspect.getsource(ray.init)
    if not ray.is_initialized():
        with loopback_node_ip():  # where Ray keeps loopback, it keeps it
            assert services.resolve_ip_for_localhost("127.0.0.1") == "127.0.0.1"


def test_no_other_module_touches_private_optuna_or_ray_api():
    from pathlib import Path

    package = Path(_compat.__file__).parent.parent
    offenders = []
    for path in sorted(package.rglob("*.py")):
        if path == Path(_compat.__file__):
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


def test_rays_off_main_thread_warning_comes_from_the_logger_silenced(caplog):
    """The warning ``ray_off_main_thread_quiet`` drops is still logged by that logger, and only
    that line is dropped while it lasts."""
    import inspect
    import logging

    import ray._private.worker as worker

    assert "SIGTERM handler is not set" in inspect.getsource(worker)
    assert worker.logger.name == _compat.RAY_WORKER_LOGGER
    with caplog.at_level(logging.WARNING, logger=_compat.RAY_WORKER_LOGGER):
        with _compat.ray_off_main_thread_quiet():
            worker.logger.warning("SIGTERM handler is not set because current thread is not main")
            worker.logger.warning("another line")
        worker.logger.warning("SIGTERM handler is not set (after)")
    said = [r.getMessage() for r in caplog.records]
    assert said == ["another line", "SIGTERM handler is not set (after)"]


def test_ray_reads_its_auth_mode_again_where_reread_ray_config_asks(monkeypatch):
    """Why ``reread_ray_config`` exists: Ray reads ``RAY_AUTH_MODE`` once, and ``ray.init``
    itself re-reads it the same way where it turns token authentication on by default."""
    import ray._private.authentication.authentication_token_setup as setup
    from ray._raylet import AuthenticationMode, get_authentication_mode

    assert 'Config.initialize("")' in inspect.getsource(setup._enable_token_auth)
    # what this process's environment says now (a Ray connection of the session's integration
    # tests may have read another value while it lasted)
    _compat.reread_ray_config()
    before = get_authentication_mode()
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    try:
        _compat.reread_ray_config()
        assert get_authentication_mode() == AuthenticationMode.TOKEN
    finally:
        monkeypatch.undo()
        _compat.reread_ray_config()
    assert get_authentication_mode() == before
