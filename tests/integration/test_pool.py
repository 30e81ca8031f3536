"""The warm pool of rank processes: trials with the same environment run in the previous
trial's processes; another environment, a failure or a dead actor gets fresh ones; nothing of
one trial (peak memory, DataLoader workers) carries over into the next."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from autotune.core.errors import TrialFailed
from tests.integration.conftest import QUICK, config
from tests.integration.test_faults import alive, wait_gone

pytestmark = pytest.mark.integration


def run(runner, cfg=None, trainer="tiny", options=None, measure=QUICK, **kwargs):
    return runner.run(
        trial=0,
        trainer=f"autotune_test_trainers:{trainer}",
        trainer_options=options or {},
        config=cfg or config(),
        measure=measure,
        seed=0,
        timeout_s=120,
        **kwargs,
    )


def pids(res) -> list[int]:
    return [r.pid for r in res.ranks]


def children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is ``pid``."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            state, ppid = (d / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if int(ppid) == pid and state != "Z":
            out.append(int(d.name))
    return out


def test_trials_with_the_same_env_run_in_the_same_processes(runner):
    first = run(runner)
    # DDP, data and precision settings change per trial without new processes
    second = run(runner, config(bucket_cap_mb=5.0, comm_hook="fp16", micro_batch=8))
    assert pids(second) == pids(first) and len(set(pids(first))) == 2
    for a, b in zip(first.ranks, second.ranks, strict=True):
        assert b.reused is True and b.process_trials == a.process_trials + 1
        assert b.applied["comm_hook"] == "fp16_compress_hook"
        assert b.applied["accumulation_steps"] == 2
    assert second.throughput > 0 and len(second.windows) >= QUICK.min_windows
    assert second.ranks[0].windows == second.ranks[1].windows


def test_another_env_starts_fresh_processes_that_see_it(runner):
    old = pids(run(runner))
    cfg = config()
    cfg.env["NCCL_BUFFSIZE"] = "2097152"
    res = run(runner, cfg)
    assert not set(pids(res)) & set(old)
    for r in res.ranks:
        assert r.reused is False and r.process_trials == 1
        assert r.env_at_start["NCCL_BUFFSIZE"] == "2097152" and r.pg_at_start is False
    assert wait_gone(old, within_s=10) == []
    assert pids(run(runner, cfg)) == pids(res)  # and the new env's processes are pooled


def test_after_a_failed_trial_the_next_starts_fresh_and_the_old_ranks_are_gone(runner):
    old = pids(run(runner))
    with pytest.raises(TrialFailed) as e:
        run(runner, trainer="raising")
    assert e.value.reason == "crash"
    assert wait_gone(old, within_s=10) == []
    res = run(runner)
    assert not set(pids(res)) & set(old)
    assert [r.reused for r in res.ranks] == [False, False]


def test_a_dead_pooled_rank_never_fails_the_next_trial(runner):
    old = pids(run(runner))
    os.kill(old[1], signal.SIGKILL)
    assert wait_gone(old[1:], within_s=10) == []
    res = run(runner)  # the liveness check replaces the pool
    assert res.throughput > 0 and not set(pids(res)) & set(old)
    assert wait_gone(old, within_s=10) == []


def test_peak_memory_is_the_trials_own_not_the_processes(runner):
    # 16.8 M parameters: weights, gradients, DDP buckets and Adam's two states, ~320 MiB
    big = run(runner, options={"width": 2048, "layers": 4})
    limit = min(r.peak_memory_mb for r in big.ranks) - 150
    # a small trial in the same processes stays under a limit the big one was over
    small = run(runner, max_memory_mb=limit)
    assert pids(small) == pids(big)
    for b, s in zip(big.ranks, small.ranks, strict=True):
        assert s.reused is True and 0 < s.peak_memory_mb < limit < b.peak_memory_mb


@pytest.mark.parametrize("persistent", [False, True])
def test_no_dataloader_worker_outlives_a_trial_in_a_reused_process(runner, tmp_path, persistent):
    run(runner)  # the pool is warm
    cfg = config(num_workers=2, prefetch_factor=2, persistent_workers=persistent)
    res = run(runner, cfg, options={"pid_dir": str(tmp_path)})
    ranks = pids(res)
    assert all(r.reused for r in res.ranks)
    assert res.ranks[0].applied["num_workers"] == 2
    workers = [int(p.name) for p in tmp_path.iterdir() if int(p.name) not in ranks]
    assert len(workers) >= 2  # each rank had its own loading processes
    # gone as the ranks returned their results, before any next trial could measure
    assert [p for p in workers if alive(p)] == []
    assert [c for p in ranks for c in children(p)] == []
    assert pids(run(runner)) == ranks  # and the processes go on serving


def _answer() -> int:
    return 1


def _hang() -> int:
    import time

    time.sleep(300)
    return 0


def test_ending_tasks_cancels_only_those_still_running(runner):
    """A cancel that crosses a finishing task's reply can abort Ray's driver, so a task that
    finished within the grace is never cancelled: its answer stays readable."""
    import ray

    done = runner.start_task(_answer, 0)
    hung = runner.start_task(_hang, 1)
    assert ray.get(done, timeout=60) == 1
    assert runner.end_tasks([done, hung], grace_s=1) == [hung]
    assert ray.get(done) == 1
    with pytest.raises(ray.exceptions.RayError):
        ray.get(hung, timeout=60)
    assert runner.end_tasks([], grace_s=1) == []


def test_a_kept_session_is_measured_again_and_let_go_before_a_run_of_its_own(runner):
    """Re-measurement runs that keep their sessions (``rank.kept``) measure a configuration's
    later runs on the session its first built, each configuration on its own; a run that
    keeps nothing lets them all go first (else its process group would be a second one), and
    the next run that keeps builds anew."""
    rerun = QUICK.rerun()
    plain, hooked = config(), config(bucket_cap_mb=5.0, comm_hook="fp16")
    first = run(runner, plain, measure=rerun, keep=True)
    other = run(runner, hooked, measure=rerun, keep=True)
    again = run(runner, plain, measure=rerun, keep=True)
    assert pids(again) == pids(other) == pids(first)
    assert [r.session_runs for r in (*first.ranks, *other.ranks)] == [1, 1, 1, 1]
    assert [r.session_runs for r in again.ranks] == [2, 2] and again.kept and not first.kept
    assert again.ranks[0].applied["comm_hook"] == "none"  # its own session, not the last one's
    assert other.ranks[0].applied["comm_hook"] == "fp16_compress_hook"
    assert len(again.windows) == rerun.rerun_windows and again.throughput > 0
    assert again.ranks[0].peak_memory_mb > 0
    own = run(runner, hooked)  # a session of its own: the kept ones go first
    assert [r.session_runs for r in own.ranks] == [1, 1] and pids(own) == pids(first)
    anew = run(runner, plain, measure=rerun, keep=True)
    assert [r.session_runs for r in anew.ranks] == [1, 1]
    with pytest.raises(ValueError, match="re-measurement run in the pool"):
        run(runner, plain, measure=rerun, keep=True, fresh=True)
