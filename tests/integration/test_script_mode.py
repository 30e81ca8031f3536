"""Script mode (``autotune run ... -- CMD``) with real processes: docs/script-mode.md's example
script tuned through the installed console script and then trained with its profile under
``autotune launch``, exactly as that page spells both commands (a shorter budget and the
quick study's windows added); and ``run_script``'s failures: a script that never wraps its
model, one that crashes, and a driver killed with -9, after which no process of the script
may remain."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from autotune.core.config import MeasureSettings, TrialConfig
from autotune.core.errors import FailureReason, TrialFailed
from autotune.core.target import Target
from autotune.definition.space import SearchSpace
from autotune.script.command import run_script
from tests.conftest import REPO, started_run, wait_for
from tests.integration.conftest import autotune, trial_running
from tests.integration.test_launch_signals import alive

pytestmark = pytest.mark.integration

BIN = str(Path(sys.executable).parent)  # the activated virtualenv's: torchrun is there
TARGET = Target(backend="gloo", device="cpu", world_size=2, global_batch=128, cpus_per_rank=1)


def example() -> tuple[str, list[list[str]]]:
    # the complete example the README's *Tune the script you already have* points to
    section = (REPO / "docs" / "script-mode.md").read_text().split("## A complete example", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    bash = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return code, [line.split() for line in bash.strip().splitlines()]


def test_the_readme_script_is_tuned_and_then_trains_with_its_profile(run_env, tmp_path):
    code, (run_cmd, launch_cmd) = example()
    (tmp_path / "train.py").write_text(code)
    env = {**run_env, "PATH": BIN + os.pathsep + run_env.get("PATH", "")}
    assert run_cmd[:2] == ["autotune", "run"] and "--" in run_cmd
    args = run_cmd[2:]
    # the README says 10m; three trials at most, without re-validation, end it before 90 s
    # (a slow machine took 20 s to its baseline and 12 s to its first measurement: 40 s held
    # no second trial)
    args[args.index("--budget") + 1] = "90s"
    p = autotune(
        env,
        "run",
        "--study",
        "quick",
        "--n-trials",
        "3",
        "--validate-top",
        "0",
        *args,
        cwd=tmp_path,
        timeout=300,
    )
    name = "quick-script-train-gloo-2r"
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path}/home/autotune.db")
    measured = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert study.trials[0].state == TrialState.COMPLETE and len(measured) >= 2, p.stdout
    base = study.trials[0].user_attrs
    assert base["throughput"] > 0 and len(base["windows"]) >= 2 and base["loss"] > 0
    assert all(t.user_attrs["config"]["global_batch"] == 128 for t in measured)
    # the first measurement, from the script's own steps timed by wrap(): DDP's gradients are
    # the model's 394,753 fp32 parameters, the link fitted at several sizes, and the phases fit
    # in the measured step; the screening was ordered by it
    first = study.user_attrs["first_measurement"]["probe"]
    assert first["source"] == "script" and first["trial"] == 0
    assert first["comm"]["wire_bytes"] == 4 * 394_753 and first["comm"]["buckets"] >= 1
    assert len(set(first["comm"]["fit_bytes"])) >= 2 and min(first["comm"]["fit_s"]) > 0
    ddp = first["ddp"]
    phases = ddp["forward"] + ddp["backward"] + ddp["optimizer"] + ddp["data"]
    assert 0 < ddp["forward"] < ddp["step"] and phases == pytest.approx(ddp["step"], rel=0.01)
    assert "Screening order from the first measurement:" in p.stdout
    profile = tmp_path / "home" / "profiles" / f"{name}.yaml"
    assert yaml.safe_load(profile.read_text())["batch"]["global_batch"] == 128
    # no process of the script outlives the run
    assert not running_in(tmp_path)
    # the same script, unchanged, trains with the exported profile
    assert launch_cmd[:2] == ["autotune", "launch"]
    # the README's profile is the default study's; this run's is the quick study's
    readme_profile = "-script-train-gloo-2r.yaml"
    largs = [str(profile) if a.endswith(readme_profile) else a for a in launch_cmd[2:]]
    largs[largs.index("--steps") + 1] = "20"
    q = autotune(env, "launch", *largs, cwd=tmp_path, timeout=300)
    assert "trained 20 steps" in q.stdout, q.stdout + q.stderr


def test_ctrl_c_during_a_script_trial_ends_its_processes_and_exports(run_env, tmp_path):
    code, _ = example()
    (tmp_path / "train.py").write_text(code)
    env = {**run_env, "PATH": BIN + os.pathsep + run_env.get("PATH", "")}
    # --no-limit: the first measurement is not what is checked here; the trial after the
    # baseline starts without it
    p = started_run(
        env,
        "--study",
        "quick",
        "--budget",
        "5m",
        "--no-limit",
        "--global-batch",
        "128",
        "--",
        "torchrun",
        "--nproc-per-node",
        "2",
        "train.py",
        cwd=tmp_path,
    )
    # the first trial after the baseline is running
    assert wait_for(trial_running(tmp_path / "home", "quick-script-train-gloo-2r"), 60)
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 130, out
    assert "Interrupted (Ctrl-C)" in out and "Profile" in out
    assert not running_in(tmp_path)


def config() -> TrialConfig:
    return TrialConfig.from_values(SearchSpace.load("default").resolve(TARGET).defaults(), TARGET)


def test_a_script_that_never_wraps_its_model_fails_with_the_fix(tmp_path):
    script = tmp_path / "nowrap.py"
    script.write_text("import time\nprint('training without wrap', flush=True)\ntime.sleep(600)\n")
    started = time.monotonic()
    with pytest.raises(TrialFailed) as e:
        run_script(
            [sys.executable, str(script)],
            config(),
            world_size=2,
            measure=MeasureSettings(),
            timeout_s=120,
            wrap_wait_s=4,
            log_dir=tmp_path,
        )
    assert time.monotonic() - started < 30
    assert "Profile.load().wrap(model)" in e.value.detail
    said, printed = (tmp_path / "script.log").read_text().splitlines()
    assert said.startswith("autotune guard: containing the command ")  # which containment
    assert printed == "training without wrap"


def test_a_crashing_script_fails_with_its_status_and_last_line(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("raise SystemExit('out of data: shard 3 is empty')\n")
    with pytest.raises(TrialFailed) as e:
        run_script(
            [sys.executable, str(script)],
            config(),
            world_size=2,
            measure=MeasureSettings(),
            timeout_s=60,
        )
    assert e.value.reason == FailureReason.CRASH
    assert "status 1" in e.value.detail and "shard 3 is empty" in e.value.detail


def test_a_worker_in_a_session_of_its_own_is_ended_with_its_trial(tmp_path):
    # torchrun starts each worker with start_new_session=True: the command's process group
    # does not hold them, and killing torchrun orphans them (seen in CI before the guard
    # became a subreaper)
    marker = tmp_path / "worker-pid"
    script = tmp_path / "own_session.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],\n"
        "                     start_new_session=True)\n"
        f"open({str(marker)!r}, 'w').write(str(w.pid))\n"
        "time.sleep(600)\n"
    )
    with pytest.raises(TrialFailed):
        run_script(
            [sys.executable, str(script)],
            config(),
            world_size=2,
            measure=MeasureSettings(),
            timeout_s=60,
            wrap_wait_s=3,
        )
    assert not alive(int(marker.read_text()))


def _forking_script(tmp_path: Path) -> tuple[Path, Path]:
    """A script that starts a child in a session of its own, as torchrun does, and writes
    both pids to a marker file; then sleeps."""
    marker = tmp_path / "pids"
    script = tmp_path / "forks.py"
    script.write_text(
        "import os, subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],\n"
        "                     start_new_session=True)\n"
        f"open({str(marker)!r}, 'w').write(f'{{os.getpid()}} {{c.pid}}')\n"
        "time.sleep(600)\n"
    )
    return script, marker


def _kill_and_expect_none_left(victim: subprocess.Popen, marker: Path, work: Path) -> None:
    """Once the script's two processes run, SIGKILL ``victim``; neither may outlive it, and
    the trial's directories under ``work`` (the temporary directory the driver made, which
    its ``with`` no longer removes) are removed with them."""
    deadline = time.monotonic() + 60
    while not marker.exists() or len(marker.read_text().split()) < 2:
        assert time.monotonic() < deadline and victim.poll() is None
        time.sleep(0.2)
    pids = [int(x) for x in marker.read_text().split()]
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    deadline = time.monotonic() + 15
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if alive(p)]
    assert wait_for(lambda: list(work.iterdir()) == [], 10), list(work.iterdir())


def test_no_process_of_the_script_outlives_a_driver_killed_with_minus_9(tmp_path):
    script, marker = _forking_script(tmp_path)
    work = tmp_path / "tmp"  # the driver's temporary directory: the trial's is made in it
    work.mkdir()
    driver = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys\n"
                "from tests.integration.test_script_mode import config\n"
                "from autotune.core.config import MeasureSettings\n"
                "from autotune.script.command import run_script\n"
                f"run_script([sys.executable, {str(script)!r}], config(), world_size=2, "
                "measure=MeasureSettings(), timeout_s=600, wrap_wait_s=600)\n"
            ),
        ],
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(work)},
    )
    assert wait_for(lambda: any(work.iterdir()), 60)  # the trial's directory is made
    _kill_and_expect_none_left(driver, marker, work)


def test_no_process_of_the_script_outlives_a_guard_front_killed_with_minus_9(tmp_path):
    """What Ray does when the task's worker dies (Ctrl-C's force cancel, a driver killed with
    -9): it SIGKILLs the worker's direct children, i.e. the guard's front. The keeper, its
    child, then ends the command's processes on its own."""
    script, marker = _forking_script(tmp_path)
    work = tmp_path / "work"
    (work / "trial" / "report").mkdir(parents=True)
    # the worker that ran the trial: it starts the guard as run_script does, says its pid,
    # and is killed right after it (Ray's order: the worker's children, the worker gone)
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import os, subprocess, sys, time\n"
                "front = subprocess.Popen([sys.executable, '-m', 'autotune.script.guard', "
                f"str(os.getpid()), '--remove', {str(work / 'trial')!r}, '--', sys.executable, "
                f"{str(script)!r}], start_new_session=True)\n"
                "print(front.pid, flush=True)\n"
                "time.sleep(600)\n"
            ),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        front = int(worker.stdout.readline())
        _kill_and_expect_none_left(Killed(front, worker), marker, work)
    finally:
        worker.kill()
        worker.wait()


class Killed:
    """The guard's front by pid, killed as Ray kills a dead worker's children: then the
    worker itself (``_kill_and_expect_none_left``'s victim)."""

    def __init__(self, front: int, worker: subprocess.Popen) -> None:
        self.front, self.worker = front, worker

    def poll(self) -> int | None:
        return None if alive(self.front) else 0

    def send_signal(self, sig: int) -> None:
        os.kill(self.front, sig)
        self.worker.send_signal(sig)

    def wait(self) -> None:
        self.worker.wait()


def running_in(where: Path) -> list[str]:
    """The command lines of the script's live processes (train.py, torchrun's workers, the
    guard) whose working directory is ``where``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if Path(os.readlink(proc / "cwd")) == where and alive(int(proc.name)):
                line = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                if "train.py" in line or "script_guard" in line:
                    found.append(line)
        except OSError:
            continue
    return found


#: The numerics guard's drifting workload (``autotune_test_trainers.underflow``) as a plain
#: torchrun script in the README's pattern: a linear model on a linear target, the loss scaled
#: to 1e-10 so that the fp16 compression hook turns every gradient into zero. ``SEED`` is
#: replaced by a seed expression: fixed (a reproducible script) or from the clock.
UNDERFLOW = """
import time
import torch
import torch.distributed as dist
import autotune

profile = autotune.Profile.load()
profile.apply_env()
dist.init_process_group("gloo")
torch.manual_seed(SEED)
x = torch.randn(4096, 64, generator=torch.Generator().manual_seed(SEED))
data = torch.utils.data.TensorDataset(x, 0.5 * x[:, :16])
model = profile.wrap(torch.nn.Linear(64, 16))
sampler = torch.utils.data.DistributedSampler(data, seed=SEED)
loader = torch.utils.data.DataLoader(data, sampler=sampler, **profile.dataloader_kwargs)
optimizer = torch.optim.Adam(model.parameters(), lr=0.02, eps=1e-20)
for epoch in range(10**6):
    sampler.set_epoch(epoch)
    for i, (xb, yb) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(xb), yb) * 1e-10
        (loss / profile.accumulation_steps).backward()
        profile.report_loss(loss)
        if (i + 1) % profile.accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
"""


def test_the_numerics_guard_fails_a_script_trial_whose_loss_drifts(run_env, tmp_path):
    (tmp_path / "train.py").write_text(UNDERFLOW.replace("SEED", "0"))
    (tmp_path / "space.yaml").write_text(
        "ddp:\n  comm_hook: {type: categorical, choices: [none, fp16]}\n"
    )
    env = {**run_env, "PATH": BIN + os.pathsep + run_env.get("PATH", "")}
    p = autotune(
        env,
        "run",
        "--study",
        "quick",
        "--space",
        "space.yaml",
        "--sampler",
        "grid",
        # the grid's two points end the search (its grid exhausted), not the budget: on a
        # loaded machine a 60 s budget held the baseline and the grid's first point only
        "--budget",
        "5m",
        "--validate-top",
        "0",
        "--no-limit",  # the guard is checked here; a script's first measurement, in the README test
        "--global-batch",
        "128",
        "--",
        "torchrun",
        "--nproc-per-node",
        "2",
        "train.py",
        cwd=tmp_path,
        timeout=300,
    )
    study = optuna.load_study(
        study_name="quick-script-train-gloo-2r", storage=f"sqlite:///{tmp_path}/home/autotune.db"
    )
    base = study.trials[0].user_attrs
    curve = base["loss_curve"]
    assert base["baseline"] and len(curve) == 16 and curve[-1] < 0.5 * curve[0], p.stdout
    fp16 = [t for t in study.trials if t.params.get("comm_hook") == "fp16"]
    assert fp16, p.stdout
    t = fp16[0]
    assert t.state == TrialState.FAIL and t.user_attrs["reason"] == "numerics_drift", p.stdout
    assert t.user_attrs["numerics_drift"] > 0.2
    same = [t for t in study.trials[1:] if t.params.get("comm_hook") == "none"]
    assert all(t.user_attrs.get("fp32_drift", 0) < 1e-3 for t in same)  # it repeats exactly


SCRIPT_MEASURE = MeasureSettings(window_s=0.3, min_windows=2, max_windows=3)


def loss_curve(script: Path, accumulation_steps: int, cwd: Path) -> list[float]:
    """The loss curve (per optimizer step) of ``script`` run as a trial under torchrun."""
    micro = TARGET.per_rank_batch // accumulation_steps
    cfg = replace(config(), micro_batch=micro, accumulation_steps=accumulation_steps)
    cmd = [os.path.join(BIN, "torchrun"), "--nproc-per-node", "2", str(script)]
    r = run_script(cmd, cfg, world_size=2, measure=SCRIPT_MEASURE, timeout_s=120, cwd=cwd)
    assert r.ranks[0].peak_memory_mb > 100  # a rank's peak resident set: torch alone is more
    return r.ranks[0].loss_curve


def test_a_seeded_script_repeats_its_loss_curve_and_an_unseeded_one_does_not(tmp_path):
    """What the guard compares (``script_trial.loss_curve``): per optimizer step, the same
    samples at any accumulation; a script seeded from the clock gives another curve each run,
    which ``fp32_drift`` then shows. The seeded script is run twice, in new processes, once
    without accumulation and once accumulating 4 micro-batches: equal curves prove both that a
    rerun repeats and that accumulation keeps the per-step samples."""
    from autotune.core.numerics import drift

    seeded, unseeded = tmp_path / "seeded.py", tmp_path / "unseeded.py"
    seeded.write_text(UNDERFLOW.replace("SEED", "0"))
    unseeded.write_text(UNDERFLOW.replace("SEED", "time.time_ns() % 2**31"))
    reference = loss_curve(seeded, 1, tmp_path)
    assert len(reference) == 16
    value, steps = drift(loss_curve(seeded, 4, tmp_path), reference)
    assert steps == 16 and value < 1e-3
    value, _ = drift(loss_curve(unseeded, 1, tmp_path), reference)
    assert value > 0.01  # 3.7 % in one run: over ten times a seeded rerun's bound


def test_a_script_over_max_memory_fails_its_trial_as_oom(tmp_path):
    """``--max-memory`` for a script: the peak memory the wrapped model reports."""
    script = tmp_path / "train.py"
    script.write_text(UNDERFLOW.replace("SEED", "0"))
    cmd = [os.path.join(BIN, "torchrun"), "--nproc-per-node", "2", str(script)]
    with pytest.raises(TrialFailed) as e:
        run_script(
            cmd,
            config(),
            world_size=2,
            measure=MeasureSettings(),
            timeout_s=120,
            cwd=tmp_path,
            max_memory_mb=50,
        )
    assert e.value.reason == FailureReason.OOM
    assert re.search(r"rank 0: peak memory \d+ MiB is over --max-memory 50 MiB", e.value.detail)


#: A script that reports what the test wrote in ``report.txt`` as its rank 0's steps, then
#: waits to be ended.
REPORTER = """
import os, shutil, time
shutil.copy("report.txt", os.path.join(os.environ["AUTOTUNE_REPORT_DIR"], "rank-0.steps"))
time.sleep(60)
"""


def steps(n: int, loss: str | None = None) -> str:
    """``n`` report lines of steps 10 ms apart, each with ``loss`` when given."""
    return "".join(f"t {100 + k / 100}\n" + (f"l {loss}\n" if loss else "") for k in range(n))


@pytest.mark.parametrize(
    ("report", "reason", "says"),
    [
        pytest.param(
            "t 5.0\n" * 300,
            FailureReason.CRASH,
            "step report rank-0.steps line 2: time stamp 5.0 is not after the one before (5.0)",
            id="H-S18-equal-stamps",
        ),
        pytest.param(
            "".join(f"t {500 - k / 100}\n" for k in range(300)),
            FailureReason.CRASH,
            "step report rank-0.steps line 2: time stamp 499.99 is not after",
            id="H-S18-backwards-stamps",
        ),
        pytest.param(
            "t 1.0\nt nan\n",
            FailureReason.CRASH,
            "step report rank-0.steps line 2: time stamp nan",
            id="H-S18-nan-stamp",
        ),
        pytest.param(
            steps(400, "1e308"),
            FailureReason.NAN,
            "the script reported loss inf over its measured steps",
            id="H-S18-losses-whose-mean-overflows",
        ),
        pytest.param(
            "t 1.0\nl inf\nt 1.5\nl -inf\n",
            FailureReason.NAN,
            "the script reported loss -inf after 2 steps",
            id="H-S18-infinite-losses",
        ),
    ],
)
def test_a_script_with_bad_step_reports_fails_in_one_line(tmp_path, report, reason, says):
    (tmp_path / "report.txt").write_text(report)
    (tmp_path / "reporter.py").write_text(REPORTER)
    with pytest.raises(TrialFailed) as e:
        run_script(
            [sys.executable, "reporter.py"],
            config(),
            world_size=2,
            measure=SCRIPT_MEASURE,
            timeout_s=20,
            cwd=tmp_path,
        )
    assert e.value.reason == reason and e.value.detail.startswith(says), e.value.detail
    assert "\n" not in e.value.detail


FLOOD = """
import sys
sys.stdout.write("FIRST LINE\\n")
block = "".join("%09d\\n" % k for k in range(6500))
for k in range(500):  # 32 MB
    sys.stdout.write(block)
sys.stdout.write("out of data: shard 3 is empty\\n")
sys.exit(3)
"""


def test_a_script_printing_past_the_cap_leaves_a_capped_log_and_its_last_line(
    tmp_path, monkeypatch
):
    """H-S07: a script trial's log (``script.log``) under the cap's rule (here 1 MiB), its
    head and tail kept: the failure still names the script's last line."""
    from autotune.core import logfile

    monkeypatch.setattr(logfile, "LIMIT", logfile.Limit(1 << 20, 64 << 10, 64 << 10))
    (tmp_path / "flood.py").write_text(FLOOD)
    with pytest.raises(TrialFailed) as e:
        run_script(
            [sys.executable, "flood.py"],
            config(),
            world_size=2,
            measure=SCRIPT_MEASURE,
            timeout_s=60,
            cwd=tmp_path,
            log_dir=tmp_path,
        )
    assert "status 3" in e.value.detail
    assert e.value.detail.endswith(": out of data: shard 3 is empty")
    log = (tmp_path / "script.log").read_bytes()
    assert len(log) <= 1 << 20 and b" bytes cut here]\n" in log
    assert log.startswith(b"autotune guard: containing the command ")  # the guard's line
    assert b"\nFIRST LINE\n" in log[:200] and log.endswith(b"shard 3 is empty\n")


def test_a_command_that_exits_at_once_fails_with_its_own_error_and_its_log(
    run_env, tmp_path, ray_address
):
    """The trial runs as a Ray task, so its ``TrialFailed`` crosses a pickle: it used to reach
    the driver as Ray's "UnserializableException: Failed to deserialize exception". The
    baseline's failure names the script's own error line and where its output is."""
    (tmp_path / "train.py").write_text("import argparse\nargparse.ArgumentParser().parse_args()\n")
    env = {**run_env, "PATH": BIN + os.pathsep + run_env.get("PATH", "")}
    p = autotune(
        env,
        "run",
        "--study",
        "quick",
        "--budget",
        "1m",
        "--global-batch",
        "128",
        "--address",
        ray_address,
        "--",
        sys.executable,
        "train.py",
        "--bad-flag",
        cwd=tmp_path,
        rc=1,
        timeout=300,
    )
    said = p.stdout + p.stderr
    assert "Failed to deserialize" not in said and "Unserializable" not in said, said
    assert "error: unrecognized arguments: --bad-flag" in said, said
    log = tmp_path / "home" / "logs" / "quick-script-train-gloo-2r" / "trial-0"
    assert f"output in {log}" in said, said
    assert "unrecognized arguments" in (log / "script.log").read_text()
