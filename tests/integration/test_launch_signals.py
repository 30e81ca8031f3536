"""``autotune launch`` becomes its command (exec): Ctrl-C and SIGTERM reach torchrun itself,
which stops its own workers, so nothing is orphaned. A real ``torchrun --nproc-per-node 2``
whose two gloo ranks sleep after joining their process group.

And a script that applies the profile ends as it trained, also on a loaded machine: no rank
exits by SIGABRT ("terminate called without an active exception") after its last step."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.core.config import TrialConfig
from autotune.core.target import Target
from autotune.definition.space import SearchSpace
from autotune.profile.profile import Profile
from tests.conftest import wait_for

pytestmark = pytest.mark.integration

AUTOTUNE = str(Path(sys.executable).with_name("autotune"))
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
CPU = Target(backend="gloo", device="cpu", world_size=2, global_batch=64, cpus_per_rank=1)

WORKER = """\
import os, sys, time
from pathlib import Path

import torch.distributed as dist

dist.init_process_group("gloo")
out = Path(sys.argv[1])
(out / f"{os.getpid()}.tmp").write_text(os.environ.get("NCCL_ALGO", "unset"))
(out / f"{os.getpid()}.tmp").rename(out / f"{os.getpid()}.pid")
while True:
    time.sleep(0.2)
"""


def write_profile(path: Path, **changes) -> Path:
    values = {**SearchSpace.load("default").resolve(CPU).defaults(), **changes}
    profile = Profile.from_config(
        TrialConfig.from_values(values, CPU),
        study={"name": "signals", "best_trial": 1, "baseline_trial": 0},
        workload={
            "trainer": "mlp",
            "options": {},
            "world_size": 2,
            "backend": "gloo",
            "global_batch": 64,
        },
        hardware={"device": "cpu"},
        measured={"baseline_samples_per_s": 1.0, "best_samples_per_s": 2.0, "speedup": 2.0},
    )
    profile.env["NCCL_ALGO"] = "Ring"  # gloo ignores it; the workers report that they got it
    return profile.save(path)


def stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = text.rsplit(")", 1)[1].split()[:2]
    return state, int(ppid)


def alive(pid: int) -> bool:
    s = stat(pid)
    return s is not None and s[0] not in ("Z", "X")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_launch_stops_torchrun_and_its_workers(tmp_path, sig):
    profile = write_profile(tmp_path / "best.yaml")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    pids = tmp_path / "pids"
    pids.mkdir()
    log = (tmp_path / "out.log").open("w")
    p = subprocess.Popen(
        [
            AUTOTUNE,
            "launch",
            str(profile),
            "--",
            TORCHRUN,
            "--standalone",
            "--nproc-per-node",
            "2",
            str(script),
            str(pids),
        ],
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # Ctrl-C deliverable: a background shell starts its children with SIGINT ignored,
        # and an ignored signal stays ignored across exec
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    workers: list[int] = []
    try:
        started = wait_for(lambda: len(list(pids.glob("*.pid"))) == 2 or p.poll() is not None, 120)
        output = (tmp_path / "out.log").read_text
        assert started and p.poll() is None, output()
        workers = [int(f.stem) for f in pids.glob("*.pid")]
        assert [f.read_text() for f in pids.glob("*.pid")] == ["Ring", "Ring"]
        # exec: the launch process is torchrun now, and the workers are its own children
        assert "torchrun" in Path(f"/proc/{p.pid}/cmdline").read_text()
        assert [stat(w)[1] for w in workers] == [p.pid, p.pid]

        os.kill(p.pid, sig)  # to the launch process only, not its group
        p.wait(timeout=60)
        assert p.returncode != 0, output()
        assert wait_for(lambda: not any(map(alive, workers)), 5), (
            f"workers still alive after {sig.name}: {[w for w in workers if alive(w)]}"
        )
    finally:
        log.close()
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)


#: The README's pattern for applying a profile (load, apply_env, process group, wrap, train,
#: destroy the group) with the exit right after the last step's all-reduce: where a gloo worker
#: thread, still letting go of that all-reduce, meets the interpreter's exit.
APPLIES_THE_PROFILE = """\
import torch
import torch.distributed as dist

import autotune

profile = autotune.Profile.load()  # AUTOTUNE_PROFILE, set by autotune launch
profile.apply_env()
dist.init_process_group("gloo")
model = profile.wrap(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                         torch.nn.Linear(64, 1)))
for _ in range(8):
    model(torch.randn(16, 64)).sum().backward()
dist.destroy_process_group()
"""


def aborts_under_load(tmp_path: Path, runs: int, hook: str) -> list[str]:
    """Run the script under ``autotune launch PROFILE -- torchrun`` ``runs`` times with one
    core kept busy by another process; what each run that aborted printed about it. A run that
    fails otherwise fails the test."""
    profile = write_profile(tmp_path / "best.yaml", comm_hook=hook)
    script = tmp_path / "train.py"
    script.write_text(APPLIES_THE_PROFILE)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    aborted = []
    try:
        for i in range(runs):
            p = subprocess.run(
                [
                    AUTOTUNE,
                    "launch",
                    str(profile),
                    "--",
                    TORCHRUN,
                    "--standalone",
                    "--nproc-per-node",
                    "2",
                    str(script),
                ],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=300,
            )
            out = p.stdout + p.stderr
            if "SIGABRT" in out or "terminate called" in out:
                aborted.append(
                    f"run {i}: "
                    + "; ".join(
                        line.strip()
                        for line in out.splitlines()
                        if "SIGABRT" in line or "terminate called" in line
                    )
                )
            else:
                assert p.returncode == 0, out
    finally:
        busy.kill()
        busy.wait(timeout=30)
    return aborted


@pytest.mark.parametrize("hook", ["none", "fp16"])
def test_a_script_that_applies_the_profile_exits_cleanly_under_load(tmp_path, hook):
    """H-T07: the profile applied by a torchrun script (``wrap``: DDP, and the fp16 hook's
    Python callback), 2 runs with one core busy: no rank aborts at exit. Before the fix about
    1 run in 4 did (gloo's worker thread, releasing the last all-reduce, took the GIL while
    the interpreter finalized: pthread_exit through a noexcept destructor)."""
    assert aborts_under_load(tmp_path, 2, hook) == []


@pytest.mark.stress
@pytest.mark.parametrize("hook", ["none", "fp16"])
def test_a_script_that_applies_the_profile_exits_cleanly_under_load_20_runs(tmp_path, hook):
    """H-T08: as H-T07, 20 runs each (with and without the comm hook): none aborts."""
    assert aborts_under_load(tmp_path, 20, hook) == []
