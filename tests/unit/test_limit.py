"""``autotune.limit.probe``'s arithmetic on probe records written by hand: the compute ceiling, the
ideal-overlap bound, the shares, the bus bandwidth, the advice, and which profile gets the
record. (The probe itself runs in ``tests/integration/test_limit.py``.)"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest

from autotune.core.config import TrialConfig
from autotune.limit.evidence import Evidence
from autotune.limit.probe import (
    WORTH,
    bounds,
    breakdown,
    measure_limit,
    next_step,
    no_gain,
    summary_line,
)
from autotune.profile.export import limit_of
from tests.conftest import edited

RECORD = {
    "world_size": 2,
    "samples_per_step": 64,
    "accumulation_steps": 1,
    "ddp": {"data": 0.001, "forward": 0.002, "backward": 0.010, "optimizer": 0.002, "step": 0.015},
    "compute": {
        "data": 0.001,
        "forward": 0.002,
        "backward": 0.004,
        "optimizer": 0.002,
        "step": 0.009,
    },
    "comm": {"comm_s": 0.008, "last_bucket_s": 0.002, "wire_bytes": 4_000_000},
}


def record(**changes) -> dict:
    return edited(RECORD, **changes)


def test_the_bounds_of_a_communication_heavy_step():
    b = bounds(RECORD)
    assert b["samples_per_s"] == pytest.approx(64 / 0.015, abs=0.01)
    assert b["compute_ceiling"] == pytest.approx(64 / 0.009, abs=0.01)
    # the all-reduce (8 ms) sticks out of the backward it overlaps (4 ms) by 4 ms
    assert b["ideal_bound"] == pytest.approx(64 / 0.013, abs=0.01)
    assert b["share_of_ideal"] == pytest.approx(0.013 / 0.015, abs=1e-4)
    assert b["share_of_ceiling"] == pytest.approx(0.009 / 0.015, abs=1e-4)
    # DDP's backward waited 6 ms on the all-reduce: 2 of its 8 ms were hidden
    assert b["comm_share"] == pytest.approx(0.008 / 0.015, abs=1e-4)
    assert b["hidden_share"] == pytest.approx(0.25, abs=1e-4)
    assert b["exposed_comm_share"] == pytest.approx(0.006 / 0.015, abs=1e-4)
    # 2 ranks: the ring moves 2(n-1)/n = 1 x the bytes; 4 MB in 8 ms is 4 Gbit/s
    assert b["busbw_gbit_s"] == pytest.approx(4.0, abs=1e-4)


def test_a_small_all_reduce_leaves_only_the_last_bucket_exposed():
    b = bounds(record(comm__comm_s=0.001, comm__last_bucket_s=0.0005))
    assert b["ideal_bound"] == pytest.approx(64 / 0.0095, abs=0.01)


def test_with_accumulation_only_the_last_micro_steps_backward_hides_the_all_reduce():
    b = bounds(record(accumulation_steps=2))
    # backward 4 ms over 2 micro-steps: 2 ms overlap the 8 ms all-reduce, 6 ms stick out
    assert b["ideal_bound"] == pytest.approx(64 / 0.015, abs=0.01)


def test_the_bus_bandwidth_follows_the_ring_factor_and_is_none_for_one_rank():
    four = bounds(record(world_size=4))
    assert four["busbw_gbit_s"] == pytest.approx(4.0 * 1.5, abs=1e-4)  # 2(n-1)/n = 1.5
    one = bounds(record(world_size=1))
    assert one["busbw_gbit_s"] is None


def test_communication_that_took_longer_in_training_than_alone_counts_whole():
    # the backward waited 9 ms, longer than the all-reduce alone (6 ms): nothing was hidden
    b = bounds(record(ddp__backward=0.013, ddp__step=0.018, comm__comm_s=0.006))
    assert b["hidden_share"] == 0
    assert b["comm_share"] == pytest.approx(0.009 / 0.018, abs=1e-4)


def test_the_breakdown_adds_up_to_the_phases_of_the_ddp_step():
    parts = breakdown(RECORD)
    assert parts["exposed_comm"] == pytest.approx(0.006)
    assert parts["backward"] == 0.004
    phases = ("data", "forward", "backward", "optimizer")
    assert sum(parts.values()) == pytest.approx(sum(RECORD["ddp"][p] for p in phases))


def test_the_advice_follows_where_the_time_goes():
    plain = TrialConfig(comm_hook={"name": "none"}, precision="fp32")
    fp16 = TrialConfig(comm_hook={"name": "fp16"}, precision="bf16")
    assert next_step(RECORD, plain).startswith("compression")
    # with compression on, what sticks out of the backward is what smaller buckets can hide
    # (40 MB of gradients: buckets of 5 MB split them where 25 MB ones do not)
    assert next_step(record(comm__wire_bytes=40_000_000), fp16).startswith("smaller buckets")
    # 4 MB of gradients are DDP's 1 MiB first bucket and one more at 5 MB or at 25 MB alike
    assert not next_step(RECORD, fp16).startswith("smaller buckets")
    five = TrialConfig(
        comm_hook={"name": "fp16"},
        precision="bf16",
        ddp={"bucket_cap_mb": 5.0},
        data={"num_workers": 2},
    )
    assert next_step(RECORD, five).startswith("a faster link")
    assert next_step(RECORD, five, free_batch=True).startswith("accumulation")
    hidden = record(ddp__backward=0.004, ddp__step=0.009, comm__comm_s=0.002)
    assert next_step(hidden, plain).startswith("lower precision")
    tuned = TrialConfig(precision="bf16", data={"num_workers": 2})
    assert next_step(hidden, tuned).startswith("compute-bound: little")
    slow_data = record(ddp__backward=0.004, ddp__data=0.004, ddp__step=0.012)
    assert next_step(slow_data, plain).startswith("the data pipeline")
    # one rank never waits on an all-reduce
    assert not next_step(record(world_size=1), plain).startswith("compression")


def test_the_advice_never_names_what_the_run_measured_as_no_gain():
    plain = TrialConfig(comm_hook={"name": "none"}, precision="fp32")
    assert next_step(RECORD, plain).startswith("compression")
    told = next_step(RECORD, plain, ruled_out=frozenset({"comm_hook"}))
    assert "compression" not in told and "comm hook" not in told


def test_the_advice_says_why_from_the_breakdown():
    told = next_step(RECORD, TrialConfig(comm_hook={"name": "none"}, precision="fp32"))
    # 8 ms of all-reduce, all of it bytes (one size measured): half saved, 6 ms exposed caps it
    assert told == (
        "compression (a comm hook: fp16 or PowerSGD), up to 1.36x: the "
        "all-reduce's bytes take 8 ms of a 15 ms step"
    )


#: A tiny model (Linear(1024, 1)): a 4 KB all-reduce, 68 % of the step, in one bucket; two
#: message sizes measured (1 KiB and the gradients' 4 KiB), their times within noise of each
#: other, the larger one slower by the noise: the fit gives it a slope.
TINY = record(
    ddp__backward=0.0075,
    ddp__step=0.01,
    ddp__forward=0.001,
    ddp__optimizer=0.0005,
    ddp__data=0.001,
    compute__backward=0.0007,
    comm__comm_s=0.0068,
    comm__last_bucket_s=0.0068,
    comm__buckets=1,
    comm__wire_bytes=4096,
    comm__fit_bytes=[1024, 4096],
    comm__fit_s=[0.006, 0.0075],
)


def test_a_latency_bound_all_reduce_is_not_told_to_compress():
    ev = Evidence.from_probe(TINY, device="cpu", noise=0.0)
    assert ev.bound == "latency" and ev.latency_dominated
    # the screening's optimistic bound still sees 7 % in the fit's noise; the advice does not
    assert ev.compressed() > WORTH and ev.compressed_surely() == 1.0
    config = TrialConfig(comm_hook={"name": "none"}, precision="bf16", data={"num_workers": 2})
    told = next_step(TINY, config)
    assert "compression" not in told and "comm hook" not in told, told
    # nor smaller buckets (4 KB are one bucket at any cap): what bounds it is latency
    assert told.startswith("a link with less latency, or fewer all-reduces per sample"), told
    assert "1 message(s) of 4 KiB" in told and "6 ms each" in told


def test_fp16_measured_at_0_97x_on_a_latency_bound_step_is_never_advised():
    """Issue 32: the run measured the fp16 hook at 0.97x, then its limit line said 'next:
    compression'. Both rules hold it off: the latency, and the screening's verdict."""
    study = optuna.create_study(direction="maximize")
    effect = {
        "label": "comm_hook=fp16",
        "trial": 3,
        "state": "COMPLETE",
        "speedup": 0.97,
        "interval": {"median": 97.0, "low": 95.0, "high": 99.0, "n": 5, "rel_half_width": 0.02},
        "helps": False,
        "moves": {"comm_hook": "fp16"},
        "reason": "",
    }
    study.set_user_attr("screening", {"comm_hook=fp16": effect})
    assert no_gain(study) == {"comm_hook"}
    base = TrialConfig(comm_hook={"name": "none"})
    probed = measure_limit(
        study,
        _measurer(TINY),
        configs={"baseline": base},
        trials={"baseline": 0},
        trace_dir=None,
        emit=lambda e: None,
    )
    assert "compress" not in probed["baseline"]["next"]
    line = summary_line(study.user_attrs["limit"])
    assert "compression" not in line and "comm hook" not in line
    # the same run on a bandwidth-bound step still rules compression out: it was measured
    probed = measure_limit(
        study,
        _measurer(RECORD),
        configs={"baseline": base},
        trials={"baseline": 0},
        trace_dir=None,
        emit=lambda e: None,
    )
    assert "compression" not in probed["baseline"]["next"]


def test_a_bandwidth_bound_step_with_compression_unmeasured_is_told_to_compress():
    study = optuna.create_study(direction="maximize")
    assert no_gain(study) == frozenset()
    probed = measure_limit(
        study,
        _measurer(RECORD),
        configs={"baseline": TrialConfig()},
        trials={"baseline": 0},
        trace_dir=None,
        emit=lambda e: None,
    )
    assert probed["baseline"]["next"].startswith("compression (a comm hook")


def test_a_screened_knob_whose_interval_does_not_clear_1_is_no_gain():
    study = optuna.create_study(direction="maximize")
    within = {
        "label": "bucket_cap_mb=5",
        "trial": 4,
        "state": "COMPLETE",
        "speedup": 1.03,
        "interval": {"median": 103.0, "low": 97.0, "high": 109.0, "n": 5, "rel_half_width": 0.06},
        "helps": True,
        "moves": {"bucket_cap_mb": 5.0},
        "reason": "",
    }
    clear = dict(within, label="precision=bf16", speedup=1.3, moves={"precision": "bf16"})
    failed = dict(
        within,
        label="comm_hook=fp16",
        state="FAIL",
        speedup=None,
        helps=False,
        interval=None,
        moves={"comm_hook": "fp16"},
    )
    study.set_user_attr("screening", {x["label"]: x for x in (within, clear, failed)})
    # 1.03x +-6 %: the low end is below 1; bf16's is not; a failed trial measured nothing
    assert no_gain(study) == {"bucket_cap_mb"}


def _measurer(limit: dict):
    def measure(trial, config, limit=None):
        return SimpleNamespace(ranks=[SimpleNamespace(limit=copy.deepcopy(probe), measure_s=1.0)])

    probe = limit
    return measure


def test_the_summary_line_speaks_of_the_tuned_step_or_else_the_defaults():
    probed = {**RECORD, "bounds": bounds(RECORD), "next": "compression (a comm hook)"}
    line = summary_line({"baseline": probed, "tuned": probed})
    assert line.startswith("Limit: the tuned step is 53% communication, 25% of it hidden;")
    assert "87% of the ideal-overlap bound (1.15x more possible)" in line
    assert "60% of the compute ceiling" in line and line.endswith("next: compression (a comm hook)")
    assert summary_line({"baseline": probed}).startswith("Limit: the default step")
    assert summary_line({"baseline": {"failed": "timeout: no result"}}) is None
    one = record(world_size=1)
    alone = summary_line({"tuned": {**one, "bounds": bounds(one), "next": "compute-bound"}})
    assert alone.startswith(
        "Limit: the tuned step is one rank, no link to cross: DDP's own bucketing costs 40%;"
    )


def test_a_profile_carries_the_limit_of_its_own_configuration_only():
    tuned = TrialConfig(comm_hook={"name": "fp16"})
    study = optuna.create_study()
    assert limit_of(study, tuned) is None
    probed = {**RECORD, "bounds": bounds(RECORD), "config": tuned.to_dict(), "trial": 4}
    study.set_user_attr(
        "limit",
        {"baseline": {**probed, "config": TrialConfig().to_dict()}, "tuned": probed, "cost_s": 7.5},
    )
    got = limit_of(study, tuned)
    assert got["tuned"]["trial"] == 4 and got["cost_s"] == 7.5
    assert got["tuned"]["bounds"] == bounds(RECORD) and "baseline" in got
    assert limit_of(study, TrialConfig(comm_hook={"name": "none"})) is None  # another config
    study.set_user_attr("limit", "not a record")  # someone else's database
    assert limit_of(study, tuned) is None


def test_a_screening_trial_below_the_defaults_rules_its_knob_out_without_a_screening_record():
    """A run whose search stopped inside the screening (a short budget) has no screening
    record: its screening trials themselves rule out what they measured as no gain (fp16 at
    0.95x, as in a 1-minute quick run whose advice still said compression), and keep what
    helped beyond its noise."""
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    from autotune.limit.probe import no_gain

    dist = {
        "comm_hook": CategoricalDistribution(["none", "fp16"]),
        "precision": CategoricalDistribution(["fp32", "bf16"]),
    }
    study = optuna.create_study(direction="maximize")
    noise = {"rel_half_width": 0.02}
    rows = [
        ({"comm_hook": "none", "precision": "fp32"}, 100.0, {"baseline": True}),
        (
            {"comm_hook": "fp16", "precision": "fp32"},
            95.0,
            {"screen": "comm_hook=fp16", "interval": noise},
        ),
        (
            {"comm_hook": "none", "precision": "bf16"},
            130.0,
            {"screen": "precision=bf16", "interval": noise},
        ),
    ]
    for params, value, attrs in rows:
        study.add_trial(
            create_trial(
                params=params,
                distributions=dist,
                value=value,
                user_attrs=attrs,
                state=TrialState.COMPLETE,
            )
        )
    assert no_gain(study) == {"comm_hook"}


def test_a_traced_probe_whose_rank_crashed_is_taken_again_without_the_trace(tmp_path):
    """torch.profiler's results have crashed a rank process as it freed them: the figures are
    measured once more without the trace, and the record and a line say so; any other
    failure, or a crash without a trace, is the probe's failure."""
    from autotune.core.errors import FailureReason, TrialFailed
    from autotune.limit.probe import probe_one

    asked: list = []

    def measure(trial, config, limit=None):
        asked.append(limit["trace"])
        if limit["trace"] is not None:  # rank 0 wrote its trace, then a rank died
            Path(limit["trace"]).write_text("{}")
            raise TrialFailed(FailureReason.CRASH, "rank 1: its process died")
        return SimpleNamespace(ranks=[SimpleNamespace(limit=copy.deepcopy(RECORD), measure_s=1.0)])

    trace = tmp_path / "baseline.trace.json"
    got = probe_one(measure, 0, TrialConfig(), trace=trace)
    assert asked == [str(trace), None]
    assert got["untraced"] == "the traced probe failed (crash: rank 1: its process died)"
    assert got["bounds"] == bounds(RECORD) and got["trace"] is None and not trace.exists()

    def crashes(trial, config, limit=None):
        asked.append(limit["trace"])
        raise TrialFailed(FailureReason.CRASH, "rank 0: its process died")

    asked.clear()
    with pytest.raises(TrialFailed, match="rank 0: its process died"):
        probe_one(crashes, 0, TrialConfig(), trace=None)  # no trace to leave out: once
    assert asked == [None]
    asked.clear()
    with pytest.raises(TrialFailed, match="rank 0: its process died"):
        probe_one(crashes, 0, TrialConfig(), trace=trace)  # once more untraced, then failed
    assert asked == [str(trace), None]

    said: list = []
    study = optuna.create_study(direction="maximize")
    measure_limit(
        study,
        measure,
        configs={"baseline": TrialConfig()},
        trials={"baseline": 0},
        trace_dir=tmp_path,
        emit=said.append,
    )
    assert [e.text for e in said] == [
        "The limit probe of the defaults was taken again without its trace: the traced probe "
        "failed (crash: rank 1: its process died)"
    ]

    def times_out(trial, config, limit=None):
        asked.append(limit["trace"])
        raise TrialFailed(FailureReason.TIMEOUT, "no result in 60 s")

    asked.clear()
    with pytest.raises(TrialFailed, match="no result"):
        probe_one(times_out, 0, TrialConfig(), trace=trace)
    assert asked == [str(trace)]  # not taken again: only a crash is the profiler's


def test_a_knob_the_ablation_dropped_is_no_gain_for_the_advice():
    """The README's run: 5 MB buckets helped in the screening (1.04x) and the ablation dropped
    them (1.045x, interval 0.865-1.262): the advice then said 'next: smaller buckets'."""
    from autotune.record.attrs import AblationRecord, Contribution, save

    study = optuna.create_study(direction="maximize")
    assert no_gain(study) == frozenset()
    save(
        study,
        AblationRecord(
            trial=7,
            rounds=3,
            order=["winner", "without bucket_cap_mb"],
            measurements={"winner": [802.0], "without bucket_cap_mb": [836.9]},
            contributions={
                "bucket_cap_mb": Contribution(value=5.0, kept=False, speedup=[0.87, 1.05, 1.26]),
                "precision": Contribution(value="bf16", kept=True, speedup=[1.15, 1.21, 1.28]),
            },
            dropped=["bucket_cap_mb"],
            together=False,
            joint=None,
            params={"precision": "bf16"},
            config={"precision": "bf16"},
        ),
    )
    assert no_gain(study) == {"bucket_cap_mb"}


def test_the_probe_times_eight_steps_unless_fewer_slow_ones_take_long_enough():
    """Two windows' worth of DDP steps, at least 8 (3 fast steps read 268 samples/s where the
    trials read 350-377); where steps are slow, as many as take 4 s do, never fewer than 4."""
    from autotune.rank.limit_probe import FEWEST_STEPS, MIN_STEPS, PROBE_S, probe_steps

    assert probe_steps(2, 0.21) == MIN_STEPS  # the default MLP on loopback: 1.7 s
    assert probe_steps(10, 0.05) == 20  # two windows' worth above the floor
    assert probe_steps(2, 0.71) == math.ceil(PROBE_S / 0.71) == 6  # the lab at 1 Gbit
    assert probe_steps(2, 1.26) == FEWEST_STEPS == 4  # 500 Mbit: 5 s
    assert probe_steps(2, 2.04) == 4 and probe_steps(3, 2.04) == 6  # never under two windows
    assert probe_steps(1000, 0.001) == 200  # MAX_STEPS
    assert probe_steps(2, 0.0) == MIN_STEPS  # a step too quick to time


def test_the_first_measurement_times_the_probes_fewest_steps():
    """The first measurement (the defaults' probe that orders the screening) times the
    probe's fewest steps at the baseline's step time, not two windows' worth and not "about
    8 s" of them: at 500 Mbit (1.3 s a step) a real run's first measurement took 24 s with 7
    steps, where the probe's own rule takes 4."""
    from autotune.rank.limit_probe import MIN_STEPS, least_steps
    from autotune.search.first_look import probe_steps

    batch = 128
    assert probe_steps(batch / 1.29, batch) == least_steps(1.29) == 4  # 500 Mbit
    assert probe_steps(batch / 0.72, batch) == 6  # 1 Gbit: 4 s of steps
    assert probe_steps(batch / 0.21, batch) == MIN_STEPS  # loopback: 8, not two windows
    assert probe_steps(batch / 2.03, batch) == 4  # 300 Mbit: never fewer than 4
    assert probe_steps(None, batch) is None and probe_steps(0.0, batch) is None


def test_the_reused_probe_of_the_defaults_names_the_trace_this_run_took_or_takes_one(tmp_path):
    """The first measurement takes no trace (every screening trial waits for it): the limit
    record of the defaults, reused from it, names the trace the re-validation's first run of
    the defaults wrote, or else one taken at the end in a run of its own, once more untraced
    where that run's rank crashed (torch.profiler), or none, said, where it failed."""
    from autotune.core.config import MeasureSettings
    from autotune.core.errors import FailureReason, TrialFailed
    from autotune.record.attrs import FirstMeasurement, save

    first = {**RECORD, "trial": 0, "config": TrialConfig().to_dict(), "trace": None}
    rerun = MeasureSettings(min_windows=1, max_windows=3)
    asked: list = []

    def measure(trial, config, limit=None, measure=None, trace=None):
        assert limit is None, "the defaults' figures are reused, not probed again"
        asked.append((trial, measure, trace))
        if trace is not None:
            trace.write_text('{"traceEvents": []}')
        return SimpleNamespace(ranks=[SimpleNamespace(limit=None, measure_s=1.0)])

    def probe(study, m, traced=None, trace_dir=tmp_path, emit=lambda e: None):
        return measure_limit(
            study,
            m,
            configs={"baseline": TrialConfig()},
            trials={"baseline": 0},
            trace_dir=trace_dir,
            emit=emit,
            traced=traced,
            rerun=rerun,
        )

    study = optuna.create_study(direction="maximize")
    save(study, FirstMeasurement(evidence={}, probe=first))
    taken = tmp_path / "revalidated.trace.json"
    got = probe(study, measure, traced={"baseline": taken})
    assert asked == [] and got["baseline"]["trace"] == str(taken)  # no run: the figures reused
    assert got["baseline"]["bounds"] == bounds(RECORD)
    assert study.user_attrs["limit"]["baseline"]["trace"] == str(taken)

    got = probe(study, measure)  # nothing re-validated: a run of the defaults takes it
    path = tmp_path / "baseline.trace.json"
    assert asked == [(0, rerun, path)] and got["baseline"]["trace"] == str(path)
    assert path.exists()

    asked.clear()
    assert probe(study, measure, trace_dir=None)["baseline"]["trace"] is None and asked == []
    untaken = measure_limit(  # the run's budget holds no run for it (tuner._limit)
        study,
        measure,
        configs={"baseline": TrialConfig()},
        trials={"baseline": 0},
        trace_dir=tmp_path,
        emit=lambda e: None,
        rerun=None,
    )
    assert untaken["baseline"]["trace"] is None and asked == []

    def crashes_traced(trial, config, limit=None, measure=None, trace=None):
        asked.append(trace)
        if trace is not None:  # rank 0 wrote its trace, then a rank died
            trace.write_text("{}")
            raise TrialFailed(FailureReason.CRASH, "rank 1: its process died")
        return SimpleNamespace(ranks=[SimpleNamespace(limit=None, measure_s=1.0)])

    said: list = []
    got = probe(study, crashes_traced, emit=said.append)
    assert asked == [path, None] and got["baseline"]["trace"] is None and not path.exists()
    assert [e.text for e in said] == [
        "The run of trial 0 that took the Chrome trace failed (crash: rank 1: its process "
        "died); measured again without the trace"
    ]

    def times_out(trial, config, limit=None, measure=None, trace=None):
        raise TrialFailed(FailureReason.TIMEOUT, "no result in 60 s")

    said.clear()
    got = probe(study, times_out, emit=said.append)
    assert got["baseline"]["trace"] is None and got["baseline"]["bounds"] == bounds(RECORD)
    assert [e.text for e in said] == [
        "No Chrome trace of trial 0: its run failed (timeout: no result in 60 s)"
    ]
