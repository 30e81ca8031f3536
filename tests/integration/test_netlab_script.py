"""Script mode across the network lab's nodes, for real: a user's torchrun script started by
``autotune run ... -- torchrun --nnodes 2 ...`` on both nodes of a 2-node lab (its gradients
cross the shaped link), ``autotune compare`` across the same nodes, a driver killed with -9, and
a worker node killed mid-trial. Each node's processes are looked for in its own namespace
afterwards: none of the script may be left on any node. Needs root, ``ip`` and ``tc`` (skipped,
saying which is missing, elsewhere); traffic stays inside the lab's namespaces."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.conftest import autotune_cmd, wait_for
from tests.integration.conftest import trial_running
from tests.integration.raycluster import check_run_stopped_by_node_loss
from tests.integration.test_netlab import WHY_NOT, kill_node, lab, sent_bytes

pytestmark = [pytest.mark.integration, pytest.mark.netlab]
if WHY_NOT:
    pytestmark.append(pytest.mark.skip(reason=WHY_NOT))

#: A torchrun script in the README's pattern: an MLP of 1.6 M parameters (6.3 MB of gradients
#: per step), seeded; ``MARKER`` in its command line finds its processes on every node.
MARKER = "lab_train_marker"
SCRIPT = f"""
import argparse, contextlib, torch, torch.distributed as dist, autotune
parser = argparse.ArgumentParser()
parser.add_argument("--{MARKER}", action="store_true")
args = parser.parse_args()
profile = autotune.Profile.load()
profile.apply_env()
dist.init_process_group("gloo")
torch.manual_seed(0)
model = profile.wrap(torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.ReLU(),
                                         torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                         torch.nn.Linear(1024, 512), torch.nn.ReLU(),
                                         torch.nn.Linear(512, 1)))
data = torch.utils.data.TensorDataset(torch.randn(4096, 64), torch.randn(4096, 1))
sampler = torch.utils.data.DistributedSampler(data)
loader = torch.utils.data.DataLoader(data, sampler=sampler, **profile.dataloader_kwargs)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
while True:
    for i, (x, y) in enumerate(loader):
        last = (i + 1) % profile.accumulation_steps == 0
        with contextlib.nullcontext() if last else model.no_sync():
            with profile.autocast("cpu"):
                loss = torch.nn.functional.mse_loss(model(x), y)
            (loss / profile.accumulation_steps).backward()
        profile.report_loss(loss)
        if last:
            opt.step()
            opt.zero_grad()
"""


def torchrun(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "torchrun"), *args]


def script_pids(ns: str) -> list[int]:
    """Processes in namespace ``ns`` whose command line holds ``MARKER`` (the script's ranks
    and the torchrun that started them)."""
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    found = []
    for pid in out.split():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if MARKER.encode() in cmdline:
            found.append(int(pid))
    return found


def none_left() -> bool:
    return not script_pids("atlab-0") and not script_pids("atlab-1")


@pytest.fixture(scope="module")
def lab2():
    from autotune import netlab

    if netlab.namespaces():
        pytest.skip("a lab is up on this machine; the tests leave it alone")
    p = lab("up", "--nodes", "2", "--rate", "1gbit", "--cpus-per-node", "1")
    try:
        assert p.returncode == 0, p.stdout + p.stderr
        yield
    finally:
        down = lab("down")
        assert down.returncode == 0, down.stderr


@pytest.fixture
def job(tmp_path: Path) -> Path:
    work = tmp_path / "job"
    work.mkdir()
    (work / "train.py").write_text(SCRIPT)
    return work


def run_cmd(*options: str) -> list[str]:
    command = torchrun("--nnodes", "2", "--nproc-per-node", "1", "train.py", f"--{MARKER}")
    run = autotune_cmd("run", "--address", "auto", "--global-batch", "64", *options, "--", *command)
    return autotune_cmd("lab", "exec", "--", *run)


def test_a_torchrun_script_spans_both_nodes_and_compare_runs_it_there(lab2, job, run_env):
    before = sent_bytes("atlab-1")
    p = subprocess.run(
        run_cmd("--study", "quick", "--n-trials", "2", "--validate-top", "0", "--budget", "3m"),
        env=run_env,
        cwd=job,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"Script mode on 2 node(s): every node sees the same files in {job}" in p.stdout
    home = Path(run_env["AUTOTUNE_HOME"])
    name = "quick-script-train-gloo-2r"
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{home / 'autotune.db'}")
    base = study.trials[0]
    assert base.state == TrialState.COMPLETE, base.user_attrs
    assert study.user_attrs["autotune"]["hardware"]["node_count"] == 2
    # the first measurement: the script's own gradients (1,641,473 fp32 parameters), and the
    # link fitted by autotune's ranks across the shaped link, not loopback: the largest
    # message's all-reduce took at least what 1 Gbit/s allows (2 ranks: each sends it once)
    first = study.user_attrs["first_measurement"]["probe"]
    assert first["source"] == "script" and first["comm"]["wire_bytes"] == 4 * 1_641_473
    size, seconds = max(zip(first["comm"]["fit_bytes"], first["comm"]["fit_s"], strict=True))
    assert size >= 1 << 20 and seconds >= 0.8 * size * 8 / 1e9, (size, seconds)
    # every step's gradients crossed the link: 6.3 MB per all-reduce, many steps
    assert sent_bytes("atlab-1") - before > 100e6
    # both nodes' output is under the baseline's log directory on the driver's side: node 1
    # printed its torchrun's own lines (its rank is global rank 1)
    logs = home / "logs" / name / "trial-0"
    assert sorted(f.name for f in logs.iterdir()) == ["node-0.log", "node-1.log"]
    assert "autotune guard:" in (logs / "node-1.log").read_text()
    assert wait_for(none_left, 20), (script_pids("atlab-0"), script_pids("atlab-1"))

    # the profile, checked on the same nodes by autotune compare
    profile = home / "profiles" / f"{name}.yaml"
    command = torchrun("--nnodes", "2", "--nproc-per-node", "1", "train.py", f"--{MARKER}")
    c = subprocess.run(
        autotune_cmd(
            "lab",
            "exec",
            "--",
            *autotune_cmd(
                "compare",
                "--address",
                "auto",
                "--rounds",
                "2",
                "--study",
                "quick",
                "asis",
                str(profile),
                "--",
                *command,
            ),
        ),
        env=run_env,
        cwd=job,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert c.returncode == 0, c.stdout + c.stderr
    assert "Script mode on 2 node(s)" in c.stdout
    assert c.stdout.count("samples/s") >= 4, c.stdout  # 2 rounds of A and B
    assert "B/A" in c.stdout
    assert wait_for(none_left, 20), (script_pids("atlab-0"), script_pids("atlab-1"))


def test_a_directory_the_nodes_do_not_share_travels_with_rays_runtime_environment(
    lab2, job, run_env
):
    """``AUTOTUNE_SCRIPT_FILES=ship`` takes the path of nodes without a shared file system:
    the directory goes to each node by Ray's runtime environment, and the command runs in the
    copy there (the script's directory holds a data file it reads by a relative path)."""
    (job / "train.py").write_text(
        "import pathlib\nassert pathlib.Path('data.txt').read_text() == 'shipped'\n" + SCRIPT
    )
    (job / "data.txt").write_text("shipped")
    env = {**run_env, "AUTOTUNE_SCRIPT_FILES": "ship"}
    p = subprocess.run(
        run_cmd(
            "--study",
            "quick",
            "--n-trials",
            "1",
            "--validate-top",
            "0",
            "--budget",
            "2m",
            "--no-limit",
            "--study-name",
            "shipped",
        ),
        env=env,
        cwd=job,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "the nodes do not all see the files of" in p.stdout, p.stdout
    assert "travels to each with Ray's runtime environment" in p.stdout
    assert "baseline" in p.stdout and "samples/s" in p.stdout
    assert wait_for(none_left, 20), (script_pids("atlab-0"), script_pids("atlab-1"))


def test_a_script_on_two_nodes_fails_with_its_own_error(lab2, job, run_env):
    """One node's command fails at once: the trial's reason is the script's own error line,
    not torchrun's banner, and nothing of the script is left on either node."""
    (job / "train.py").write_text(
        "import os, sys\nif os.environ.get('GROUP_RANK') == '1':\n"
        "    sys.exit('train.py: error: no data on this node')\n" + SCRIPT
    )
    p = subprocess.run(
        run_cmd("--study", "quick", "--n-trials", "1", "--budget", "2m", "--quiet"),
        env=run_env,
        cwd=job,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode != 0
    assert "train.py: error: no data on this node" in p.stdout + p.stderr, p.stdout + p.stderr
    assert wait_for(none_left, 20), (script_pids("atlab-0"), script_pids("atlab-1"))


def test_a_driver_killed_with_minus_9_leaves_nothing_of_the_script_on_any_node(lab2, job, run_env):
    for attempt in range(2):  # twice: the second run resumes the study the first left
        p = subprocess.Popen(
            run_cmd("--study", "quick", "--budget", "5m", "--quiet", "--study-name", "k9"),
            env=run_env,
            cwd=job,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            assert wait_for(trial_running(run_env["AUTOTUNE_HOME"], "k9", number=attempt), 180)
            assert wait_for(lambda: script_pids("atlab-1"), 60), "no rank on the worker node"
            driver = _driver_of(p.pid)
            os.kill(driver, signal.SIGKILL)
            p.wait(timeout=60)
        finally:
            with __import__("contextlib").suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        assert wait_for(none_left, 60), (script_pids("atlab-0"), script_pids("atlab-1"))


def _driver_of(lab_exec: int) -> int:
    """The ``autotune run`` process ``autotune lab exec`` (pid ``lab_exec``) started."""
    until = time.monotonic() + 10
    while time.monotonic() < until:
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                cmdline = (stat.parent / "cmdline").read_bytes()
            except OSError:
                continue
            if int(fields[1]) == lab_exec and b"run" in cmdline:
                return int(stat.parent.name)
        time.sleep(0.2)
    raise AssertionError(f"no child of {lab_exec}")


#: The quick study with a measurement of 8 windows of 1 s and no pruning before the
#: last: a trial outlives the few seconds between its ranks appearing and the node's kill, so
#: the kill lands inside a trial and not between two.
LONG_TRIALS = """
description: the quick study with long trials, for killing a node mid-trial
trainer: mlp
trainer_options: {width: 256, layers: 4, global_batch: 64}
world_size: 2
backend: gloo
space: default
objective: throughput
budget: 5m
sampler: tpe
seed: 0
measure: {window_s: 1.0, min_windows: 8, max_windows: 8, prune_after: 8}
"""


def test_a_worker_node_killed_mid_script_trial_fails_it_node_lost(lab2, job, run_env):
    """Last in the module: the lab's worker node is gone afterwards."""
    (job / "long.yaml").write_text(LONG_TRIALS)
    home = Path(run_env["AUTOTUNE_HOME"])
    p = subprocess.Popen(
        run_cmd("--study", "long.yaml", "--node-wait", "5s", "--quiet", "--study-name", "killed"),
        env=run_env,
        cwd=job,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for line in p.stdout:
            if "samples/s" in line:  # the baseline is measured
                break
        assert wait_for(trial_running(home, "killed"), 120)
        assert wait_for(lambda: script_pids("atlab-1"), 60), "no rank on the worker node"
        kill_node("atlab-1")  # the whole node: raylet, workers, the script
        out = p.communicate(timeout=240)[0]
    finally:
        p.kill()
    check_run_stopped_by_node_loss(p, out, home, "killed")
    assert wait_for(lambda: not script_pids("atlab-0"), 30), script_pids("atlab-0")
