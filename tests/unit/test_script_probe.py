"""The script's first measurement on recorded figures: the timed phases of a script's steps and
the link's all-reduces become the limit probe's record, and the screening order comes from it
as in built-in mode (``autotune.script.first_measurement``, ``autotune.search.screening``). The
figures are those of a 14 M-parameter MLP across two lab nodes at 300 Mbit (gloo, one rank
each), and of the same model on loopback, where the link is fast and the step is compute."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.core.config import TrialConfig
from autotune.core.rank_io import RankResult
from autotune.core.results import TrialResult
from autotune.core.target import Target
from autotune.definition.space import SearchSpace
from autotune.limit.evidence import Evidence
from autotune.limit.probe import bounds
from autotune.script.command import phases
from autotune.script.first_measurement import record_of
from autotune.search.screening import plan

GRAD_BYTES = 56_684_548.0  # 6 x Linear(1536, 1536) + head, fp32


def target() -> Target:
    return Target(
        backend="gloo",
        device="cpu",
        world_size=2,
        global_batch=128,
        cpus_per_rank=1,
        ranks_per_node=1,
    )


def config() -> TrialConfig:
    from autotune.core.knobs import KNOBS

    t = target()
    return replace(
        TrialConfig.from_values({n: k.default_for(t) for n, k in KNOBS.items()}, t), env={}
    )


def result(samples_per_s: float) -> TrialResult:
    rank = RankResult(
        rank=0,
        applied={},
        pid=1,
        steps=40,
        samples=40 * 128,
        window_s=10.0,
        windows=[samples_per_s] * 4,
        steps_per_window=10,
        warmup_steps=3,
        stop="converged",
        setup_s=5.0,
        warmup_s=1.0,
        measure_s=10.0,
        loss=0.1,
        loss_curve=[],
        peak_memory_mb=1.0,
    )
    return TrialResult(ranks=[rank], wall_s=20.0)


#: (bytes, seconds) of one all-reduce between two nodes: 300 Mbit/s and about 0.3 ms each.
SLOW_LINK = [(1024, 0.0004), (131072, 0.0039), (4194304, 0.112), (33554432, 0.895)]
#: The same sizes on loopback.
FAST_LINK = [(1024, 0.00005), (131072, 0.0002), (4194304, 0.004), (33554432, 0.03)]


def evidence(got: dict[str, float], link, samples_per_s: float) -> Evidence:
    record = record_of(got, link, result(samples_per_s), config(), world_size=2)
    assert bounds(record)["samples_per_s"] == pytest.approx(samples_per_s, rel=1e-3)
    return Evidence.from_probe(record, device="cpu", noise=0.05)


def test_a_script_whose_step_waits_on_the_link_is_bandwidth_bound_and_screens_the_hook_first():
    # 1.75 s a step: 0.05 forward, 0.1 backward, 1.5 s of all-reduce after it, 0.08 optimizer
    got = {"f": 0.05, "b": 0.1, "x": 1.5, "o": 0.08, "g": GRAD_BYTES, "k": 3, "z": 1.05e6}
    ev = evidence(got, SLOW_LINK, samples_per_s=128 / 1.75)
    assert ev.bound == "bandwidth"
    assert ev.exposed_s == pytest.approx(1.5)
    assert ev.grad_bytes == GRAD_BYTES and ev.buckets == 3
    todo, _ = plan(SearchSpace.load("default").resolve(target()), ev)
    assert todo[0].prior.label == "comm_hook=fp16", [p.prior.label for p in todo]
    assert todo[0].gain > 1.5


def test_a_script_whose_step_is_compute_does_not_screen_compression():
    got = {"f": 0.08, "b": 0.16, "x": 0.001, "o": 0.02, "g": GRAD_BYTES, "k": 3, "z": 1.05e6}
    ev = evidence(got, FAST_LINK, samples_per_s=128 / 0.27)
    assert ev.bound == "compute"
    todo, skipped = plan(SearchSpace.load("default").resolve(target()), ev)
    labels = [p.prior.label for p in todo]
    assert "comm_hook=fp16" not in labels[:1]
    assert "comm_hook=fp16" in [p.prior.label for p in skipped], labels


def test_the_rest_of_the_step_is_data_and_the_phases_are_medians_of_the_measured_steps():
    # the first two steps are warm-up (slow); the measured ones are the last three
    probe = {"f": [9.0, 9.0, 0.1, 0.1, 0.2], "o": [1.0, 1.0, 0.05, 0.05, 0.05]}
    assert phases(probe, 3) == {"f": 0.1, "o": 0.05}
    got = {"f": 0.1, "b": 0.2, "x": 0.0, "o": 0.05, "g": 4e6, "k": 1, "z": 4e6}
    record = record_of(got, FAST_LINK, result(128 / 0.6), config(), world_size=2)
    assert record["ddp"]["data"] == pytest.approx(0.25)  # 0.6 - 0.1 - 0.2 - 0.05
    ev = Evidence.from_probe(record, device="cpu", noise=0.05)
    assert ev.bound == "data"


def test_h_s24_phases_that_do_not_fit_the_step_are_no_breakdown():
    """H-S24."""
    from autotune.core.errors import TrialFailed

    got = {"f": 0.05, "b": 0.1, "x": 2.0, "o": 0.08, "g": GRAD_BYTES, "k": 3, "z": 1.0}
    with pytest.raises(TrialFailed, match="do not fit in its measured step"):
        record_of(got, SLOW_LINK, result(128 / 1.75), config(), world_size=2)


def test_h_s23_no_ray_variable_of_the_driver_reaches_a_nodes_command(monkeypatch):
    """H-S23."""
    import ray

    from autotune.script.nodes import _node_env

    monkeypatch.setattr(ray, "get_gpu_ids", lambda: [])
    env = _node_env({"RAY_AUTH_TOKEN": "secret", "RAY_TMPDIR": "/tmp/x", "PATH": "/bin"})
    assert env.get("PATH") == "/bin" and not [k for k in env if k.startswith("RAY_")]
