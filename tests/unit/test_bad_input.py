"""Hostile and broken input across every subcommand, typed as a user types it, from a fresh
directory: one line on stderr naming the thing, exit code 2, no traceback, nothing written, no
Ray started. Each case runs in this process through ``autotune.cli.main.main(argv)``
(``tests.conftest.in_process``, where starting Ray, exec'ing a command or serving the dashboard
fails the test); a few run through the installed ``autotune`` console script too, where Ray's
temp directory follows ``TMPDIR``, which points into the case's own directory."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import optuna
import pytest

from tests.conftest import console_script, in_process
from tests.unit.test_report_and_progress import one_study

UNWRITABLE = "/proc/sys"  # a read-only file system here, even for root


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends


#: Files a case may name, written into its directory before it runs (their names only).
FILES = {
    "bad_import.py": "raise RuntimeError('this module refuses to import')\n",
    "bad_syntax.py": "def workload(:\n    pass\n",
    "bad_fn.py": "def workload():\n    raise ValueError('no workload today')\n",
    "not_fn.py": "workload = 3\n",
    "inf_space.yaml": "ddp:\n  bucket_cap_mb: {type: float, low: 1, high: .inf}\n",
    "nccl_space.yaml": "nccl:\n  NCCL_ALGO: {type: categorical, choices: [default, Ring]}\n",
    "hook_space.yaml": "ddp:\n  comm_hook: {type: categorical, choices: [none, bf16, powersgd]}\n",
    "typo_study.yaml": "trainer: mlp\nbudgte: 1m\n",
    "zero_world.yaml": "trainer: mlp\nworld_size: 0\n",
    "a_file": "not a directory\n",
    "not_yaml.yaml": "version: [1\n",
    "a_list.yaml": "- 1\n- 2\n",
    "hostile_env.yaml": None,  # the exported profile with a hostile env name (see fixture)
    "good.yaml": None,  # the exported profile
    "study.db": None,  # a real autotune study (see fixture)
}

# (arguments, what the one line must contain). Arguments may use {db} (the study's URL),
# {port} (a closed port) and {unwritable}.
CASES: dict[str, tuple[list[str], str]] = {
    # run: durations, sizes and numbers
    "run budget inf": (["run", "--budget", "inf"], "--budget"),
    "run budget negative": (["run", "--budget=-5m"], "--budget"),
    "run budget zero": (["run", "--budget", "0s"], "--budget"),
    "run trial timeout inf": (["run", "--trial-timeout", "inf"], "--trial-timeout"),
    "run trial timeout zero": (["run", "--trial-timeout", "0"], "--trial-timeout"),
    "run max memory inf": (["run", "--max-memory", "inf"], "--max-memory"),
    "run world size zero": (["run", "--world-size", "0"], "--world-size"),
    # script mode (autotune run ... -- CMD)
    "run script no such command": (
        ["run", "--global-batch", "64", "--", "no-such-cmd-xyz"],
        "no such command",
    ),
    "run script no global batch": (["run", "--", "python3", "train.py"], "--global-batch"),
    "run script two nodes": (
        [
            "run",
            "--global-batch",
            "64",
            "--",
            "python3",
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--node-rank",
            "0",
            "t.py",
        ],
        "--node-rank: on 2 nodes autotune sets torchrun's rendezvous",
    ),
    "run global batch without script": (["run", "--global-batch", "64"], "script mode"),
    "run words before the command": (["run", "torchrun", "train.py"], "after --"),
    "run world size word": (["run", "--world-size", "two"], "--world-size"),
    "run concurrent trials zero": (["run", "--concurrent-trials", "0"], "--concurrent-trials"),
    "run one validation round": (["run", "--validate-rounds", "1"], "--validate-rounds"),
    "run unknown placement": (["run", "--placement", "diagonal"], "--placement"),
    "run unknown flag": (["run", "--no-such-flag"], "--no-such-flag"),
    # run: the trainer
    "trainer without module": (["run", "--trainer", ":workload"], "--trainer"),
    "trainer without function": (["run", "--trainer", "my_model:"], "--trainer"),
    "trainer not a name": (["run", "--trainer", "a b:c"], "--trainer"),
    "trainer module missing": (["run", "--trainer", "no_such_module:workload"], "cannot import"),
    "trainer module raises": (["run", "--trainer", "bad_import:workload"], "RuntimeError"),
    "trainer syntax error": (["run", "--trainer", "bad_syntax:workload"], "SyntaxError"),
    "trainer function raises": (["run", "--trainer", "bad_fn:workload"], "no workload today"),
    "trainer not a function": (["run", "--trainer", "not_fn:workload"], "no function"),
    "trainer option without =": (["run", "--trainer-option", "width"], "--trainer-option"),
    "trainer option without key": (["run", "--trainer-option", "=1"], "--trainer-option"),
    "trainer option bad YAML": (["run", "--trainer-option", "width=[1"], "--trainer-option"),
    # run: files and names
    "space with infinite bound": (["run", "--space", "inf_space.yaml"], "finite"),
    # a space of which nothing acts on the backend: refused before Ray starts, not after
    "space of NCCL variables on gloo": (
        ["run", "--backend", "gloo", "--space", "nccl_space.yaml"],
        "nothing left to tune on gloo/cpu; left out: NCCL_ALGO",
    ),
    "space of hooks gloo cannot run": (
        ["run", "--backend", "gloo", "--space", "hook_space.yaml"],
        "nothing left to tune on gloo/cpu",
    ),
    "study file with a typo": (["run", "--study", "typo_study.yaml"], "budgte"),
    "study file world size zero": (["run", "--study", "zero_world.yaml"], "world_size"),
    "study name with ..": (["run", "--study-name", "../../x"], "--study-name"),
    "study name with slash": (["run", "--study-name", "a/b"], "--study-name"),
    "run dir is a file": (["run", "--run-dir", "a_file"], "--run-dir"),
    "run dir unwritable": (["run", "--run-dir", "{unwritable}/autotune"], "--run-dir"),
    "profile is a directory": (["run", "-o", "."], "--output"),
    "profile under a file": (["run", "--output", "a_file/p.yaml"], "--output"),
    "profile unwritable": (["run", "-o", "{unwritable}/p.yaml"], "--output"),
    "storage over http": (["run", "--storage", "http://127.0.0.1:{port}/db"], "--storage"),
    "storage password hidden": (
        ["run", "--storage", "postgresql://bob:s3cret@127.0.0.1:{port}/db"],
        "bob:***@",
    ),
    # export, report
    "export without a database": (["export", "--study-name", "x"], "--storage"),
    "export of a missing study": (["export", "--storage", "{db}", "--study-name", "y"], "no such"),
    "export to an unwritable file": (
        ["export", "--storage", "{db}", "--study-name", "s", "-o", "{unwritable}/p.yaml"],
        "--output",
    ),
    "export of a missing trial": (
        ["export", "--storage", "{db}", "--study-name", "s", "--trial", "99"],
        "--trial 99",
    ),
    "report to a file": (["report", "--storage", "{db}", "-o", "a_file"], "--output"),
    "report of a missing study": (["report", "--storage", "{db}", "--study-name", "y"], "no such"),
    # env, launch
    "env of a missing profile": (["env", "missing.yaml"], "missing.yaml"),
    "env of a broken YAML": (["env", "not_yaml.yaml"], "not_yaml.yaml"),
    "env of a list": (["env", "a_list.yaml"], "a_list.yaml"),
    "env of a hostile name": (["env", "hostile_env.yaml"], "env"),
    "launch without a command": (["launch", "good.yaml"], "no command"),
    "launch of a missing command": (["launch", "good.yaml", "--", "no-such-cmd-xyz"], "no-such"),
    "launch of a hostile profile": (["launch", "hostile_env.yaml", "--", "true"], "env"),
    # dashboard
    "dashboard without a database": (["dashboard", "--storage", "sqlite:///no.db"], "--storage"),
    "dashboard port out of range": (
        ["dashboard", "--storage", "{db}", "--port", "70000"],
        "--port",
    ),
    "dashboard on every interface": (
        ["dashboard", "--storage", "{db}", "--host", "0.0.0.0"],
        "--host",
    ),
    # lab, top level
    "lab with no nodes": (["lab", "up", "--nodes", "0"], "--nodes"),
    "lab with a rate in words": (["lab", "up", "--rate", "fast"], "--rate"),
    "lab exec without a command": (["lab", "exec"], "lab"),
    "unknown subcommand": (["frobnicate"], "frobnicate"),
}

if not __import__("torch").cuda.is_available():  # on a GPU machine nccl runs
    CASES["run nccl on a machine without a GPU"] = (
        ["run", "--backend", "nccl"],
        "--backend nccl: this machine has no GPU (torch sees none); use --backend gloo",
    )


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    """A real SQLite autotune study (name ``s``), its exported profile, and that profile with
    a hostile env name."""
    d = tmp_path_factory.mktemp("seeds")
    url = one_study(d / "study.db", "s")
    exported = in_process("export", "--storage", url, "--study-name", "s", cwd=d)
    assert exported.returncode == 0, exported.stderr
    good = exported.stdout
    (d / "good.yaml").write_text(good)
    (d / "hostile_env.yaml").write_text(
        good.replace("env:\n", "env:\n  'X;touch pwned;Y': '1'\n", 1)
    )
    return d


def run_case(name: str, root: Path, seeds: Path, run=in_process) -> dict:
    """Case ``name`` in a fresh directory of its own under ``root``, by ``run`` (``in_process``
    or ``console_script``): what it printed and what it left there."""
    args, _ = CASES[name]
    case = root / name.replace(" ", "_")
    case.mkdir()
    for f, text in FILES.items():
        if text is None:
            shutil.copy(seeds / f, case / f)
        else:
            (case / f).write_text(text)
    subst = {
        "db": f"sqlite:///{case / 'study.db'}",
        "port": closed_port(),
        "unwritable": UNWRITABLE,
    }
    argv = [a.format(**subst) for a in args]
    env = {"AUTOTUNE_HOME": str(case / "home"), "TMPDIR": str(case / "tmp")}
    (case / "tmp").mkdir()
    before = sorted(p.relative_to(case) for p in case.rglob("*"))
    stamps = {p: p.stat().st_mtime_ns for p in case.rglob("*") if p.is_file()}
    p = run(*argv, cwd=case, env=env)
    after = sorted(p_.relative_to(case) for p_ in case.rglob("*"))
    changed = [str(f.relative_to(case)) for f, t in stamps.items() if f.stat().st_mtime_ns != t]
    return {"p": p, "new": [str(x) for x in after if x not in before], "changed": changed}


def test_there_are_at_least_40_cases_over_every_subcommand():
    assert len(CASES) >= 40
    used = {args[0] for args, _ in CASES.values() if args}
    assert used >= {"run", "export", "report", "env", "launch", "dashboard", "lab"}


def check_case(name: str, r: dict) -> None:
    if name.endswith("unwritable") and os.access(UNWRITABLE, os.W_OK):
        pytest.skip(f"{UNWRITABLE} is writable on this machine")
    p = r["p"]
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, p.stdout + p.stderr
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert CASES[name][1] in lines[0], lines[0]
    assert "s3cret" not in p.stdout + p.stderr
    assert p.stdout == ""
    assert r["new"] == [] and r["changed"] == []  # nothing written: no home, no Ray temp dir


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_exit_2_nothing_written(name, seeds, tmp_path):
    check_case(name, run_case(name, tmp_path, seeds))


#: Cases also run through the installed console script, in a process of its own: a usage
#: error, a user's trainer module imported from the directory the command runs in (which the
#: console script does not put on ``sys.path`` itself), a hostile profile.
CONSOLE_CASES = ["unknown subcommand", "trainer module raises", "env of a hostile name"]


@pytest.mark.parametrize("name", CONSOLE_CASES)
def test_the_console_script_gives_the_same_answer(name, seeds, tmp_path):
    check_case(name, run_case(name, tmp_path, seeds, run=console_script))


def test_a_hostile_study_name_from_a_shared_database_stays_inside_the_run_directory(
    seeds, tmp_path
):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    shutil.copy(seeds / "study.db", tmp_path / "shared.db")
    optuna.copy_study(
        from_study_name="s", from_storage=url, to_storage=url, to_study_name="../../x"
    )
    run_dir = tmp_path / "a" / "b" / "run"
    p = in_process(
        "report",
        "--storage",
        url,
        "--study-name",
        "../../x",
        "--run-dir",
        str(run_dir),
        cwd=tmp_path,
        env={"TMPDIR": str(tmp_path)},
    )
    assert p.returncode == 0, p.stderr
    written = [Path(line) for line in p.stdout.split()]
    assert written and all(run_dir / "reports" in w.parents for w in written), written
    assert not (tmp_path / "a" / "x").exists() and not (tmp_path / "x").exists()
