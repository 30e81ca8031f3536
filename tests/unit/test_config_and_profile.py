"""Trial configurations and the profile: where each value goes, and the strict round trip."""

import pytest
import yaml

from autotune.core import allocator
from autotune.core.config import POWERSGD_START_ITER, TrialConfig
from autotune.core.errors import ConfigError
from autotune.core.target import Target
from autotune.definition.space import SearchSpace
from autotune.profile.profile import Profile

GPU = Target(
    backend="nccl",
    device="cuda",
    world_size=4,
    global_batch=256,
    cpus_per_rank=4,
    bf16=True,
    tf32=True,
)


def values(**changes):
    r = SearchSpace.load("default").resolve(GPU)
    return {**r.defaults(), **changes}


def test_baseline_config_sets_only_torchruns_thread_default_and_the_allocator_pin():
    c = TrialConfig.from_values(values(), GPU)
    assert c.env == {"OMP_NUM_THREADS": "1", **allocator.ENV}
    assert c.ddp == {"bucket_cap_mb": 25.0, "gradient_as_bucket_view": False, "static_graph": False}
    assert c.comm_hook == {"name": "none"}
    assert c.data == {"num_workers": 0, "pin_memory": False}
    assert (c.micro_batch, c.accumulation_steps, c.global_batch) == (64, 1, 256)


def test_the_thread_default_is_torchruns_for_the_ranks_a_node_holds():
    import dataclasses

    # torchrun sets OMP_NUM_THREADS=1 when it starts several ranks on a node, and leaves torch
    # its own default (every core) for one: the baseline must be what a plain script gets.
    for per_node, threads in ((4, "1"), (None, "1"), (1, "4")):
        t = dataclasses.replace(GPU, world_size=1, global_batch=64, ranks_per_node=per_node)
        r = SearchSpace.load("default").resolve(t)
        env = TrialConfig.from_values(r.defaults(), t).env
        assert env == {"OMP_NUM_THREADS": threads, **allocator.ENV}
        assert r.baseline_params()["threads"] == int(threads)


@pytest.mark.parametrize(
    ("backend", "world", "nodes", "cpus_per_rank", "node_cpus"),
    [
        ("gloo", 2, 1, 1, 2),  # the local 2-core machine
        ("gloo", 2, 2, 1, 1),  # the network lab: one rank on each 1-CPU node
        ("gloo", 4, 2, 3, 8),  # spread over two 8-core nodes, 2 ranks each
        ("gloo", 2, 2, 7, 8),  # one rank per 8-core node: it gets its bundle's 7 threads
        ("nccl", 8, 1, 12, 96),
        ("nccl", 2, 2, 16, 64),
    ],
)
def test_the_probes_processes_start_with_the_environment_the_baseline_has(
    backend, world, nodes, cpus_per_rank, node_cpus
):
    """The hardware probe runs in rank processes started with the defaults' environment on the
    hardware the plan assumes; the baseline, on the hardware the probe then sees, must ask for
    the same environment, or it starts its processes again."""
    from autotune.launch.hardware import assumed, target_of

    def defaults_env(hw):
        t = target_of(
            hw,
            backend=backend,
            world_size=world,
            global_batch=64 * world,
            cpus_per_rank=cpus_per_rank,
            free_batch=False,
        )
        return TrialConfig.defaults(t).env

    before = assumed(backend, world_size=world, node_count=nodes, cpus_per_rank=cpus_per_rank)
    seen = {
        "device": "cuda" if backend == "nccl" else "cpu",
        "node_count": nodes,
        "cpus": node_cpus,
        "bf16": True,
        "bf16_native": backend == "nccl",
        "tf32": backend == "nccl",
        "compile_problem": None,
    }
    assert defaults_env(before) == defaults_env(seen)
    # a node with fewer CPUs than the plan reserved changes the one ranks alone on a node get:
    # that baseline starts its own processes (the pool's rule), and runs as it always did
    if world == nodes and cpus_per_rank > 1:
        fewer = defaults_env({**seen, "cpus": 1})
        assert fewer != defaults_env(before) and fewer["OMP_NUM_THREADS"] == "1"


def test_each_value_lands_where_it_acts():
    c = TrialConfig.from_values(
        values(
            NCCL_ALGO="Tree",
            NCCL_BUFFSIZE=8388608,
            threads=3,
            comm_hook="powersgd",
            powersgd_rank=4,
            num_workers=2,
            prefetch_factor=6,
            persistent_workers=True,
            micro_batch=16,
            precision="bf16",
        ),
        GPU,
    )
    assert c.env == {
        "NCCL_ALGO": "Tree",
        "NCCL_BUFFSIZE": "8388608",
        "OMP_NUM_THREADS": "3",
        **allocator.ENV,
    }
    assert c.threads == 3
    assert c.comm_hook == {
        "name": "powersgd",
        "matrix_approximation_rank": 4,
        "start_powerSGD_iter": POWERSGD_START_ITER,
    }
    assert c.data == {
        "num_workers": 2,
        "pin_memory": False,
        "prefetch_factor": 6,
        "persistent_workers": True,
    }
    # the global batch is kept: 16 x 4 micro-steps x 4 ranks
    assert (c.micro_batch, c.accumulation_steps, c.global_batch) == (16, 4, 256)
    assert TrialConfig.from_dict(c.to_dict()) == c


def make_profile(**config_changes) -> Profile:
    c = TrialConfig.from_values(values(**config_changes), GPU)
    return Profile.from_config(
        c,
        study={"name": "s", "best_trial": 7, "baseline_trial": 0},
        workload={
            "trainer": "mlp",
            "options": {"width": 64},
            "world_size": 4,
            "backend": "nccl",
            "global_batch": 256,
        },
        hardware={
            "device": "cuda",
            "device_name": "H100",
            "device_count": 4,
            "node_count": 1,
            "torch": "2.13.0",
            "cuda": "13.0",
            "driver": "580.159.04",
            "nccl": "2.27.3",
            "nvlink": True,
        },
        measured={
            "baseline_samples_per_s": 100.0,
            "best_samples_per_s": 150.0,
            "speedup": 1.5,
            "trials": {"complete": 9},
            "budget": "5m",
        },
    )


def test_profile_round_trips_through_the_strict_loader(tmp_path):
    p = make_profile(comm_hook="fp16", NCCL_PROTO="LL", micro_batch=32)
    path = p.save(tmp_path / "best.yaml")
    loaded = Profile.load(path)
    assert loaded == p
    assert loaded.trial_config() == TrialConfig.from_values(
        values(comm_hook="fp16", NCCL_PROTO="LL", micro_batch=32), GPU
    )
    assert loaded.ddp_kwargs == {
        "bucket_cap_mb": 25.0,
        "gradient_as_bucket_view": False,
        "static_graph": False,
    }
    assert loaded.env["NCCL_PROTO"] == "LL"
    assert list(yaml.safe_load(path.read_text())) == [
        "version",
        "study",
        "workload",
        "hardware",
        "measured",
        "env",
        "ddp",
        "data",
        "precision",
        "batch",
    ]


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["ddp"].update(bucket_size=5), r"ddp: unknown key 'bucket_size'"),
        (lambda d: d.pop("measured"), r"missing required key 'measured'"),
        (lambda d: d.update(extra=1), r"unknown key 'extra'"),
        (
            lambda d: d["env"].update(NCCL_BUFFSIZE=4194304),
            r"env must map variable names to strings",
        ),
        (lambda d: d["batch"].update(micro_batch=48), r"must equal batch.global_batch"),
        (lambda d: d["ddp"]["comm_hook"].update(name="zip"), r"comm_hook.name must be one of"),
        (lambda d: d.update(precision="fp8"), r"precision must be one of"),
        (lambda d: d.update(version=99), r"version 99 is not supported"),
    ],
)
def test_profile_loader_rejects_what_is_wrong_naming_file_and_key(tmp_path, edit, message):
    data = make_profile().to_mapping()
    edit(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=message) as e:
        Profile.load(path)
    assert str(path) in str(e.value)


def test_save_is_atomic_and_leaves_no_temporary_files(tmp_path):
    make_profile().save(tmp_path / "p.yaml")
    assert [f.name for f in tmp_path.iterdir()] == ["p.yaml"]


def test_nvlink_is_read_from_nvidia_smi_link_lines():
    from autotune.launch.hardware import nvlink_active

    assert nvlink_active("GPU 0: NVIDIA H100 (UUID: x)\n\t Link 0: 26.562 GB/s\n") is True
    assert nvlink_active("GPU 0: NVIDIA H100 (UUID: x)\n\t Link 0: <inactive>\n") is False
    assert nvlink_active("") is False  # one GPU with no NVLink prints nothing


def test_the_profiles_headline_gives_a_figure_only_when_its_interval_is_within_25_percent():
    import dataclasses

    p = make_profile()

    def with_interval(low, high, rounds):
        m = {**p.measured, "speedup_interval": [low, high], "validation": {"rounds": rounds}}
        return dataclasses.replace(p, measured=m).headline()

    assert with_interval(1.42, 1.58, 5) == (
        "1.50x [1.42, 1.58] over the defaults (re-validated, 95 % interval)"
    )
    assert with_interval(0.9, 2.4, 2) == (
        "re-validated against the defaults: not measured precisely enough (2 rounds: 0.90-2.40x)"
    )
    assert p.headline() == "1.50x the defaults (not re-validated)"
