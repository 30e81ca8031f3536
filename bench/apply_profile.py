"""A training script that applies a profile, as a user's would: the check that a profile's
speedup carries over from the tuner's trials to a script started by torchrun.

It trains the profile's own workload (``workload.trainer`` and ``options``) for ``--seconds``
after ``--warmup`` seconds and prints the samples/s over all ranks; with ``--defaults`` it
trains the same workload with PyTorch's defaults instead (DDP's own kwargs, no hook, no
DataLoader workers, fp32, the whole per-rank batch in one micro-step). Run both under the same
launcher, alternately, and compare::

    autotune launch best.yaml -- torchrun --nproc-per-node 1 bench/apply_profile.py best.yaml
    torchrun --nproc-per-node 1 bench/apply_profile.py best.yaml --defaults

The profile is applied only through autotune's public API (``Profile.apply_env``, ``wrap``,
``dataloader_kwargs``, ``autocast``, ``grad_scaler``, ``accumulation_steps``), the calls the
README's training script makes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time

import torch
import torch.distributed as dist

import autotune
from autotune.core import apply
from autotune.rank.workload import load_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile")
    ap.add_argument("--defaults", action="store_true", help="PyTorch's defaults, not the profile")
    ap.add_argument("--seconds", type=float, default=20.0, help="timed training (default 20)")
    ap.add_argument("--warmup", type=float, default=5.0, help="untimed first seconds (default 5)")
    args = ap.parse_args()

    profile = autotune.Profile.load(args.profile)
    if not args.defaults:
        profile.apply_env()  # before the process group (autotune launch has set it already)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = profile.workload["backend"] == "nccl"
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    world = dist.get_world_size()

    wl = load_workload(profile.workload["trainer"], profile.workload.get("options") or {})
    torch.manual_seed(0)
    model = wl.model().to(device)
    extra = {"device_ids": [local]} if cuda else {}
    if args.defaults:
        ddp = apply.wrap(model, {}, {"name": "none"}, **extra)
        per_rank = profile.batch["global_batch"] // world
        loader_kwargs: dict = {"batch_size": per_rank}
        accum = 1
        autocast = contextlib.nullcontext
        scaler = torch.amp.GradScaler(device.type, enabled=False)
        label = "defaults"
    else:
        ddp = profile.wrap(model, **extra)
        loader_kwargs = profile.dataloader_kwargs
        accum = profile.accumulation_steps
        autocast = lambda: profile.autocast(device.type)  # noqa: E731
        scaler = profile.grad_scaler(device.type)
        label = "profile"
    sampler = torch.utils.data.DistributedSampler(wl.dataset, drop_last=True)
    loader = torch.utils.data.DataLoader(
        wl.dataset, sampler=sampler, drop_last=True, **loader_kwargs
    )
    optimizer = wl.optimizer(ddp.parameters())
    micro = loader_kwargs["batch_size"]

    def batches():
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            yield from loader
            epoch += 1

    it = batches()
    samples, started, timed_from = 0, time.perf_counter(), None
    loss = torch.zeros(())
    while True:
        for i in range(accum):
            x, y = next(it)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with contextlib.nullcontext() if i == accum - 1 else ddp.no_sync():
                with autocast():
                    loss = wl.loss(ddp(x), y) / accum
                scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)
        now = time.perf_counter()
        if timed_from is None:
            if now - started >= args.warmup:
                timed_from, samples = now, 0
            continue
        samples += micro * accum * world
        if now - timed_from >= args.seconds:
            break
    rate = samples / (now - timed_from)
    if dist.get_rank() == 0:
        print(
            json.dumps(
                {
                    "run": label,
                    "samples_per_s": round(rate, 1),
                    "loss": round(loss.item() * accum, 4),
                    "env": {k: os.environ.get(k) for k in profile.env},
                }
            )
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
