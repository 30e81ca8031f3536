"""Faults injected into real 2-rank gloo trials: each ends with its reason, the ranks and their
DataLoader workers are gone afterwards, and the runner goes on."""

from __future__ import annotations

import math
import os
import time

import pytest

from autotune.core.errors import TrialFailed
from tests.integration.conftest import QUICK, config

pytestmark = pytest.mark.integration


def run(runner, trainer, *, cfg=None, options=None, timeout_s=120.0, **kwargs):
    return runner.run(
        trial=0,
        trainer=f"autotune_test_trainers:{trainer}",
        trainer_options=options or {},
        config=cfg or config(),
        measure=QUICK,
        seed=0,
        timeout_s=timeout_s,
        **kwargs,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for our purposes
        return f.read().split(")")[-1].split()[0] != "Z"


def wait_gone(pids: list[int], within_s: float) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.2)
    return [p for p in pids if alive(p)]


def test_a_rank_stuck_in_a_collective_is_killed_with_its_workers(runner, tmp_path):
    timeout = 8.0
    # the ranks started first, so the timeout times the hang and not their start (a loaded
    # machine took longer than 8 s to start them)
    assert run(runner, "tiny", cfg=config(num_workers=1, prefetch_factor=2)).throughput > 0
    started = time.monotonic()
    with pytest.raises(TrialFailed) as e:
        run(
            runner,
            "hanging",
            cfg=config(num_workers=1, prefetch_factor=2),
            options={"pid_dir": str(tmp_path)},
            timeout_s=timeout,
        )
    detected = time.monotonic() - started
    assert e.value.reason == "timeout" and "rank(s) [0, 1]" in e.value.detail
    assert detected <= timeout + 10  # the bound: killed within timeout + 10 s
    pids = [int(p.name) for p in tmp_path.iterdir()]
    assert len(pids) >= 3  # two ranks and at least one DataLoader worker
    assert wait_gone(pids, within_s=10) == []
    assert run(runner, "tiny").throughput > 0  # the runner goes on


def test_nan_loss_fails_with_reason_nan(runner):
    with pytest.raises(TrialFailed) as e:
        run(runner, "nan_loss")
    assert e.value.reason == "nan" and "loss is nan after 2 warm-up steps" in e.value.detail


def test_host_memory_over_the_limit_fails_with_reason_oom(runner):
    # the limit sized above what a rank of the tiny workload holds here (a CUDA build of torch
    # holds more host memory than the CPU build: 1058 MiB against a fixed 1024 seen)
    held = max(r.peak_memory_mb for r in run(runner, "tiny").ranks)
    limit = max(1024, math.ceil(held) + 256)
    with pytest.raises(TrialFailed) as e:
        run(runner, "memory_hog", options={"mib": limit + 512}, max_memory_mb=limit)
    assert e.value.reason == "oom" and f"over --max-memory {limit} MiB" in e.value.detail
    # the same limit does not touch a workload that stays under it
    assert run(runner, "tiny", max_memory_mb=limit).throughput > 0


def test_cuda_out_of_memory_is_reason_oom(runner):
    with pytest.raises(TrialFailed) as e:
        run(runner, "cuda_oom")
    assert e.value.reason == "oom" and "CUDA out of memory" in e.value.detail


def test_a_rank_process_that_dies_is_named_by_what_its_own_log_says(runner, tmp_path):
    """Ray says only that the worker exited ("connection error code 2 ... Some common causes
    include ..."); the trial's reason is what the dying rank wrote, and where its log is."""
    with pytest.raises(TrialFailed) as e:
        run(runner, "dying", log_dir=str(tmp_path))
    log = tmp_path / "rank-1.log"
    assert e.value.reason == "crash"
    assert e.value.detail.startswith(
        "rank 1: its process died: libnative: fatal error: heap corrupted; "
        "Fatal Python error: Segmentation fault"
    )
    assert e.value.detail.endswith(f"(its output: {log})") and log.is_file()
    assert "common causes" not in e.value.detail
    run(runner, "tiny")  # the runner goes on, in fresh ranks


def test_a_crash_tears_down_the_other_rank(runner, tmp_path):
    with pytest.raises(TrialFailed) as e:
        run(runner, "raising_with_pids", options={"pid_dir": str(tmp_path)})
    assert e.value.reason == "crash"
    pids = [int(p.name) for p in tmp_path.iterdir()]
    assert len(pids) == 2 and wait_gone(pids, within_s=10) == []
