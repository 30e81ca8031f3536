"""The default study's model written as a plain torchrun script (issue 17's goal workload).

The MLP of ``trainers/mlp.py`` at the default study's settings - 4 x Linear(2048, 2048) with
ReLU plus a Linear(2048, 16) head, Adam at 1e-3, MSE, global batch 128 - on the same synthetic
data, in the README's script-mode pattern. ``bench/script_mode.py`` tunes it in script mode
beside the built-in ``default`` study:

    torchrun --nproc-per-node 2 bench/mlp_script.py --steps 200
"""

import argparse
import contextlib
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import autotune

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: its data
from trainers.mlp import SyntheticRegression  # noqa: E402 - the same samples, index by index

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1_000_000)
parser.add_argument("--width", type=int, default=2048)
parser.add_argument("--layers", type=int, default=4)
args = parser.parse_args()

profile = autotune.Profile.load()
profile.apply_env()
dist.init_process_group("gloo")
torch.manual_seed(0)

blocks: list[torch.nn.Module] = []
for _ in range(args.layers):
    blocks += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
model = profile.wrap(torch.nn.Sequential(*blocks, torch.nn.Linear(args.width, 16)))
data = SyntheticRegression(length=1 << 20, width=args.width, outputs=16, seed=0)
sampler = torch.utils.data.DistributedSampler(data, seed=0)
loader = torch.utils.data.DataLoader(data, sampler=sampler, **profile.dataloader_kwargs)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
scaler = profile.grad_scaler("cpu")
step, epoch = 0, 0
while step < args.steps:
    sampler.set_epoch(epoch)
    for i, (x, y) in enumerate(loader):
        last = (i + 1) % profile.accumulation_steps == 0
        with contextlib.nullcontext() if last else model.no_sync():
            with profile.autocast("cpu"):
                loss = torch.nn.functional.mse_loss(model(x), y)
            scaler.scale(loss / profile.accumulation_steps).backward()
        profile.report_loss(loss)
        if last:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            step += 1
            if step == args.steps:
                break
    epoch += 1
dist.destroy_process_group()
