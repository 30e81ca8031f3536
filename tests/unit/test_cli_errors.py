"""Bad input: a one-line error naming the thing and the fix, exit code 2, nothing written.

Each case runs in this process through ``autotune.cli.main.main(argv)`` (``tests.conftest.
in_process``: starting Ray there fails the test); a few run through the installed console script
as well, which proves that the real entry point gives the same line and exit code."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from tests.conftest import Ran, console_script


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


CASES = {
    "unknown space": (lambda t: ["--space", "nope"], r"--space: unknown search space 'nope'"),
    "unknown key in a space": (
        lambda t: [
            "--space",
            write(t, "s.yaml", "ddp:\n  bucket_cap_mb: {type: float, low: 1, high: 9, lg: true}\n"),
        ],
        r"ddp.bucket_cap_mb: unknown key 'lg'",
    ),
    "low > high": (
        lambda t: [
            "--space",
            write(t, "s.yaml", "ddp:\n  bucket_cap_mb: {type: float, low: 90, high: 9}\n"),
        ],
        r"low.*high.*90",
    ),
    "unknown trainer": (lambda t: ["--trainer", "resnet"], r"--trainer: unknown trainer 'resnet'"),
    "unparseable budget": (lambda t: ["--budget", "two hours"], r"--budget: cannot read"),
    "unreachable Ray address": (
        lambda t: ["--address", f"127.0.0.1:{closed_port()}"],
        r"--address .*nothing answers",
    ),
    "Ray address that is no address": (
        lambda t: ["--address", "cluster"],
        r"expected auto or HOST:PORT",
    ),
    "Ray Client address": (
        lambda t: ["--address", "ray://10.0.0.1:10001"],
        r"--address ray://10.0.0.1:10001: Ray Client is not supported .*GCS address "
        r"\(--address 10.0.0.1:6379\) or --address auto",
    ),
    "dashboard address": (
        lambda t: ["--address", "http://10.0.0.1:8265"],
        r"--address http://10.0.0.1:8265: that is the Ray dashboard's address .*GCS address "
        r"\(--address 10.0.0.1:6379\).*ray job submit --address http://10.0.0.1:8265 --",
    ),
    "storage in a missing directory": (
        lambda t: ["--storage", f"sqlite:///{t}/missing/x.db"],
        r"--storage .*does not exist",
    ),
    "storage that is no URL": (
        lambda t: ["--storage", "not a url"],
        r"--storage not a url: not a database URL",
    ),
    "storage whose server cannot be reached": (
        lambda t: ["--storage", f"postgresql://u@127.0.0.1:{closed_port()}/db"],
        r"--storage .*cannot open it",
    ),
    "storage whose driver is not installed": (
        lambda t: ["--storage", f"mysql://u@127.0.0.1:{closed_port()}/db"],
        r"--storage mysql://.*: its database driver is not installed \(No module named "
        r"'MySQLdb'\); pip install the module named",
    ),
    "unknown study": (lambda t: ["--study", "nope"], r"--study: unknown study definition"),
    "unknown sampler": (
        lambda t: ["--sampler", "bayes"],
        r"--sampler: must be one of tpe, gp, random, cmaes, grid, got 'bayes'",
    ),
    "trainer option without a value": (lambda t: ["--trainer-option", "width"], r"KEY=VALUE"),
    "unknown flag": (lambda t: ["--budgett", "5m"], r"unrecognized arguments"),
    "no concurrent trials": (
        lambda t: ["--concurrent-trials", "0"],
        r"--concurrent-trials: must be a whole number >= 1, got 0",
    ),
    "unknown placement": (
        lambda t: ["--placement", "scatter"],
        r"--placement: must be one of pack, spread, strict_pack, strict_spread, got 'scatter'",
    ),
    "unknown placement in a study": (
        lambda t: ["--study", write(t, "s.yaml", "trainer: mlp\nplacement: scatter\n")],
        r"placement must be one of pack, spread, strict_pack, strict_spread, got 'scatter'",
    ),
}


def check_bad_input(case: str, ran: Ran, tmp_path: Path, before: set[Path]) -> None:
    message = CASES[case][1]
    assert ran.returncode == 2, ran.stderr
    lines = [line for line in ran.stderr.splitlines() if line.startswith("autotune")]
    assert len(lines) == 1 and lines[0].startswith("autotune: error: ")
    assert "Traceback" not in ran.stderr
    assert re.search(message, lines[0]), lines[0]
    assert not (tmp_path / "home").exists()  # no run directory, no database
    assert set(tmp_path.rglob("*")) == before


def run_args(case: str, tmp_path: Path) -> list[str]:
    return ["run", "--study", "quick", "--budget", "30s", *CASES[case][0](tmp_path)]


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, tmp_path, cli):
    args = run_args(case, tmp_path)
    before = set(tmp_path.rglob("*"))
    check_bad_input(case, cli(*args), tmp_path, before)


#: Cases also run through the installed console script: an argparse usage error, a setting's
#: own check, and a file the command reads.
CONSOLE_CASES = ["unknown flag", "unknown sampler", "unknown key in a space"]


@pytest.mark.parametrize("case", CONSOLE_CASES)
def test_the_console_script_gives_the_same_line_and_exit_code(case, tmp_path):
    args = run_args(case, tmp_path)
    before = set(tmp_path.rglob("*"))
    ran = console_script(*args, env={"AUTOTUNE_HOME": str(tmp_path / "home")})
    check_bad_input(case, ran, tmp_path, before)


def test_export_of_a_missing_study_is_a_one_line_error(tmp_path, cli):
    p = cli("export", "--study-name", "nope")
    assert p.returncode == 2 and "no such database" in p.stderr
    assert not (tmp_path / "home").exists()


def test_ray_address_joins_like_the_flag_and_the_flag_wins(tmp_path, cli):
    closed = f"127.0.0.1:{closed_port()}"
    args = ("run", "--study", "quick", "--budget", "30s")
    # what Ray's tools set is read: nothing answers there, and the error names the variable
    p = cli(*args, env={"RAY_ADDRESS": closed})
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.startswith(f"autotune: error: RAY_ADDRESS={closed}: nothing answers")
    assert "unset RAY_ADDRESS" in p.stderr and p.stderr.count("\n") == 1
    # the jobs CLI's dashboard URL is not a cluster to join: the error says the form to use
    p = cli(*args, env={"RAY_ADDRESS": "http://127.0.0.1:8265"})
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert "RAY_ADDRESS=http://127.0.0.1:8265: that is the Ray dashboard's address" in p.stderr
    assert "(RAY_ADDRESS=127.0.0.1:6379)" in p.stderr
    # --address wins over RAY_ADDRESS
    p = cli(*args, "--address", closed, env={"RAY_ADDRESS": "http://127.0.0.1:8265"})
    assert p.returncode == 2 and f"--address {closed}: nothing answers" in p.stderr
    assert not (tmp_path / "home").exists()


def test_version_names_the_release_its_distribution_and_its_dependencies(tmp_path, cli):
    import tomllib

    import autotune
    from tests.conftest import REPO

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    # the import package and command are autotune; the distribution may not collide with the
    # unrelated `autotune` on the public index, and every install hint names it
    assert project["name"] == autotune.DISTRIBUTION != "autotune"
    assert project["version"] == autotune.__version__
    # through the installed console script: the entry point and the installed metadata
    p = console_script("--version")
    assert p.returncode == 0
    assert re.fullmatch(
        rf"autotune {re.escape(autotune.__version__)} \(ddp-autotune; torch \S+, optuna \S+, "
        r"ray \S+\)\n",
        p.stdout,
    ), p.stdout
    top = cli("--help")
    assert top.returncode == 0
    assert "measured against PyTorch's defaults" in " ".join(top.stdout.split())
    # a PostgreSQL driver that is not installed (pg8000): the hint installs this distribution
    hint = cli("run", "--storage", "postgresql+pg8000://u@127.0.0.1:1/db").stderr
    assert "pip install 'ddp-autotune[postgres]'" in hint, hint
