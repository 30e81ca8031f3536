"""The ``compile`` knob (``torch.compile``): its legality rules where a study resolves its space,
where a configuration is checked and where a profile is applied (one set of rules:
``core.compiling``), how a configuration and a profile carry it, how ``apply.wrap`` compiles,
and the screening gate: the compile prior is screened only on a compute-bound step."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from autotune.core import apply, compat, compiling
from autotune.core.config import TrialConfig
from autotune.core.errors import ConfigError
from autotune.core.knobs import KNOBS, illegal_combination
from autotune.core.target import Target
from autotune.core.validate import check_compile, check_config
from autotune.definition.space import SearchSpace
from autotune.limit.evidence import Evidence
from autotune.profile.profile import Profile
from autotune.search.screening import plan

CPU = Target(
    backend="gloo",
    device="cpu",
    world_size=2,
    global_batch=128,
    cpus_per_rank=1,
    compile_problem=None,
)
GPU = Target(
    backend="nccl",
    device="cuda",
    world_size=2,
    global_batch=128,
    cpus_per_rank=8,
    bf16=True,
    bf16_native=True,
    tf32=True,
    compile_problem=None,
)
NO_CXX = "inductor builds CPU kernels with a C++ compiler, and 'no-such-cxx' is not on PATH"
LABEL = "compile=default"


@pytest.fixture
def group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def resolved(target: Target):
    return SearchSpace.load("default").resolve(target)


def dropped(space) -> dict:
    return {(d.name, d.choice if not d.whole else None): d.reason for d in space.dropped}


# -- where it can run ------------------------------------------------------------------------


def test_the_default_space_has_compile_with_none_its_default():
    s = SearchSpace.load("default")
    assert s.distributions["compile"].choices == ("none", "default", "reduce-overhead")
    assert KNOBS["compile"].default == "none"
    assert resolved(CPU).baseline_params()["compile"] == "none"


def test_on_a_cpu_that_compiles_the_cuda_graph_mode_is_left_out_with_the_reason():
    space = resolved(CPU)
    assert space.distributions["compile"].choices == ("none", "default")
    reason = dropped(space)[("compile", "reduce-overhead")]
    assert "CUDA graphs" in reason and "the device is cpu" in reason


def test_on_a_gpu_that_compiles_every_mode_of_the_space_stays():
    choices = resolved(GPU).distributions["compile"].choices
    assert choices == ("none", "default", "reduce-overhead")


@pytest.mark.parametrize("problem", [NO_CXX, compiling.NOT_PROBED])
def test_where_compile_cannot_run_the_whole_knob_is_left_out_with_why(problem):
    space = resolved(replace(CPU, compile_problem=problem))
    assert "compile" not in space.distributions
    assert dropped(space)[("compile", None)] == f"torch.compile: {problem}"
    assert (
        Target(
            backend="gloo", device="cpu", world_size=2, global_batch=8, cpus_per_rank=1
        ).compile_problem
        == compiling.NOT_PROBED
    )


def test_the_probe_names_what_is_missing(monkeypatch):
    assert compiling.problem("cpu", {"CXX": "no-such-cxx"}) == NO_CXX
    off = compiling.problem("cpu", {"TORCH_COMPILE_DISABLE": "1"})
    assert off is not None and "TORCH_COMPILE_DISABLE" in off
    monkeypatch.setattr(compiling.shutil, "which", lambda name: f"/bin/{name}")
    assert compiling.problem("cpu", {}) is None
    real = compiling.importlib.util.find_spec
    monkeypatch.setattr(
        compiling.importlib.util, "find_spec", lambda name: None if name == "triton" else real(name)
    )
    gpu = compiling.problem("cuda", {})
    assert gpu is not None and "triton" in gpu


def test_compile_with_buckets_below_ddpoptimizers_first_bucket_is_an_illegal_combination():
    reason = illegal_combination({"compile": "default", "bucket_cap_mb": 0.5}, CPU)
    assert reason is not None and "bucket_cap_mb >= 1" in reason and "DDPOptimizer" in reason
    assert illegal_combination({"compile": "default", "bucket_cap_mb": 1.0}, CPU) is None
    assert illegal_combination({"compile": "none", "bucket_cap_mb": 0.5}, CPU) is None


# -- the same rules when a configuration is checked and applied ------------------------------


def test_a_mode_this_machine_cannot_run_is_refused_with_the_knobs_reason(monkeypatch):
    with pytest.raises(ConfigError) as e:
        check_compile("reduce-overhead", "cpu", where="profile p")
    assert compiling.choice_problem("reduce-overhead", "cpu") in str(e.value)
    assert str(e.value).startswith("profile p: ddp.compile 'reduce-overhead' cannot run here")
    monkeypatch.setenv("CXX", "no-such-cxx")
    with pytest.raises(ConfigError, match="'no-such-cxx' is not on PATH"):
        check_compile("default", "cpu")
    check_compile("none", "cpu")  # none needs nothing


def test_an_unknown_mode_or_small_buckets_fail_the_configuration_check():
    cfg = TrialConfig.from_values({**resolved(CPU).defaults(), "compile": "default"}, CPU)
    assert cfg.ddp["compile"] == "default"
    check_config(cfg)
    with pytest.raises(ConfigError, match=r"ddp.compile must be one of"):
        check_config(replace(cfg, ddp={**cfg.ddp, "compile": "turbo"}))
    with pytest.raises(ConfigError, match=r"bucket_cap_mb >= 1"):
        check_config(replace(cfg, ddp={**cfg.ddp, "bucket_cap_mb": 0.5}))


def test_a_configuration_carries_compile_only_when_it_compiles():
    base = TrialConfig.from_values(resolved(CPU).defaults(), CPU)
    assert "compile" not in base.ddp  # profiles of uncompiled configurations are unchanged


def test_a_profile_carries_compile_apart_from_ddps_kwargs():
    cfg = TrialConfig.from_values({**resolved(CPU).defaults(), "compile": "default"}, CPU)
    p = Profile.from_config(cfg, study={"name": "s"}, workload={"backend": "gloo"})
    assert p.compile == "default" and p.ddp["compile"] == "default"
    assert "compile" not in p.ddp_kwargs  # DistributedDataParallel(**ddp_kwargs) still works
    assert p.trial_config().ddp["compile"] == "default"
    assert Profile(ddp={"comm_hook": {"name": "none"}}).compile == "none"  # an older profile


def test_a_profile_from_elsewhere_asking_a_cuda_graph_mode_on_a_cpu_is_refused(group):
    cfg = TrialConfig.from_values({**resolved(CPU).defaults(), "compile": "reduce-overhead"}, CPU)
    p = Profile.from_config(cfg, study={"name": "s"}, workload={"backend": "gloo"})
    with pytest.raises(ConfigError, match="captures CUDA graphs"):
        p.wrap(torch.nn.Linear(4, 1))


# -- how it is applied -----------------------------------------------------------------------


def test_wrap_compiles_the_model_before_ddp_wraps_it(group, monkeypatch):
    calls = []

    def fake_compile(model, **kwargs):
        calls.append(kwargs)
        model.compiled_here = True
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    ddp = apply.wrap(
        torch.nn.Linear(4, 1), {"bucket_cap_mb": 5.0, "compile": "default"}, {"name": "none"}
    )
    assert isinstance(ddp, torch.nn.parallel.DistributedDataParallel)
    assert ddp.module.compiled_here and calls == [{"mode": "default", "dynamic": False}]
    assert ddp.bucket_bytes_cap == 5 * 2**20  # the rest still went to DDP
    plain = apply.wrap(torch.nn.Linear(4, 1), {"compile": "none"}, {"name": "none"})
    assert not hasattr(plain.module, "compiled_here") and len(calls) == 1


def test_the_graph_counter_reads_dynamos():
    before = compat.compiled_graphs()
    assert isinstance(before, int)
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))
    assert compat.compiled_graphs() == before + 1


# -- the screening gate ----------------------------------------------------------------------


def evidence(**kw) -> Evidence:
    """A 100 ms step of 2 ranks: mostly compute unless ``kw`` moves time elsewhere."""
    fields = dict(
        step_s=0.1,
        data_s=0.001,
        forward_s=0.03,
        backward_s=0.06,
        optimizer_s=0.005,
        exposed_s=0.004,
        comm_s=0.02,
        last_bucket_s=0.002,
        buckets=2,
        grad_bytes=4e6,
        alpha_s=1e-4,
        smallest_s=1e-4,
        per_byte_s=5e-9,
        world_size=2,
        accumulation_steps=1,
        device="cpu",
        noise=0.03,
    )
    return Evidence(**{**fields, **kw})


def labels(planned) -> list[str]:
    return [p.prior.label for p in planned]


def test_a_compute_bound_step_screens_compile():
    ev = evidence()
    assert ev.bound == "compute"
    todo, skipped = plan(resolved(CPU), ev)
    assert LABEL in labels(todo) and LABEL not in labels(skipped)
    gain = next(p.gain for p in todo if p.prior.label == LABEL)
    assert gain is not None and gain > 1 + ev.noise


@pytest.mark.parametrize(
    "kw, bound",
    [
        ({"exposed_s": 0.05, "comm_s": 0.06, "forward_s": 0.01, "backward_s": 0.02}, "bandwidth"),
        ({"data_s": 0.03}, "data"),
    ],
)
def test_a_step_bounded_elsewhere_does_not_screen_compile(kw, bound):
    ev = evidence(**kw)
    assert ev.bound == bound
    todo, skipped = plan(resolved(CPU), ev)
    assert LABEL not in labels(todo) and LABEL in labels(skipped)
    # compile stays in the space: only the screening passes it by
    assert "default" in resolved(CPU).distributions["compile"].choices


def test_without_a_first_measurement_compile_is_not_screened():
    todo, skipped = plan(resolved(CPU), None)
    assert LABEL not in labels(todo) and skipped == []
    assert "static_graph=True" in labels(todo)  # the others go in their listed order


def test_where_compile_cannot_run_there_is_no_compile_prior():
    todo, skipped = plan(resolved(replace(CPU, compile_problem=NO_CXX)), evidence())
    assert LABEL not in labels(todo) + labels(skipped)
