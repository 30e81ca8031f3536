"""``autotune compare`` with real processes: the script-mode example, as written,
compared as it is against a profile through the installed console script, from a fresh
directory; each run's rank 0 records the environment the command started with (before the
script loads its profile) and the profile it was handed. And Ctrl-C / SIGTERM while a run is
going: the exit code, and no process of the command left."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autotune.core import allocator
from tests.conftest import AUTOTUNE, REPO, wait_for
from tests.integration.test_script_mode import running_in
from tests.unit.test_compare_cmd import write_profile

pytestmark = pytest.mark.integration

BIN = str(Path(sys.executable).parent)  # the activated virtualenv's: torchrun is there

#: Put before the example script: rank 0 appends what its process was started with (and the
#: text of the profile AUTOTUNE_PROFILE names) to $ENV_LOG, before autotune is imported.
RECORD = """\
import json as _json, os as _os
if _os.environ.get("RANK") == "0":
    _seen = {"env": dict(_os.environ), "profile": None}
    if _os.environ.get("AUTOTUNE_PROFILE"):
        _seen["profile"] = open(_os.environ["AUTOTUNE_PROFILE"]).read()
    with open(_os.environ["ENV_LOG"], "a") as _f:
        _f.write(_json.dumps(_seen) + "\\n")
"""


def example_script() -> str:
    """The complete example the README's *Tune the script you already have* points to."""
    page = (REPO / "docs" / "script-mode.md").read_text()
    return re.search(r"```python\n(.*?)```", page.split("## A complete example", 1)[1], re.S)[1]


def compare_cmd(*args: str) -> list[str]:
    return [
        AUTOTUNE,
        "compare",
        "--study",
        "quick",
        *args,
        "--",
        "torchrun",
        "--nproc-per-node",
        "2",
        "train.py",
        "--lr",
        "3e-4",
    ]


@pytest.fixture
def job(run_env, tmp_path):
    """A fresh directory with the example script (recording) and ``best.yaml``, a profile of
    the defaults with ``gradient_as_bucket_view``; the environment to run it in, no allocator
    variables of its own, one variable of the user's (``USERS_OWN``)."""
    (tmp_path / "train.py").write_text(RECORD + example_script())
    write_profile(tmp_path / "best.yaml", global_batch=128, gradient_as_bucket_view=True)
    env = {k: v for k, v in run_env.items() if not k.startswith("MALLOC_")}
    env.update(
        PATH=BIN + os.pathsep + env.get("PATH", ""),
        ENV_LOG=str(tmp_path / "env.log"),
        USERS_OWN="kept",
    )
    return tmp_path, env


def test_compare_asis_and_a_profile_on_the_example_script(job):
    where, env = job
    p = subprocess.run(
        compare_cmd("--rounds", "2", "-o", "result.json", "asis", "best.yaml"),
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    runs = re.findall(
        r"^run (\d)/4  round (\d)  ([AB]) (\S+) +[\d.]+ samples/s \[[\d.]+, [\d.]+\]",
        p.stdout,
        re.M,
    )
    # interleaved, each round one run of each side
    assert runs == [
        ("1", "1", "A", "asis"),
        ("2", "1", "B", "best.yaml"),
        ("3", "2", "B", "best.yaml"),
        ("4", "2", "A", "asis"),
    ], p.stdout
    lines = p.stdout.strip().splitlines()
    m = re.fullmatch(
        r"B/A  ([\d.]+)x \[([\d.]+), ([\d.]+)\] \(95 % interval, 2 paired rounds\)", lines[-2]
    )
    assert m, p.stdout
    point, low, high = map(float, m.groups())
    assert low <= point <= high
    # the verdict says the same interval to two decimals (rounded from the unrounded values,
    # so compared within 0.01 of the line above), and which side is faster by it
    said = re.fullmatch(
        r"(B is faster|B is slower|no difference beyond the noise): "
        r"B/A ([\d.]+)x \[([\d.]+), ([\d.]+)\]",
        lines[-1],
    )
    assert said, lines[-1]
    for shown, exact in zip(map(float, said.group(2, 3, 4)), (point, low, high), strict=True):
        assert abs(shown - exact) <= 0.01
    kind = "faster" if low > 1 else "slower" if high < 1 else "neither"
    if said.group(1).startswith("no difference"):
        assert kind == "neither" or abs(low - 1) < 1e-3 or abs(high - 1) < 1e-3
    else:
        assert kind == said.group(1).removeprefix("B is ")
    result = json.loads((where / "result.json").read_text())
    assert result["ratio"]["b_over_a"]["median"] == pytest.approx(point, abs=5e-4)
    assert [r["arm"] for r in result["runs"]] == ["A", "B", "B", "A"]
    check_what_each_side_got(where / "env.log")
    assert not running_in(where)


def check_what_each_side_got(log: Path) -> None:
    """Two runs of each side; ``asis``: nothing of autotune's in the environment, PyTorch's
    defaults (no environment) in the profile it is handed; the profile's side: its pin in the
    environment and its own settings."""
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    profiles = [yaml.safe_load(s["profile"]) for s in seen]
    views = [p["ddp"]["gradient_as_bucket_view"] for p in profiles]
    assert views == [False, True, True, False]  # the runs' order: A B B A
    for s, p, view in zip(seen, profiles, views, strict=True):
        env = s["env"]
        assert env["USERS_OWN"] == "kept"  # the user's own environment, on both sides
        assert p["batch"]["global_batch"] == 128  # both sides run the same job
        if view:  # the profile: as under autotune launch
            assert {k: env.get(k) for k in allocator.ENV} == allocator.ENV
            assert p["env"] == yaml.safe_load((log.parent / "best.yaml").read_text())["env"]
        else:  # as it is
            assert not [k for k in env if k.startswith(("MALLOC_", "NCCL_"))], env
            assert p["env"] == {} and p["precision"] == "fp32"
            assert p["batch"] == {"micro_batch": 64, "accumulation_steps": 1, "global_batch": 128}
            assert p["ddp"]["comm_hook"] == {"name": "none"}


@pytest.mark.parametrize(
    ("sig", "code", "said"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
)
def test_a_signal_during_a_run_ends_the_command_and_exits(job, sig, code, said):
    where, env = job
    p = subprocess.Popen(
        compare_cmd("asis", "best.yaml"),
        cwd=where,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal's
    )
    try:
        assert wait_for(lambda: (where / "env.log").exists(), 120)  # the first run's rank 0 is up
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == code, out + err
    assert err.strip().splitlines()[-1] == f"autotune: {said}" + (" (SIGTERM)" * (code == 143))
    assert "B/A" not in out
    assert wait_for(lambda: not running_in(where), 10), running_in(where)


def test_a_run_that_fails_stops_the_comparison_with_its_reason(run_env, tmp_path):
    # a command that exits at once (the world size read from its words, as from torchrun's)
    crash = [
        sys.executable,
        "-c",
        "import sys; print('no data here'); sys.exit(3)",
        "--nproc-per-node",
        "2",
    ]
    p = subprocess.run(
        [AUTOTUNE, "compare", "--global-batch", "64", "-o", "r.yaml", "asis", "asis", "--", *crash],
        cwd=tmp_path,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 1, p.stdout + p.stderr
    (line,) = [x for x in p.stdout.splitlines() if x.startswith("run ")]  # no second run
    assert line.startswith(
        "run 1/8  round 1  A asis  failed: crash: the command exited with "
        "status 3 before it was measured"
    )
    assert line.endswith(": no data here") and "B/A" not in p.stdout
    assert p.stderr.strip().splitlines()[-1].startswith("autotune: compare: A failed in round 1")
    result = yaml.safe_load((tmp_path / "r.yaml").read_text())
    assert "ratio" not in result and result["runs"][0]["failure"].startswith("crash: ")
