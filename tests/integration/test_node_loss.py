"""A Ray worker node lost in the middle of a trial: the trial FAILs with a reason, and a run
with no room left stops with a clear message, its profile exported.

The cluster is two Ray nodes on this machine, at its own address as any local Ray instance:
a head and a worker with one CPU each, so the two ranks of a trial land one per node."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.conftest import started_run, wait_for
from tests.integration.conftest import trial_running
from tests.integration.raycluster import check_run_stopped_by_node_loss, pids_with, ray_cluster

pytestmark = [pytest.mark.integration, pytest.mark.waits]


@pytest.fixture
def two_nodes():
    with ray_cluster([1, 1]) as cluster:
        yield cluster


def test_losing_a_node_fails_the_trial_and_stops_the_run_with_a_clear_message(two_nodes, run_env):
    # --node-wait 5s: the run stops 5 s after the loss instead of the default 30 s
    p = started_run(
        {**run_env, **two_nodes["env"]},
        "--study",
        "quick",
        "--budget",
        "5m",
        "--node-wait",
        "5s",
        "--address",
        two_nodes["address"],
    )
    try:
        # the next trial runs, a rank on the worker node
        assert wait_for(trial_running(run_env["AUTOTUNE_HOME"], "quick-mlp-gloo-2r"), 60)
        raylets = pids_with(two_nodes["worker_raylets"][0])
        assert raylets, "the worker node's raylet was not found"
        for pid in raylets:
            os.kill(pid, signal.SIGKILL)
        out = p.communicate(timeout=180)[0]
    finally:
        p.kill()
    check_run_stopped_by_node_loss(p, out, Path(run_env["AUTOTUNE_HOME"]), "quick-mlp-gloo-2r")
