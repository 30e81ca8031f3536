"""A stored study checked before anything runs.

Resuming a study (someone's ``.db``, a shared PostgreSQL study) runs what it holds: the trials
queued in it, and - for re-validation, ablation and the limit probe - the configurations its
trials stored. ``check_studies`` reads every study of a storage that the run may resume and
refuses, in one line naming the study, the trial and the key, any trial whose stored
configuration fails the one check of a configuration (``TrialConfig.check``) or whose
parameters (queued ones included) name something that is not a knob or a value its knob's rule
refuses. It writes nothing: a SQLite file that is not there is not created, Optuna's tables are
not created where they are missing.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import optuna

from autotune.core.errors import ConfigError
from autotune.core.knobs import KNOBS
from autotune.core.values import shown
from autotune.record import storage as storage_mod
from autotune.record import trial as tr

__all__ = ["check_studies", "check_study"]

#: What a user does about a study that fails the check.
FIX = "autotune never stores this; do not resume it (choose another --study-name or --storage)"
#: Optuna's system attribute holding an enqueued trial's parameters.
_FIXED = "fixed_params"


def check_studies(url: str, *, name: str | None, prefix: str) -> None:
    """Check the studies in ``url`` a run may resume (see the module doc): the one called
    ``name`` (``--study-name``), else those whose name starts with ``prefix`` (a default study
    name, whose backend and world size are known only once Ray is up). A storage that cannot be
    read as Optuna's is left to the run to report."""
    if url.startswith("sqlite"):
        from sqlalchemy.engine import make_url

        db = make_url(url).database
        if not db or not Path(db).is_file():
            return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            storage = optuna.storages.RDBStorage(url, skip_table_creation=True)
            names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    except Exception:  # not an Optuna storage (yet): the run's own checks say what it is
        return
    for found in names:
        if found == name or (name is None and found.startswith(prefix)):
            check_study(optuna.load_study(study_name=found, storage=storage), url)


def check_study(study: optuna.Study, url: str = "") -> None:
    """Every trial of ``study``: its stored configuration and its parameters."""
    shown = f" in {storage_mod.display_url(url)}" if url else ""
    for t in study.get_trials(deepcopy=False):
        where = f"study {study.study_name!r}{shown} trial {t.number}"
        if tr.config_dict(t) is not None:
            tr.config(t, where=where, fix=FIX)
        params: dict[str, Any] = dict(t.params)
        fixed = t.system_attrs.get(_FIXED)
        if isinstance(fixed, dict):
            params.update(fixed)
        for name, value in params.items():
            _check_param(name, value, where)


def _check_param(name: Any, value: Any, where: str) -> None:
    knob = KNOBS.get(name) if isinstance(name, str) else None
    if knob is None:
        raise ConfigError(f"{where}: parameter {shown(str(name))} is not a knob; {FIX}")
    if (why := knob.legal(value)) is not None:
        raise ConfigError(f"{where}: parameter {name} {why}, got {shown(value)}; {FIX}")
