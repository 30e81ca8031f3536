"""``autotune.core.apply``: what the rank measures and what ``Profile`` applies in a user's script,
checked on real torch objects (a one-rank gloo process group in this process)."""

from __future__ import annotations

import gc
from contextlib import nullcontext

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from autotune.core import apply
from autotune.core.config import MeasureSettings, TrialConfig
from autotune.core.rank_io import RankSpec
from autotune.profile.profile import Profile
from autotune.rank import measure as rank
from autotune.rank import session as rank_session
from autotune.rank.measure import run_rank

POWERSGD = {"name": "powersgd", "matrix_approximation_rank": 2, "start_powerSGD_iter": 2}
HOOK_NAMES = {"fp16": "fp16_compress_hook", "powersgd": "powerSGD_hook"}


@pytest.fixture
def group():
    """A one-rank gloo process group for DDP, destroyed after the test."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def tf32_flags(monkeypatch):
    """The process's TF32 flags set to (off, off), which is not torch's default (matmul off,
    cuDNN on), and autotune's record of them forgotten; both restored after the test."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    monkeypatch.setattr(apply, "_TF32_DEFAULTS", None)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def tf32() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def profile(config: TrialConfig) -> Profile:
    return Profile.from_config(config, study={"name": "s"}, workload={"backend": "gloo"})


def ddp_settings(ddp) -> dict:
    """What DDP holds, read back as the rank reads it for its ``applied`` record."""
    return {
        "bucket_cap_mb": ddp.bucket_bytes_cap / 2**20,
        "gradient_as_bucket_view": bool(ddp.gradient_as_bucket_view),
        "static_graph": bool(ddp.static_graph),
        "comm_hook": ddp._get_ddp_logging_data().get("comm_hook") or "none",
    }


def test_the_rank_applies_through_apply_and_defines_none_of_it_itself():
    for module in (rank, rank_session):
        for name in ("register_comm_hook", "_set_tf32", "_autocast_dtype", "_TF32_DEFAULTS"):
            assert not hasattr(module, name), name
    assert rank_session.apply is apply


@pytest.mark.parametrize("hook", [{"name": "none"}, {"name": "fp16"}, POWERSGD])
@pytest.mark.parametrize("static_graph", [False, True])
def test_wrap_applies_the_ddp_kwargs_and_registers_the_hook(group, hook, static_graph):
    kwargs = {"bucket_cap_mb": 5.0, "gradient_as_bucket_view": True, "static_graph": static_graph}
    ddp = apply.wrap(model(), kwargs, hook)
    assert ddp_settings(ddp) == {**kwargs, "comm_hook": HOOK_NAMES.get(hook["name"], "none")}
    # and the same through the profile
    cfg = TrialConfig(ddp=kwargs, comm_hook=hook)
    assert ddp_settings(profile(cfg).wrap(model())) == ddp_settings(ddp)


def test_wrap_defaults_differ_from_what_the_tests_set(group):
    """The settings above are not DDP's defaults, so those assertions can fail."""
    assert ddp_settings(apply.wrap(model(), {}, {"name": "none"})) == {
        "bucket_cap_mb": 25.0,
        "gradient_as_bucket_view": False,
        "static_graph": False,
        "comm_hook": "none",
    }


def test_the_fp16_hook_compresses_the_gradients(group):
    m = model()
    ddp = apply.wrap(m, {}, {"name": "fp16"})
    ddp(torch.randn(16, 8)).sum().backward()
    g = m[0].weight.grad
    assert torch.equal(g, g.half().float())  # went through fp16 on the way
    plain = model()
    apply.wrap(plain, {}, {"name": "none"})(torch.randn(16, 8)).sum().backward()
    assert not torch.equal(plain[0].weight.grad, plain[0].weight.grad.half().float())


def test_extra_ddp_kwargs_win_over_the_configuration(group):
    ddp = apply.wrap(model(), {"bucket_cap_mb": 5.0}, {"name": "none"}, bucket_cap_mb=1.0)
    assert ddp.bucket_bytes_cap == 2**20
    p = profile(TrialConfig(ddp={"bucket_cap_mb": 5.0}))
    assert p.wrap(model(), bucket_cap_mb=1.0).bucket_bytes_cap == 2**20


def test_bf16_hook_is_the_one_torch_gets(group):
    if dist.is_nccl_available():
        pytest.skip("a torch built with NCCL accepts the bf16 hook; this checks the refusal")
    with pytest.raises(TypeError, match="BF16"):  # torch refuses it without NCCL
        apply.wrap(model(), {}, {"name": "bf16"})


def test_an_unknown_hook_is_refused(group):
    with pytest.raises(ValueError, match="unknown comm hook 'int8'"):
        apply.register_comm_hook(apply.wrap(model(), {}, {"name": "none"}), {"name": "int8"})


@pytest.mark.parametrize(
    ("precision", "dtype", "scaler"),
    [
        ("fp32", torch.float32, False),
        ("tf32", torch.float32, False),
        ("bf16", torch.bfloat16, False),
        ("fp16", torch.float16, True),
    ],
)
def test_autocast_and_scaler_follow_the_precision(tf32_flags, precision, dtype, scaler):
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with apply.autocast(precision, "cpu"):
        assert layer(x).dtype == dtype
        assert torch.is_autocast_enabled("cpu") == (dtype != torch.float32)
    assert layer(x).dtype == torch.float32  # only inside the context
    assert apply.grad_scaler(precision, "cpu").is_enabled() is scaler
    p = profile(TrialConfig(precision=precision))
    with p.autocast("cpu"):
        assert layer(x).dtype == dtype
    assert p.grad_scaler("cpu").is_enabled() is scaler


def test_fp32_autocast_leaves_an_outer_autocast_alone():
    with torch.autocast("cpu", dtype=torch.bfloat16), apply.autocast("fp32", "cpu"):
        assert torch.nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.bfloat16


def test_tf32_is_set_for_tf32_and_put_back_to_the_process_defaults(tf32_flags):
    apply.set_tf32(True)
    assert tf32() == (True, True)
    apply.set_tf32(False)
    assert tf32() == (False, False)  # this process's flags, not torch's defaults
    # Profile.autocast goes through the same function, with the same record of the defaults
    with profile(TrialConfig(precision="tf32")).autocast("cpu"):
        assert tf32() == (True, True)
    assert tf32() == (True, True)  # a process flag: it stays on after the context
    # other precisions leave the script's own TF32 settings alone, whatever they are
    for other in ("fp32", "bf16", "fp16"):
        for flags in ((True, True), (False, False)):
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
            with profile(TrialConfig(precision=other)).autocast("cpu"):
                assert tf32() == flags, other


def test_dataloader_kwargs_carry_the_micro_batch_and_the_data_section():
    data = {"num_workers": 2, "pin_memory": True, "prefetch_factor": 3, "persistent_workers": True}
    kwargs = apply.dataloader_kwargs(16, data)
    assert kwargs == {"batch_size": 16, **data}
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(64)), **kwargs)
    assert (loader.batch_size, loader.num_workers, loader.pin_memory) == (16, 2, True)
    assert (loader.prefetch_factor, loader.persistent_workers) == (3, True)
    p = profile(TrialConfig(data=data, micro_batch=16, accumulation_steps=2, global_batch=32))
    assert p.dataloader_kwargs == kwargs
    assert p.accumulation_steps == 2


def test_micro_step_all_reduces_only_on_the_last_micro_step(group):
    assert [apply.is_last_micro_step(i, 3) for i in range(6)] == [False, False, True] * 2
    assert all(apply.is_last_micro_step(i, 1) for i in range(3))
    ddp = apply.wrap(model(), {}, {"name": "none"})
    reduced: list[int] = []

    def counting_hook(state, bucket):
        reduced.append(state["micro"])
        return default_hooks.allreduce_hook(None, bucket)

    state = {"micro": -1}
    ddp.register_comm_hook(state, counting_hook)
    for micro in range(6):  # two optimizer steps of 3 micro-steps, counted over the run
        state["micro"] = micro
        with apply.micro_step(ddp, micro, 3):
            ddp(torch.randn(4, 8)).sum().backward()
    assert sorted(set(reduced)) == [2, 5]
    assert isinstance(apply.micro_step(ddp, 2, 3), nullcontext)


def test_the_rank_and_the_profile_apply_the_same_settings():
    """One trial run by the real rank code (one gloo rank, in this process), and the same
    configuration applied by ``Profile``: the settings read back from the live objects agree."""
    config = TrialConfig(
        env={"OMP_NUM_THREADS": "1"},
        ddp={"bucket_cap_mb": 5.0, "gradient_as_bucket_view": True, "static_graph": False},
        comm_hook={"name": "fp16"},
        data={"num_workers": 0, "pin_memory": False},
        precision="fp16",
        micro_batch=4,
        accumulation_steps=2,
        global_batch=8,
        threads=1,
    )
    measure = MeasureSettings(
        min_warmup_steps=0,
        settle_window=1,
        settle_tol=10.0,
        max_warmup_steps=2,
        window_s=0.001,
        min_steps=1,
        max_steps=2,
        min_windows=1,
        max_windows=1,
    )
    options = {"width": 16, "outputs": 4, "layers": 1, "samples": 64, "global_batch": 8}
    spec = RankSpec(
        trial=0,
        rank=0,
        world_size=1,
        backend="gloo",
        master_addr="127.0.0.1",
        master_port=0,
        trainer="mlp",
        trainer_options=options,
        config=config,
        measure=measure,
        timeout_s=60.0,
    )
    threads = torch.get_num_threads()
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    try:
        applied = run_rank(spec, store).applied
    finally:
        gc.unfreeze()  # run_rank froze this test process's objects
        torch.set_num_threads(threads)

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        p = profile(config)
        ddp = p.wrap(model())
        loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(torch.zeros(64)), **p.dataloader_kwargs
        )
        ours = {
            **ddp_settings(ddp),
            "num_workers": loader.num_workers,
            "pin_memory": loader.pin_memory,
            "micro_batch": loader.batch_size,
            "accumulation_steps": p.accumulation_steps,
            "grad_scaler": p.grad_scaler("cpu").is_enabled(),
        }
    finally:
        dist.destroy_process_group()
    assert {k: applied[k] for k in ours} == ours
    assert ours == {
        "bucket_cap_mb": 5.0,
        "gradient_as_bucket_view": True,
        "static_graph": False,
        "comm_hook": "fp16_compress_hook",
        "num_workers": 0,
        "pin_memory": False,
        "micro_batch": 4,
        "accumulation_steps": 2,
        "grad_scaler": True,
    }
