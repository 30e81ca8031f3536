"""The framework adapters with the real libraries: each a 2-rank gloo run on CPU under torchrun,
in separate processes, of a tiny model for a few steps. Rank 0 reports what the framework
actually built (the ``DistributedDataParallel`` module's bucket size, bucket views, static
graph and registered comm hook; the micro-batches the model saw; the optimizer steps), and the
test compares it with the profile.

The profiles use what gloo can run: the fp16 compression hook (bf16's needs NCCL; PowerSGD
crashes or hangs on gloo, pytorch#58467)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.core.config import TrialConfig
from autotune.core.target import Target
from autotune.definition.space import SearchSpace
from autotune.profile.profile import Profile
from tests.conftest import REPO

pytestmark = pytest.mark.integration

#: 2 ranks, 16 samples per rank per optimizer step: 32 in all.
CPU = Target(
    backend="gloo", device="cpu", world_size=2, global_batch=32, cpus_per_rank=1, bf16=True
)
MIB = 2**20

#: What every script shares: the tiny model that records the batch sizes it sees, the data,
#: and the report rank 0 writes (the DDP module's own record of itself).
COMMON = """
import json, os, sys
import torch
from torch import nn
from autotune import Profile
from autotune.core import compat

torch.manual_seed(0)
profile = Profile.load(sys.argv[1])
RANK = int(os.environ["RANK"])


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
        self.seen = []

    def forward(self, x):
        self.seen.append(len(x))
        return self.net(x)


X, Y = torch.randn(64, 8), torch.randn(64, 1)


def report(ddp, seen, steps, **extra):
    data = compat.ddp_logging(ddp)
    out = {"type": type(ddp).__name__, "bucket_bytes": ddp.bucket_bytes_cap,
           "bucket_view": ddp.gradient_as_bucket_view, "static_graph": ddp.static_graph,
           "find_unused": ddp.find_unused_parameters, "hook": data.get("comm_hook"),
           "seen": seen, "steps": steps, **extra}
    if RANK == 0:
        with open(sys.argv[2], "w") as f:
            json.dump(out, f)
"""

LIGHTNING = """
import lightning.pytorch as pl
from torch.utils.data import DataLoader, TensorDataset
from autotune.adapters import lightning as tuned

WRAPPED = []


class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = Tiny()

    def training_step(self, batch, i):
        WRAPPED[:] = [self.trainer.strategy.model]  # Lightning unwraps it when fit ends
        x, y = batch
        return nn.functional.mse_loss(self.model(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


module = Module()
kwargs = tuned.trainer_kwargs(profile)
trainer = pl.Trainer(strategy=tuned.ddp_strategy(profile), accelerator="cpu", devices=2,
                     max_steps=2, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, **kwargs)
loader = DataLoader(TensorDataset(X, Y), **tuned.dataloader_kwargs(profile))
trainer.fit(module, loader)
report(WRAPPED[0], module.model.seen, trainer.global_step,
       precision=str(trainer.precision),
       callback_registered=kwargs["callbacks"][0].registered)
"""

ACCELERATE = """
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset
from autotune.adapters import accelerate as tuned

accelerator = Accelerator(cpu=True, **tuned.accelerator_kwargs(profile))
tiny = Tiny()
optimizer = torch.optim.SGD(tiny.parameters(), lr=0.01)
loader = DataLoader(TensorDataset(X, Y), **tuned.dataloader_kwargs(profile))
ddp, optimizer, loader = accelerator.prepare(tiny, optimizer, loader)
steps = 0
for x, y in loader:
    with accelerator.accumulate(ddp):
        with accelerator.autocast():
            loss = nn.functional.mse_loss(ddp(x).float(), y)
        accelerator.backward(loss)
        optimizer.step()
        steps += int(accelerator.sync_gradients)
        optimizer.zero_grad()
report(ddp, tiny.seen, steps, mixed_precision=str(accelerator.mixed_precision),
       distributed=str(accelerator.distributed_type))
"""

HF = """
from transformers import Trainer, TrainingArguments
from autotune.adapters import hf as tuned


class WithLoss(Tiny):
    def forward(self, x, labels):
        return {"loss": nn.functional.mse_loss(super().forward(x), labels)}


class Pairs(torch.utils.data.Dataset):
    def __len__(self):
        return len(X)

    def __getitem__(self, i):
        return {"x": X[i], "labels": Y[i]}


tiny = WithLoss()
args = TrainingArguments(output_dir=sys.argv[3], use_cpu=True, max_steps=2, report_to="none",
                         save_strategy="no", disable_tqdm=True, logging_strategy="no",
                         **tuned.training_arguments_kwargs(profile))
trainer = Trainer(model=tiny, args=args, train_dataset=Pairs())
tuned.set_ddp_kwargs(trainer, profile)
trainer.train()
loader = trainer.get_train_dataloader()
report(trainer.model_wrapped, tiny.seen, trainer.state.global_step,
       workers=loader.num_workers, prefetch=loader.prefetch_factor,
       persistent=loader.persistent_workers)
"""


def needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (the test extra installs it)")


def cpu_profile(path: Path, **changes) -> Profile:
    values = {**SearchSpace.load("default").resolve(CPU).defaults(), **changes}
    profile = Profile.from_config(
        TrialConfig.from_values(values, CPU),
        study={"name": "adapters", "best_trial": 1, "baseline_trial": 0},
        workload={
            "trainer": "mlp",
            "options": {},
            "world_size": 2,
            "backend": "gloo",
            "global_batch": CPU.global_batch,
        },
        hardware={"device": "cpu"},
        measured={"baseline_samples_per_s": 1.0, "best_samples_per_s": 2.0, "speedup": 2.0},
    )
    profile.save(path)
    return profile


def run_two_ranks(tmp_path: Path, body: str, profile: Path) -> dict:
    """``body`` (after ``COMMON``) as a script under torchrun with 2 CPU ranks; rank 0's
    report."""
    script, out = tmp_path / "train.py", tmp_path / "report.json"
    script.write_text(COMMON + body)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(script),
        str(profile),
        str(out),
        str(tmp_path / "out"),
    ]
    p = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    return json.loads(out.read_text())


def test_lightning_trainer_runs_ddp_with_the_profiles_buckets_hook_and_accumulation(tmp_path):
    needs("lightning")
    path = tmp_path / "best.yaml"
    cpu_profile(
        path,
        micro_batch=8,
        bucket_cap_mb=5.0,
        gradient_as_bucket_view=True,
        comm_hook="fp16",
        precision="bf16",
    )
    got = run_two_ranks(tmp_path, LIGHTNING, path)
    assert got["type"] == "DistributedDataParallel"
    assert got["bucket_bytes"] == 5 * MIB and got["bucket_view"] is True
    assert got["static_graph"] is False and got["find_unused"] is False
    # DDPStrategy registers ddp_comm_hook on CUDA only: on this CPU the callback did
    assert got["hook"] == "fp16_compress_hook" and got["callback_registered"] is True
    # micro-batches of 8, 2 per optimizer step: 2 steps are 4 forwards
    assert got["seen"] == [8, 8, 8, 8] and got["steps"] == 2
    assert "bf16" in got["precision"].lower()


def test_accelerate_prepares_ddp_with_the_profiles_kwargs_hook_and_precision(tmp_path):
    needs("accelerate")
    path = tmp_path / "best.yaml"
    # no accumulation: static_graph may be on
    cpu_profile(path, bucket_cap_mb=10.0, static_graph=True, comm_hook="fp16", precision="bf16")
    got = run_two_ranks(tmp_path, ACCELERATE, path)
    assert got["distributed"] == "DistributedType.MULTI_CPU"
    assert got["type"] == "DistributedDataParallel"
    assert got["bucket_bytes"] == 10 * MIB and got["static_graph"] is True
    assert got["bucket_view"] is False and got["hook"] == "fp16_compress_hook"
    assert got["mixed_precision"] == "bf16"
    # 64 samples, 32 per rank, micro-batch 16 = per-rank batch: a step each
    assert got["seen"] == [16, 16] and got["steps"] == 2


def test_accelerate_accumulates_to_the_profiles_global_batch(tmp_path):
    needs("accelerate")
    path = tmp_path / "best.yaml"
    cpu_profile(path, micro_batch=4, gradient_as_bucket_view=True)
    got = run_two_ranks(tmp_path, ACCELERATE, path)
    assert got["bucket_view"] is True and got["hook"] is None
    assert got["bucket_bytes"] == 25 * MIB and got["mixed_precision"] == "no"
    # 32 samples per rank in micro-batches of 4, 4 per optimizer step (16 per rank)
    assert got["seen"] == [4] * 8 and got["steps"] == 2


def test_hf_trainer_wraps_with_the_profiles_buckets_hook_and_dataloader(tmp_path):
    needs("transformers")
    needs("accelerate")
    path = tmp_path / "best.yaml"
    cpu_profile(
        path,
        micro_batch=8,
        bucket_cap_mb=5.0,
        gradient_as_bucket_view=True,
        comm_hook="fp16",
        num_workers=1,
        prefetch_factor=3,
        persistent_workers=True,
    )
    got = run_two_ranks(tmp_path, HF, path)
    assert got["type"] == "DistributedDataParallel"
    assert got["bucket_bytes"] == 5 * MIB and got["find_unused"] is False
    # no TrainingArguments field for these two: set_ddp_kwargs put them on the Accelerator
    assert got["bucket_view"] is True and got["hook"] == "fp16_compress_hook"
    assert got["seen"] == [8, 8, 8, 8] and got["steps"] == 2
    assert (got["workers"], got["prefetch"], got["persistent"]) == (1, 3, True)
