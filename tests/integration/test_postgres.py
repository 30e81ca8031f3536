"""A shared study on a real PostgreSQL server: two `autotune run` drivers, each with its own
Ray instance, work on one study at the same time, as drivers on two machines would.

The server is started by the test itself (initdb + pg_ctl on a free port of 127.0.0.1, a
throw-away data directory); the test skips, saying why, where PostgreSQL's server programs or
the psycopg driver are missing."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.conftest import autotune_cmd
from tests.integration.conftest import as_stored, defaults_before, runs_of_the_defaults
from tests.integration.raycluster import free_port

pytestmark = [pytest.mark.integration, pytest.mark.postgres]


def _bin(name: str) -> str | None:
    found = shutil.which(name) or sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found if isinstance(found, str) else (found[-1] if found else None)


@pytest.fixture(scope="module")
def postgres_url():
    pytest.importorskip("psycopg", reason="psycopg not installed: pip install -e '.[test]'")
    tools = {n: _bin(n) for n in ("initdb", "pg_ctl", "createdb")}
    if not all(tools.values()):
        pytest.skip(
            "PostgreSQL's server programs (initdb, pg_ctl) are not installed; "
            "apt-get install postgresql"
        )
    as_user: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root: run it as the postgres user
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no postgres user to run the server as")
        as_user = ["runuser", "-u", "postgres", "--"]
    root = tempfile.mkdtemp(prefix="atpg")
    data, sock = Path(root) / "data", Path(root) / "sock"
    sock.mkdir()
    if as_user:
        shutil.chown(root, "postgres")
        shutil.chown(sock, "postgres")
    port = free_port()
    ctl = [*as_user, tools["pg_ctl"], "-D", str(data)]
    try:
        initdb = [*as_user, tools["initdb"], "-D", str(data), "-A", "trust", "-U", "autotune", "-N"]
        subprocess.run(initdb, check=True, capture_output=True, timeout=120)
        subprocess.run(
            [
                *ctl,
                "-w",
                "-l",
                f"{root}/server.log",
                "-o",
                f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off",
                "start",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        subprocess.run(
            [tools["createdb"], "-h", "127.0.0.1", "-p", str(port), "-U", "autotune", "autotune"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        yield f"postgresql://autotune@127.0.0.1:{port}/autotune"
    finally:
        subprocess.run([*ctl, "-m", "immediate", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def test_two_drivers_work_on_one_study(postgres_url, run_env, tmp_path):
    # each driver ends after three trials of its own (--n-trials counts a driver's), not at a
    # 30-second budget, which on a loaded machine could end before the second driver's first
    args = (
        "--study",
        "quick",
        "--budget",
        "5m",
        "--n-trials",
        "3",
        "--storage",
        postgres_url,
        "--validate-top",
        "0",
        "--quiet",
    )
    drivers = []
    for i in range(2):
        env = {**run_env, "AUTOTUNE_HOME": str(tmp_path / f"driver{i}")}
        drivers.append(
            subprocess.Popen(
                autotune_cmd("run", *args),
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
        time.sleep(1)
    outs = [p.communicate(timeout=600)[0] for p in drivers]
    for p, out in zip(drivers, outs, strict=True):
        assert p.returncode == 0, out
    study = optuna.load_study(study_name="quick-mlp-gloo-2r", storage=postgres_url)
    trials = study.trials
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    # Both drivers ran trials of the one study.
    by_driver = {t.user_attrs.get("driver") for t in trials if t.user_attrs.get("driver")}
    assert len(by_driver) == 2, [(t.number, t.user_attrs.get("driver")) for t in trials]
    # One baseline for both: the second driver waited for it or joined after it (the other
    # runs of the defaults are re-anchoring runs, marked so).
    first = runs_of_the_defaults(trials)[0]
    assert trials[first].state == TrialState.COMPLETE
    for t in trials:
        if "speedup" in t.user_attrs and not t.user_attrs.get("baseline"):
            # against a run of the defaults measured before it (with two drivers, the latest
            # one done when the trial started)
            ratios = [t.user_attrs["throughput"] / v for v in defaults_before(trials, t.number)]
            assert any(as_stored(r) == t.user_attrs["speedup"] for r in ratios), (t.number, ratios)
    assert "New study quick-mlp-gloo-2r" in "".join(outs)
    assert "Resuming study quick-mlp-gloo-2r" in "".join(outs)
    # Either driver's profile, and a later reader, come from the same study.
    p = subprocess.run(
        autotune_cmd(
            "export",
            "--storage",
            postgres_url,
            "--study-name",
            "quick-mlp-gloo-2r",
            "-o",
            str(tmp_path / "p.yaml"),
        ),
        env=run_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "best_trial" in (tmp_path / "p.yaml").read_text()


def test_a_postgres_url_nothing_answers_at_is_one_line_exit_2(run_env):
    port = free_port()  # nothing listens there
    p = subprocess.run(
        autotune_cmd(
            "run",
            "--study",
            "quick",
            "--storage",
            f"postgresql://autotune@127.0.0.1:{port}/autotune",
        ),
        env=run_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1
    assert p.stderr.startswith(f"autotune: error: --storage postgresql://autotune@127.0.0.1:{port}")
    assert "cannot open it" in p.stderr
