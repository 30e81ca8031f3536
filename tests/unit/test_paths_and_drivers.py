"""Where autotune writes (checked before anything starts, names made safe) and who runs a trial
(a driver identity two drivers never share)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from autotune.core.errors import ConfigError
from autotune.definition.paths import check_study_name, check_writable, file_stem
from autotune.record.study import DRIVER, driver_alive, driver_identity
from tests.conftest import wait_for


@pytest.mark.parametrize("name", ["../../x", "a/b", ".hidden", "x\0y", "", "a" * 129, "a..b"])
def test_a_new_study_name_that_is_no_file_name_is_refused(name):
    with pytest.raises(ConfigError, match="--study-name"):
        check_study_name(name)


@pytest.mark.parametrize("name", ["../../x", "a/b", "/etc/passwd", ".hidden", "x" * 300, "ü"])
def test_any_study_name_maps_to_a_file_name_inside_its_directory(tmp_path, name):
    stem = file_stem(name)
    assert (tmp_path / f"{stem}.yaml").resolve().parent == tmp_path.resolve()
    assert "/" not in stem and not stem.startswith(".") and len(stem) <= 128
    assert file_stem(name) != file_stem(name + "/")  # two unsafe names never share a file


def test_a_safe_name_is_kept_as_it_is():
    assert file_stem("quick-mlp-gloo-2r") == "quick-mlp-gloo-2r"
    check_study_name("quick-mlp-gloo-2r")


def test_writable_paths_pass_and_create_nothing(tmp_path):
    check_writable(tmp_path / "new" / "dir", flag="--run-dir", directory=True)
    check_writable(tmp_path / "p.yaml", flag="--profile", directory=False)
    assert list(tmp_path.iterdir()) == []


def test_unwritable_paths_name_the_flag(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError, match=r"--run-dir .*exists and is not a directory"):
        check_writable(f, flag="--run-dir", directory=True)
    with pytest.raises(ConfigError, match=r"--profile .*is not a directory"):
        check_writable(f / "p.yaml", flag="--profile", directory=False)
    with pytest.raises(ConfigError, match=r"--profile .*is a directory"):
        check_writable(tmp_path, flag="--profile", directory=False)
    if not os.access("/proc/sys", os.W_OK):
        with pytest.raises(ConfigError, match=r"--output .*not writable"):
            check_writable(Path("/proc/sys/x/y"), flag="--output", directory=True)


def test_this_driver_is_alive_though_its_command_line_has_no_autotune():
    # pytest runs this: a driver started from a user's own Python script counts as alive
    assert driver_identity() == DRIVER and driver_alive(DRIVER) is True


def test_a_dead_driver_and_a_reused_pid_are_dead():
    p = subprocess.Popen(["sleep", "60"])
    who = driver_identity(p.pid)
    assert driver_alive(who) is True
    p.kill()
    p.wait()
    assert driver_alive(who) is False
    host, boot, pid, start = DRIVER.rsplit(":", 3)
    assert driver_alive(f"{host}:{boot}:{pid}:{int(start) + 1}") is False  # same pid, other start


def test_a_driver_elsewhere_is_left_to_the_heartbeat():
    host, boot, pid, start = DRIVER.rsplit(":", 3)
    # same host name, another machine (another boot id): never judged from here
    assert driver_alive(f"{host}:00000000-0000-0000-0000-000000000000:{pid}:{start}") is None
    assert driver_alive(f"another-host:{boot}:{pid}:{start}") is None
    assert driver_alive(f"{host}:{os.getpid()}") is None  # an older autotune's host:pid


CAPTURED_RACE = (
    "(psycopg.errors.UniqueViolation) duplicate key value violates unique constraint "
    '"pg_type_typname_nsp_index"\nDETAIL:  Key (typname, typnamespace)=(studies, 2200) '
    "already exists."
)


def test_a_second_driver_creating_the_same_tables_opens_the_storage_again(monkeypatch, tmp_path):
    import optuna

    from autotune.record import storage

    assert storage.schema_race(RuntimeError(CAPTURED_RACE))
    assert storage.schema_race(RuntimeError('relation "studies" already exists'))
    assert storage.schema_race(  # SQLite's, as CI read it
        RuntimeError("(sqlite3.OperationalError) table studies already exists")
    )
    assert storage.schema_race(
        RuntimeError(
            "(sqlite3.IntegrityError) UNIQUE constraint failed: alembic_version.version_num"
        )
    )
    assert not storage.schema_race(RuntimeError("password authentication failed"))
    real, calls = optuna.storages.RDBStorage, []

    def racing(url, **kwargs):  # the first open loses the race, as in CI
        calls.append(url)
        if len(calls) == 1:
            raise RuntimeError(CAPTURED_RACE)
        return real(url, **kwargs)

    monkeypatch.setattr(optuna.storages, "RDBStorage", racing)
    monkeypatch.setattr(storage.time, "sleep", lambda s: None)
    url = f"sqlite:///{tmp_path / 'race.db'}"
    assert isinstance(storage.open_storage(url), real) and len(calls) == 2
    # any other error is one line, at once
    calls.clear()
    monkeypatch.setattr(optuna.storages, "RDBStorage", lambda url, **kw: 1 / 0)
    with pytest.raises(ConfigError, match="cannot open it as an Optuna storage"):
        storage.open_storage(url)


def test_a_running_trial_without_a_driver_is_closed_once_a_grace_period_old(tmp_path):
    """A driver names itself as its trial's first write; one killed in the milliseconds
    before (after Optuna created the trial, before its first heartbeat) leaves a RUNNING trial
    that Optuna's heartbeat clean-up never fails. A resumed run closes it once it is a grace
    period old, and leaves a young one, a live driver's, and another host's alone; a dead
    driver's is closed at once."""
    from datetime import datetime, timedelta

    import optuna
    from optuna.trial import FrozenTrial, TrialState

    from autotune.record import storage as storage_mod
    from autotune.record.study import close_abandoned_trials

    storage = storage_mod.open_storage(f"sqlite:///{tmp_path}/s.db")
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    study_id = storage.get_study_id_from_name("s")
    dead = subprocess.Popen(["sleep", "60"])
    gone = driver_identity(dead.pid)
    dead.kill()
    dead.wait()
    host, boot, pid, start = DRIVER.rsplit(":", 3)
    old = datetime.now() - timedelta(seconds=storage_mod.GRACE_S + 5)
    young = datetime.now() - timedelta(seconds=storage_mod.GRACE_S - 20)
    for started, driver in [
        (old, None),
        (young, None),
        (old, DRIVER),
        (old, gone),
        (old, f"another-host:{boot}:{pid}:{start}"),
    ]:
        template = FrozenTrial(
            number=0,
            state=TrialState.RUNNING,
            value=None,
            datetime_start=started,
            datetime_complete=None,
            params={},
            distributions={},
            user_attrs={} if driver is None else {"driver": driver},
            system_attrs={},
            intermediate_values={},
            trial_id=0,
        )
        storage.create_new_trial(study_id, template_trial=template)
    assert close_abandoned_trials(study, storage) == [0, 3]
    trials = study.get_trials()
    assert [t.state for t in trials] == [
        TrialState.FAIL,
        TrialState.RUNNING,
        TrialState.RUNNING,
        TrialState.FAIL,
        TrialState.RUNNING,
    ]
    assert trials[0].user_attrs["reason"] == "interrupted"
    assert trials[0].user_attrs["reason_detail"] == (
        "its driver stopped as it took the trial, before recording itself"
    )
    assert trials[3].user_attrs["reason_detail"] == f"its driver ({gone}) stopped during the trial"


#: Opens the storage at argv[1] once the file argv[2] appears (both openers then start
#: together), having imported what opening needs and said so by creating the file argv[3].
_OPENER = """
import os, sys, time
import optuna, sqlalchemy
from autotune.record.storage import open_storage
open(sys.argv[3], "w").close()
while not os.path.exists(sys.argv[2]):
    time.sleep(0.001)
open_storage(sys.argv[1])
"""


def test_two_processes_opening_one_new_database_at_once_both_open_it(tmp_path):
    """The race CI met (1 of 1,161 tests): two openers of a new SQLite file, both creating
    Optuna's tables. Real processes: 12 pairs, each on a new file of its own, all let go at
    once when every one has imported and waits; every opener succeeds."""
    import sys

    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{i}" for i in range(24)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _OPENER,
                f"sqlite:///{tmp_path / f'race-{i // 2}.db'}",
                str(go),
                str(ready[i]),
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(24)
    ]
    # every opener imported and waiting (24 imports on 2 cores), however long that takes
    assert wait_for(lambda: all(r.exists() for r in ready), 120)
    go.touch()
    failures = []
    for p in procs:
        err = p.communicate(timeout=120)[1]
        if p.returncode != 0:
            failures.append(err.strip().splitlines()[-1])
    assert failures == []
