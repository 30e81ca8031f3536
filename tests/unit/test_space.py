"""Search-space YAML <-> Optuna distributions, resolution per backend, legality."""

import dataclasses

import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from autotune.core.errors import ConfigError
from autotune.core.knobs import KNOBS
from autotune.core.target import Target
from autotune.definition.distributions import distribution_from_yaml, distribution_to_yaml
from autotune.definition.space import SearchSpace
from autotune.search.samplers import make_sampler

CPU = Target(
    backend="gloo",
    device="cpu",
    world_size=2,
    global_batch=128,
    cpus_per_rank=1,
    bf16=True,
    bf16_native=True,  # AVX512-BF16 or AMX
    tf32=False,
)
GPU = Target(
    backend="nccl",
    device="cuda",
    world_size=8,
    global_batch=512,
    cpus_per_rank=4,
    bf16=True,
    tf32=True,
)


def space(text: str) -> SearchSpace:
    return SearchSpace.from_mapping(yaml.safe_load(text), where="space.yaml")


@pytest.mark.parametrize(
    "spec, expected",
    [
        (
            {"type": "float", "low": 1, "high": 400, "log": True},
            FloatDistribution(1.0, 400.0, log=True),
        ),
        (
            {"type": "float", "low": 0.5, "high": 2.5, "step": 0.5},
            FloatDistribution(0.5, 2.5, step=0.5),
        ),
        ({"type": "int", "low": 0, "high": 8, "step": 2}, IntDistribution(0, 8, step=2)),
        ({"type": "int", "low": 1, "high": 64, "log": True}, IntDistribution(1, 64, log=True)),
        (
            {"type": "categorical", "choices": ["default", 128, True]},
            CategoricalDistribution(["default", 128, True]),
        ),
    ],
)
def test_yaml_and_distributions_round_trip_both_ways(spec, expected):
    dist = distribution_from_yaml(spec, where="x")
    assert dist == expected
    back = distribution_to_yaml(dist)
    assert distribution_from_yaml(back, where="x") == expected
    assert distribution_from_yaml(yaml.safe_load(yaml.safe_dump(back)), where="x") == expected


def test_default_space_parses_into_optuna_distributions_and_dumps_back():
    s = SearchSpace.load("default")
    assert set(s.distributions) == set(KNOBS)  # the default space searches every knob
    assert s.distributions["bucket_cap_mb"] == FloatDistribution(1.0, 400.0, log=True)
    assert isinstance(s.distributions["NCCL_ALGO"], CategoricalDistribution)
    again = SearchSpace.from_mapping(s.to_mapping(), where="dumped")
    assert dict(again.distributions) == dict(s.distributions)


@pytest.mark.parametrize(
    "text, message",
    [
        ("ddp: {bucket_cap_mb: {type: float, low: 400, high: 1}}", r"low.*high.*400.*1"),
        (
            "ddp: {bucket_cap_mb: {type: float, lo: 1, high: 4}}",
            r"ddp.bucket_cap_mb: unknown key 'lo'",
        ),
        (
            "ddp: {bucket_size: {type: float, low: 1, high: 4}}",
            r"section 'ddp': unknown key 'bucket_size'",
        ),
        ("network: {x: 1}", r"unknown key 'network'"),
        (
            "ddp: {bucket_cap_mb: {type: uniform, low: 1, high: 4}}",
            r"type must be float, int or categorical",
        ),
        ("ddp: {static_graph: {type: int, low: 0, high: 1}}", r"needs type: categorical"),
        (
            "nccl: {NCCL_NTHREADS: {type: categorical, choices: [default, 100]}}",
            r"100 is not a legal value",
        ),
        ("data: {num_workers: {type: float, low: 0, high: 4}}", r"must be an integer"),
        ("ddp: {comm_hook: {type: categorical, choices: [none, none]}}", r"must not repeat"),
        ("ddp: {comm_hook: {type: categorical, choices: []}}", r"non-empty list"),
        ("description: only words", r"no dimensions"),
    ],
)
def test_bad_spaces_are_one_line_errors_naming_the_key(text, message):
    with pytest.raises(ConfigError, match=message) as e:
        space(text)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith("space.yaml")


def test_space_must_contain_the_default_because_the_baseline_is_a_point_of_it():
    s = space("ddp: {bucket_cap_mb: {type: float, low: 50, high: 200}}")
    with pytest.raises(ConfigError, match=r"ddp.bucket_cap_mb must contain the default 25"):
        s.resolve(CPU)
    s = space("nccl: {NCCL_ALGO: {type: categorical, choices: [Ring, Tree]}}")
    with pytest.raises(ConfigError, match=r"contain the default 'default'"):
        s.resolve(GPU)


def test_a_knob_given_one_value_that_is_not_its_default_is_refused_not_dropped():
    """The value was asked for: dropping the knob as "only fp16 is possible here" would run
    the default in every trial without trying it."""
    s = space("ddp: {comm_hook: {type: categorical, choices: [fp16]}}")
    with pytest.raises(ConfigError, match=r"ddp.comm_hook has the one value 'fp16', not the "):
        s.resolve(CPU)
    # one value that is the default stays a knob with nothing to search, left out saying so
    r = space(
        "ddp: {comm_hook: {type: categorical, choices: [none]}, "
        "bucket_cap_mb: {type: categorical, choices: [5.0, 25.0]}}"
    ).resolve(CPU)
    assert "comm_hook" not in r.distributions
    said = [d.reason for d in r.dropped if d.name == "comm_hook"]
    assert said == ["only 'none' is possible here"]
    # a value the hardware took away leaves one that is no choice of the user's: left out too
    r = space(
        "precision: {precision: {type: categorical, choices: [fp32, tf32]}}\n"
        "ddp: {bucket_cap_mb: {type: categorical, choices: [5.0, 25.0]}}"
    ).resolve(CPU)
    assert "precision" not in r.distributions


def test_gloo_on_cpu_leaves_out_what_cannot_act_and_says_why():
    r = SearchSpace.load("default").resolve(CPU)
    whole = {d.name: d.reason for d in r.dropped if d.whole}
    parts = {(d.name, d.choice): d.reason for d in r.dropped if not d.whole}
    for name in (k for k in KNOBS if k.startswith("NCCL_")):
        assert name in whole and "nccl backend" in whole[name]
        assert name not in r.distributions
    assert "pin_memory" in whole and "threads" in whole
    assert "bf16_compress_hook without NCCL" in parts[("comm_hook", "bf16")]
    assert ("precision", "tf32") in parts and ("precision", "fp16") in parts
    assert "pytorch#58467" in parts[("comm_hook", "powersgd")]
    assert r.distributions["comm_hook"].choices == ("none", "fp16")
    assert r.distributions["precision"].choices == ("fp32", "bf16")
    # a CPU without bf16 units emulates it: left out, saying so, as fp16 is
    emulated = SearchSpace.load("default").resolve(dataclasses.replace(CPU, bf16_native=False))
    assert "precision" not in emulated.distributions  # fp32 alone is left
    said = {(d.name, d.choice): d.reason for d in emulated.dropped if not d.whole}
    assert "no bf16 units" in said[("precision", "bf16")]
    # 128 and 256 do not divide the per-rank batch of 64
    assert r.distributions["micro_batch"].choices == (8, 16, 32, 64)


def test_nccl_on_gpu_keeps_nccl_knobs_and_bounds_threads_by_cpus():
    r = SearchSpace.load("default").resolve(GPU)
    assert {n for n in KNOBS if n.startswith("NCCL_")} <= set(r.distributions)
    assert r.distributions["comm_hook"].choices == ("none", "fp16", "bf16", "powersgd")
    assert r.distributions["precision"].choices == ("fp32", "tf32", "bf16", "fp16")
    assert r.distributions["threads"] == IntDistribution(1, 4)
    assert "pin_memory" in r.distributions


def test_micro_batch_keeps_divisors_and_always_offers_accumulation_one():
    s = space("batch: {micro_batch: {type: categorical, choices: [8, 16, 32, 64]}}")
    t = Target(backend="gloo", device="cpu", world_size=2, global_batch=96, cpus_per_rank=1)
    r = s.resolve(t)
    assert r.distributions["micro_batch"].choices == (8, 16, 48)
    assert r.baseline_params() == {"micro_batch": 48}
    s = space("batch: {micro_batch: {type: int, low: 4, high: 16}}")
    assert s.resolve(t).distributions["micro_batch"].choices == (4, 6, 8, 12, 16, 48)


def test_baseline_params_are_the_defaults_and_a_point_of_the_space():
    r = SearchSpace.load("default").resolve(GPU)
    base = r.baseline_params()
    assert base["bucket_cap_mb"] == 25.0 and base["comm_hook"] == "none"
    assert base["micro_batch"] == 64 and base["precision"] == "fp32"
    assert base["NCCL_ALGO"] == "default" and base["threads"] == 1
    assert "powersgd_rank" not in base and "prefetch_factor" not in base  # conditional
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial(base)
    trial = study.ask()
    assert r.suggest(trial) == r.defaults()


def test_conditional_dimensions_are_suggested_only_under_their_parent():
    r = SearchSpace.load("default").resolve(CPU)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(40):
        t = study.ask()
        values = r.suggest(t)
        assert ("prefetch_factor" in t.params) == (values["num_workers"] > 0)
        # static_graph only without accumulation (torch's reducer asserts under no_sync)
        assert ("static_graph" in t.params) == (values["micro_batch"] == 64)
        assert r.illegal(values) is None
        study.tell(t, 1.0)


def test_powersgd_rank_is_suggested_only_with_powersgd():
    r = SearchSpace.load("comm").resolve(GPU)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=2))
    seen = set()
    for _ in range(30):
        t = study.ask()
        values = r.suggest(t)
        assert ("powersgd_rank" in t.params) == (values["comm_hook"] == "powersgd")
        seen.add(values["comm_hook"])
        study.tell(t, 1.0)
    assert "powersgd" in seen


def test_documented_nccl_rules_are_enforced():
    r = SearchSpace.load("default").resolve(GPU)
    v = r.defaults()
    assert r.illegal(v) is None
    assert "<= 64" in r.illegal({**v, "NCCL_SOCKET_NTHREADS": 8, "NCCL_NSOCKS_PERTHREAD": 16})
    assert r.illegal({**v, "NCCL_SOCKET_NTHREADS": 8, "NCCL_NSOCKS_PERTHREAD": 8}) is None
    assert "NCCL_MIN_CTAS" in r.illegal({**v, "NCCL_MIN_CTAS": 16, "NCCL_MAX_CTAS": 2})
    assert "static_graph" in r.illegal({**v, "static_graph": True, "micro_batch": 16})
    assert r.illegal({**v, "static_graph": True}) is None


def test_grid_is_finite_contains_the_defaults_and_drives_optunas_grid_sampler():
    r = SearchSpace.load("comm").resolve(CPU)
    grid = r.grid()
    assert 25.0 in grid["bucket_cap_mb"] and len(grid["bucket_cap_mb"]) <= 6
    assert min(grid["bucket_cap_mb"]) == 1.0 and max(grid["bucket_cap_mb"]) == 400.0
    assert grid["powersgd_rank"] == list(range(1, 9))
    sampler = make_sampler("grid", 0, r.grid())
    study = optuna.create_study(sampler=sampler)
    t = study.ask()
    values = r.suggest(t)
    assert values["bucket_cap_mb"] in grid["bucket_cap_mb"]


@pytest.mark.parametrize("name", ["tpe", "gp", "random", "cmaes", "grid"])
def test_every_sampler_runs_the_resolved_default_space(name):
    r = SearchSpace.load("default").resolve(CPU)
    study = optuna.create_study(direction="maximize", sampler=make_sampler(name, 0, r.grid()))
    study.enqueue_trial(r.baseline_params())
    for i in range(10):
        t = study.ask()
        values = r.suggest(t)
        assert set(values) == set(KNOBS)
        study.tell(t, float(i))
    assert study.trials[0].params == r.baseline_params()
