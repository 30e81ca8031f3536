"""The ranks' plan on a cluster (CPU share per rank, trials that fit at once), the network
lab's input checks, and the live display with several trials in flight: pure logic."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from autotune import netlab
from autotune.core.errors import ConfigError
from autotune.launch.cluster import RankPlan, rank_plan
from autotune.report.progress import RunView


@pytest.mark.parametrize(
    "nodes, world, backend, placement, trials, want",
    [
        # one 2-core machine, 2 ranks: today's default, 1 CPU each, one trial at a time
        ([{"CPU": 2}], 2, "gloo", "pack", None, RankPlan(1, 2, 1, 1)),
        # a big box: the ranks own its cores between them, still one trial (no sharing)
        ([{"CPU": 16}], 2, "gloo", "pack", None, RankPlan(8, 2, 1, 1)),
        # asked for 2 trials there: the share shrinks to make room
        ([{"CPU": 16}], 2, "gloo", "pack", 2, RankPlan(4, 2, 2, 1)),
        # two 1-CPU nodes (the lab, the node-loss test): one rank per node
        ([{"CPU": 1}, {"CPU": 1}], 2, "gloo", "pack", None, RankPlan(1, 1, 1, 2)),
        ([{"CPU": 1}, {"CPU": 1}], 2, "gloo", "spread", None, RankPlan(1, 1, 1, 2)),
        # four 8-core nodes: packed, one trial per node; spread, one rank per node
        ([{"CPU": 8}] * 4, 2, "gloo", "pack", None, RankPlan(4, 2, 4, 4)),
        ([{"CPU": 8}] * 4, 2, "gloo", "spread", None, RankPlan(8, 1, 2, 4)),
        ([{"CPU": 8}] * 4, 2, "gloo", "strict_spread", None, RankPlan(8, 1, 2, 4)),
        # GPU nodes: a rank per GPU, the node's CPUs shared by its GPUs
        ([{"CPU": 32, "GPU": 8}] * 2, 8, "nccl", "pack", None, RankPlan(4, 8, 2, 2)),
        ([{"CPU": 16, "GPU": 1}], 1, "nccl", "pack", None, RankPlan(16, 1, 1, 1)),
        # nodes without CPUs or (for nccl) GPUs do not count
        ([{"CPU": 8, "GPU": 1}, {"CPU": 8}], 1, "nccl", "pack", None, RankPlan(8, 1, 1, 1)),
        ([{"CPU": 0}, {"CPU": 4}], 2, "gloo", "pack", None, RankPlan(2, 2, 1, 1)),
    ],
)
def test_rank_plan(nodes, world, backend, placement, trials, want):
    assert rank_plan(nodes, world, backend, placement, trials) == want


def test_rank_plan_never_goes_below_one_cpu_or_one_trial():
    plan = rank_plan([{"CPU": 2}], 2, "gloo", "pack", trials=5)
    assert plan.cpus_per_rank == 1 and plan.trials_fit == 1  # 5 do not fit: placement says so
    assert rank_plan([], 2, "gloo").trials_fit == 1


@pytest.mark.parametrize("rate", ["1gbit", "100mbit", "2.5gbit", "800kbit", "1GBIT", "10mbps"])
def test_lab_rates_tc_understands(rate):
    assert netlab.parse_rate(rate) == rate.lower()


@pytest.mark.parametrize("rate", ["fast", "1 gbit", "gbit", "1gb", "-1gbit", ""])
def test_lab_rates_tc_would_refuse_are_one_line_errors(rate):
    with pytest.raises(ConfigError, match=r"--rate .*: not a tc rate; write a number and a unit"):
        netlab.parse_rate(rate)


def test_lab_says_what_the_host_lacks(monkeypatch):
    monkeypatch.setattr(netlab.shutil, "which", lambda tool: None if tool == "tc" else "/x")
    with pytest.raises(ConfigError, match=r"^autotune lab: tc not found; install iproute2"):
        netlab.check_host()
    monkeypatch.setattr(netlab.shutil, "which", lambda tool: "/x")
    monkeypatch.setattr(netlab.os, "geteuid", lambda: 1000)
    with pytest.raises(ConfigError, match=r"need root; run it in a root shell"):
        netlab.check_host()


def test_lab_addresses_stay_in_its_own_subnet():
    assert [netlab.node_ip(i) for i in range(3)] == ["10.213.0.1", "10.213.0.2", "10.213.0.3"]
    assert netlab.Lab(nodes=2, rate="1gbit", cpus_per_node=1).address == "10.213.0.1:6379"
    env = netlab.node_env({"X": "1"})
    assert env["GLOO_SOCKET_IFNAME"] == "lab" and "RAY_ADDRESS" not in env and env["X"] == "1"


def test_the_live_view_shows_every_trial_in_flight():
    view = RunView(Console(file=io.StringIO(), force_terminal=False), budget_s=60)
    view.trial_started("trial 1", "bucket_cap_mb=5")
    view.trial_started("trial 2", "comm_hook=fp16")
    lines = [str(x) for x in view.status_lines()[1:]]
    assert lines == ["running trial 1: bucket_cap_mb=5", "running trial 2: comm_hook=fp16"]
    view.trial_finished("complete", 1.2, 1, "trial 1")
    assert [str(x) for x in view.status_lines()[1:]] == ["running trial 2: comm_hook=fp16"]
    view.trial_finished("failed", None, 2, "trial 2")
    assert view.status_lines()[1:] == [] and view.counts == {"complete": 1, "failed": 1}


def test_local_ranks_count_the_ranks_of_each_node_in_rank_order():
    from autotune.launch.launcher import local_ranks

    assert local_ranks({0: "a", 1: "a"}, 2) == [(0, 2), (1, 2)]
    assert local_ranks({0: "a", 1: "b", 2: "a", 3: "b"}, 4) == [(0, 2), (0, 2), (1, 2), (1, 2)]
    assert local_ranks({}, 2) == [(0, 2), (1, 2)]  # nodes unknown: one node


def test_the_processes_of_a_local_instance_are_found_by_its_mark_or_its_session(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from autotune.launch.cluster import OWNER_ENV, owned_processes, session_dirs
    from tests.conftest import wait_for

    ours = tmp_path / "ray" / "session_2026-11-25_06-45-09_749085_100"
    theirs = tmp_path / "ray" / "session_2026-11-25_07-00-00_000001_200"
    for d in (ours, theirs):
        (d / "logs").mkdir(parents=True)
        (d / "logs" / "agent.log").write_text("")

    def start(argv0: str, log, **kw):
        """A process named argv0 holding log open (as a raylet's agent holds its log)."""
        script = f'exec -a "{argv0}" tail -f {log}'
        return subprocess.Popen(["bash", "-c", script], **kw)

    env = {**os.environ, OWNER_ENV: "run-1"}
    marked = subprocess.Popen(["sleep", "30"], env=env)
    other_run = subprocess.Popen(["sleep", "30"], env={**env, OWNER_ENV: "run-2"})
    # the raylet names its session on its command line
    raylet = subprocess.Popen(
        ["bash", "-c", f'exec -a /opt/ray/raylet {sys.executable} -c "import time; time.sleep(30)" '
         f"--raylet_socket_name={ours}/sockets/raylet"]
    )  # fmt: skip
    agent = start("ray::DashboardAgent", ours / "logs" / "agent.log")  # environment unmarked
    their_agent = start("ray::DashboardAgent", theirs / "logs" / "agent.log")
    users_tail = start("tail", ours / "logs" / "agent.log")  # someone reading the log
    procs = [marked, other_run, raylet, agent, their_agent, users_tail]

    def ready() -> bool:
        """Every exec has happened and every ``tail`` holds its log open."""
        try:
            named = all(
                Path(f"/proc/{q.pid}/cmdline").read_bytes().split(b"\0")[0] == name
                for q, name in ((raylet, b"/opt/ray/raylet"), (agent, b"ray::DashboardAgent"),
                                (their_agent, b"ray::DashboardAgent"), (users_tail, b"tail"))
            )  # fmt: skip
            fds = (Path(f"/proc/{q.pid}/fd") for q in (agent, their_agent, users_tail))
            held = all(any(os.readlink(f).endswith("agent.log") for f in d.iterdir()) for d in fds)
        except OSError:
            return False
        return named and held

    try:
        assert wait_for(ready, 30)  # the execs have happened, the files are open
        assert session_dirs([raylet.pid]) == {str(ours)}
        assert session_dirs([agent.pid]) == {str(ours)}
        found = set(owned_processes("run-1", {str(ours)}))
        assert {marked.pid, raylet.pid, agent.pid} <= found
        assert not {other_run.pid, their_agent.pid, users_tail.pid, os.getpid()} & found
        # without the session, only the mark counts
        assert marked.pid in owned_processes("run-1") and agent.pid not in owned_processes("run-1")
    finally:
        for p in procs:
            p.kill()
            p.wait()
