"""One real nccl rank on a GPU: the nccl path, NCCL variables, precision and the GradScaler,
pinned memory, a real CUDA out-of-memory error, the numerics guard and the hardware record.

Skipped without CUDA (the project's CI machines have no GPU); run where one is lent (the
recipe: docs/gpu.md). One GPU means one nccl rank: NCCL refuses two ranks on one device, so
nothing here can show the speed of an NCCL setting, only that it reaches NCCL.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU for nccl"),
]

#: A value other than NCCL's default for every NCCL variable the default space can set.
NCCL_VALUES = {
    "NCCL_ALGO": "Ring",
    "NCCL_PROTO": "Simple",
    "NCCL_BUFFSIZE": 8388608,
    "NCCL_NTHREADS": 256,
    "NCCL_MIN_CTAS": 2,
    "NCCL_MAX_CTAS": 16,
    "NCCL_SOCKET_NTHREADS": 2,
    "NCCL_NSOCKS_PERTHREAD": 4,
}


@pytest.fixture(scope="module")
def gpu(ray_address):
    """A one-rank nccl runner, the hardware it probed and the target of its trials."""
    import ray

    if ray.cluster_resources().get("GPU", 0) < 1:
        pytest.skip("the test's Ray instance sees no GPU")
    from autotune.core.target import Target
    from autotune.launch.launcher import TrialRunner

    runner = TrialRunner(world_size=1, backend="nccl")
    try:
        hw = runner.probe()
        target = Target(
            backend="nccl",
            device="cuda",
            world_size=1,
            global_batch=32,
            cpus_per_rank=1,
            bf16=hw["bf16"],
            tf32=hw["tf32"],
        )
        yield runner, hw, target
    finally:
        runner.close()


def gpu_config(target, **changes):
    from autotune.core.config import TrialConfig
    from autotune.definition.space import SearchSpace

    r = SearchSpace.load("default").resolve(target)
    return TrialConfig.from_values({**r.defaults(), **changes}, target)


def run(runner, cfg, trainer="tiny", options=None, incumbent=None):
    from autotune.core.config import MeasureSettings

    return runner.run(
        trial=0,
        trainer=f"autotune_test_trainers:{trainer}",
        trainer_options={"global_batch": 32, **(options or {})},
        config=cfg,
        measure=MeasureSettings(window_s=0.5),
        seed=0,
        timeout_s=300,
        incumbent=incumbent,
    )


def test_the_hardware_record_names_gpu_cuda_driver_nccl_and_nvlink(gpu):
    _, hw, _ = gpu
    print("hardware:", hw)
    assert hw["device"] == "cuda" and hw["device_count"] >= 1
    assert hw["device_name"] == torch.cuda.get_device_name(0)
    assert hw["cuda"] == torch.version.cuda
    assert hw["nccl"] == ".".join(map(str, torch.cuda.nccl.version()))
    assert hw["tf32"] is True and hw["bf16"] is True  # what Ampere and newer have
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[0]
        assert hw["driver"] == smi
        assert hw["nvlink"] in (True, False)


def test_every_nccl_variable_reaches_the_rank_before_its_process_group(gpu, tmp_path):
    runner, _, target = gpu
    cfg = gpu_config(target, **NCCL_VALUES)
    log = tmp_path / "nccl.%p.log"
    # NCCL's own report of what it took, written where the test can read it.
    cfg = dataclasses.replace(
        cfg, env={**cfg.env, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": str(log)}
    )
    res = run(runner, cfg)
    rank = res.ranks[0]
    assert rank.pg_at_start is False
    for name, value in NCCL_VALUES.items():
        assert rank.env_at_start[name] == str(value), name
    text = "\n".join(p.read_text(errors="replace") for p in tmp_path.glob("nccl.*.log"))
    taken = dict(re.findall(r"(NCCL_[A-Z_]+) set by environment to ([^\s.]+)", text))
    print("NCCL reported taking:", taken)
    assert "NCCL INFO" in text, "NCCL wrote no INFO log: NCCL_DEBUG did not reach it"
    for name, value in taken.items():
        if name in NCCL_VALUES:
            assert value == str(NCCL_VALUES[name]), (name, value)
    # What NCCL 2.28 reported taking from a one-rank communicator (H100, 2026-11-23). It reads
    # NCCL_ALGO and NCCL_PROTO only when it tunes collectives for two ranks or more, and the
    # socket variables only for the socket transport between nodes: those are read back in
    # the rank above, which is all one GPU can show.
    assert {"NCCL_BUFFSIZE", "NCCL_NTHREADS", "NCCL_MIN_CTAS", "NCCL_MAX_CTAS"} <= set(taken)
    assert res.throughput > 0


@pytest.mark.parametrize("precision", ["bf16", "fp16", "tf32"])
def test_precision_pinned_memory_and_the_grad_scaler_are_applied(gpu, precision):
    runner, _, target = gpu
    cfg = gpu_config(target, precision=precision, pin_memory=True, num_workers=1)
    res = run(runner, cfg)
    rank = res.ranks[0]
    assert rank.applied["pin_memory"] is True and rank.applied["num_workers"] == 1
    assert rank.applied["grad_scaler"] is (precision == "fp16")
    assert res.throughput > 0 and res.peak_memory_mb > 0


def test_a_real_cuda_out_of_memory_is_reason_oom_and_the_runner_goes_on(gpu):
    from autotune.core.errors import TrialFailed

    runner, _, target = gpu
    cfg = gpu_config(target)
    # 32 samples x 8 GiB of activations: more than any one GPU holds
    with pytest.raises(TrialFailed) as e:
        run(runner, cfg, trainer="gpu_hog", options={"mib_per_sample": 8192})
    print("oom detail:", e.value.detail)
    assert e.value.reason == "oom" and "out of memory" in e.value.detail.lower()
    # the same runner's next trial gets a fresh process and a GPU with its memory back
    res = run(runner, cfg, trainer="gpu_hog", options={"mib_per_sample": 16})
    assert res.throughput > 0 and 500 < res.peak_memory_mb < 4096


def test_the_numerics_guard_on_real_fp16_autocast_with_the_grad_scaler(gpu):
    from autotune.core.numerics import DEFAULT_TOLERANCE, drift

    runner, _, target = gpu
    base = run(runner, gpu_config(target)).ranks[0]
    fp16 = run(runner, gpu_config(target, precision="fp16")).ranks[0]
    assert fp16.applied["grad_scaler"] is True
    d, n = drift(fp16.loss_curve, base.loss_curve)
    print(f"fp16 autocast + GradScaler, tiny MLP: drift {d:.5f} over {n} steps")
    assert 0 < d < DEFAULT_TOLERANCE  # computed, and a sound setting is not flagged
    # Gradients of 1e-11 (the underflow trainer): the fp16 hook zeroes them and the guard
    # flags it, on nccl as on gloo.
    opts = {"scale": 1e-10}
    under = run(runner, gpu_config(target), trainer="underflow", options=opts).ranks[0]
    hook = run(runner, gpu_config(target, comm_hook="fp16"), "underflow", opts).ranks[0]
    d_hook, _ = drift(hook.loss_curve, under.loss_curve)
    amp = run(runner, gpu_config(target, precision="fp16"), "underflow", opts).ranks[0]
    d_amp, _ = drift(amp.loss_curve, under.loss_curve)
    print(f"underflow: fp16 hook drift {d_hook:.4f}; fp16 autocast + GradScaler {d_amp:.4f}")
    assert d_hook > DEFAULT_TOLERANCE
