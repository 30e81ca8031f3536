"""Script mode on a GPU: `autotune run ... -- torchrun` with one nccl rank, end to end.

What a script trial's command must see on a GPU node: the GPU its bundle reserved (Ray's
``CUDA_VISIBLE_DEVICES``), the study's backend in the profile it is handed, and every NCCL
variable of that trial's configuration in its environment before ``init_process_group``. The
script records what it saw; the test compares it with each trial's profile. Skipped without
CUDA.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import autotune

torch = pytest.importorskip("torch")

BIN = str(Path(sys.executable).parent)  # torchrun is beside the interpreter

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU for nccl"),
]

SCRIPT = """
import json, os, sys
from pathlib import Path

import torch
import torch.distributed as dist

import autotune

seen = {k: v for k, v in os.environ.items() if k.startswith("NCCL_") or k == "CUDA_VISIBLE_DEVICES"}
profile = autotune.Profile.load()
profile.apply_env()
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
record = {
    "env": seen,
    "devices": torch.cuda.device_count(),
    "backend": dist.get_backend(),
    "profile": os.environ["AUTOTUNE_PROFILE"],
    "profile_backend": profile.workload.get("backend"),
    "profile_env": profile.env,
}
out = Path(os.environ["SEEN_DIR"]) / f"{os.getpid()}.json"
out.write_text(json.dumps(record))
model = profile.wrap(torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                         torch.nn.Linear(1024, 1)).cuda())
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
while True:
    x = torch.randn(32, 1024, device="cuda")
    with profile.autocast("cuda"):
        loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    profile.report_loss(loss)
"""

#: Every NCCL variable with one value other than its default, so random trials set some.
SPACE = """
ddp:
  bucket_cap_mb: {type: float, low: 5, high: 100, log: true}
nccl:
  NCCL_BUFFSIZE: {type: categorical, choices: [default, 2097152]}
  NCCL_NTHREADS: {type: categorical, choices: [default, 256]}
  NCCL_MIN_CTAS: {type: categorical, choices: [default, 2]}
  NCCL_MAX_CTAS: {type: categorical, choices: [default, 16]}
"""


def test_a_script_trial_on_the_gpu_sees_its_gpu_nccl_and_its_nccl_variables(
    ray_address, run_env, tmp_path
):
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "space.yaml").write_text(SPACE)
    seen_dir = tmp_path / "seen"
    seen_dir.mkdir()
    env = {**run_env, "SEEN_DIR": str(seen_dir), "PATH": BIN + os.pathsep + run_env["PATH"]}
    p = autotune(
        env,
        "run",
        "--space",
        "space.yaml",
        "--sampler",
        "random",
        "--no-screening",
        "--n-trials",
        "4",
        "--validate-top",
        "0",
        "--no-limit",
        "--seed",
        "3",
        "--budget",
        "4m",
        "--global-batch",
        "32",
        "--address",
        ray_address,
        "--",
        "torchrun",
        "--nproc-per-node",
        "1",
        "train.py",
        cwd=tmp_path,
    )
    print(p.stdout)
    records = [json.loads(f.read_text()) for f in sorted(seen_dir.glob("*.json"))]
    assert len(records) >= 4, p.stdout  # the baseline and three trials, each a new command
    carried = 0
    for r in records:
        # the GPU its bundle reserved, and only it
        assert r["env"].get("CUDA_VISIBLE_DEVICES") not in (None, ""), r
        assert r["devices"] == len(r["env"]["CUDA_VISIBLE_DEVICES"].split(",")) == 1, r
        assert r["backend"] == "nccl" and r["profile_backend"] == "nccl", r
        # every NCCL variable of the trial's profile was there before the script applied it
        nccl = {k: str(v) for k, v in r["profile_env"].items() if k.startswith("NCCL_")}
        assert {k: r["env"].get(k) for k in nccl} == nccl, r
        carried += bool(set(nccl) - {"NCCL_SOCKET_IFNAME"})
    assert carried >= 1, records  # the space's variables reached some trial
    profiles = list((tmp_path / "home").rglob("profiles/*.yaml"))
    assert len(profiles) == 1, p.stdout
    exported = yaml.safe_load(profiles[0].read_text())
    assert exported["workload"]["backend"] == "nccl", exported["workload"]
    assert exported["hardware"]["device"] == "cuda", exported["hardware"]
