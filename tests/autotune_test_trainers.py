"""Small purpose-built trainers for the integration tests (imported by the rank processes,
which find this directory through PYTHONPATH)."""

from __future__ import annotations

import os
import time

import torch
from autotune.trainers import mlp

from autotune.rank.workload import Workload


def tiny(*, pid_dir: str | None = None, **options) -> Workload:
    """The built-in MLP at a size whose trials take a second or two. With ``pid_dir``, every
    rank leaves its pid there when it builds the model, and so does every process that loads
    a sample (DataLoader workers)."""
    wl = mlp.workload(**{"width": 64, "layers": 2, "global_batch": 32, **options})
    if pid_dir:
        build = wl.model

        def model():
            _leave_pid(pid_dir)
            return build()

        wl.model = model
        wl.dataset = _RecordPids(wl.dataset, pid_dir)
    return wl


def raising(**options) -> Workload:
    """Rank 1 raises while building its model: a crash with a known first line."""
    wl = tiny(**options)
    build = wl.model

    def model():
        if os.environ.get("RANK_FOR_TEST") == "1" or (
            torch.distributed.is_initialized() and torch.distributed.get_rank() == 1
        ):
            raise RuntimeError("boom on purpose in rank 1")
        return build()

    wl.model = model
    return wl


def dying(**options) -> Workload:
    """Rank 1's process dies in native code while building its model, as one does when a
    native library finds its heap corrupted: it writes why to its standard error, then reads
    address 0 (a segfault). No Python exception: Ray reports only that the process died."""
    wl = tiny(**options)
    build = wl.model

    def model():
        if torch.distributed.is_initialized() and torch.distributed.get_rank() == 1:
            import ctypes

            os.write(2, b"libnative: fatal error: heap corrupted\n")
            ctypes.string_at(0)
        return build()

    wl.model = model
    return wl


def failing_when(*, flag: str, **options) -> Workload:
    """The tiny MLP, whose ranks raise in their next step once the file ``flag`` exists
    (where the session is built anew and where it is kept, ``rank.kept``): a run that fails
    partway through a comparison, when the test says."""
    wl = tiny(**options)
    loss = wl.loss

    def failing(out, target):
        if os.path.exists(flag):
            raise RuntimeError("failing on purpose: the flag file exists")
        return loss(out, target)

    wl.loss = failing
    return wl


class _RecordPids(torch.utils.data.Dataset):
    """Wraps a dataset; every process that loads a sample (DataLoader workers) leaves its pid."""

    def __init__(self, inner, pid_dir: str) -> None:
        self.inner, self.pid_dir = inner, pid_dir

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i):
        _leave_pid(self.pid_dir)
        return self.inner[i]


def _leave_pid(pid_dir: str | None) -> None:
    if pid_dir:
        open(os.path.join(pid_dir, str(os.getpid())), "w").close()


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def hanging(**options) -> Workload:
    """Rank 1 sleeps in its first forward pass; rank 0 then waits in the gradient all-reduce."""
    wl = tiny(**options)
    build = wl.model

    class Sleepy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = build()

        def forward(self, x):
            if _rank() == 1:
                time.sleep(3600)
            return self.inner(x)

    wl.model = Sleepy
    return wl


def nan_loss(**options) -> Workload:
    """A loss that is NaN from the first step."""
    wl = tiny(**options)
    wl.loss = lambda out, y: torch.nn.functional.mse_loss(out, y) * float("nan")
    return wl


_HOARD: list = []


def memory_hog(*, mib: int = 1536, **options) -> Workload:
    """Each rank touches ``mib`` MiB of host memory while building its model."""
    wl = tiny(**options)
    build = wl.model

    def model():
        _HOARD.append(torch.ones(mib * 2**18))  # float32: 4 bytes each
        return build()

    wl.model = model
    return wl


def cuda_oom(*, pid_dir: str | None = None, **options) -> Workload:
    """Rank 0 raises the error torch raises when a GPU runs out of memory."""
    wl = tiny(pid_dir=pid_dir, **options)
    build = wl.model

    def model():
        _leave_pid(pid_dir)
        if _rank() == 0:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return build()

    wl.model = model
    return wl


def no_accumulation(**options) -> Workload:
    """Crashes whenever a micro-batch is smaller than the per-rank batch (gradient
    accumulation): a configuration that fails, on any machine (``micro_batch`` is searched
    everywhere; bf16, say, is left out of a CPU without bf16 units)."""
    wl = tiny(**options)
    build = wl.model
    per_rank = wl.global_batch // 2  # the tests' two ranks

    class Whole(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = build()

        def forward(self, x):
            if x.shape[0] < per_rank:
                raise RuntimeError(f"this model refuses micro-batches of {x.shape[0]}")
            return self.inner(x)

    wl.model = Whole
    return wl


def raising_with_pids(**options) -> Workload:
    """Rank 1 raises after its first step; rank 0 is left waiting in a collective."""
    wl = tiny(**options)
    build = wl.model
    calls = {"n": 0}

    class Fragile(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = build()

        def forward(self, x):
            calls["n"] += 1
            if _rank() == 1 and calls["n"] > 1:
                raise RuntimeError("rank 1 gives up after one step")
            return self.inner(x)

    wl.model = Fragile
    return wl


def underflow(*, scale: float = 1e-10, **options) -> Workload:
    """A linear model on a linear target, learnt within a few Adam steps in fp32 (over 16 steps
    the loss falls from 0.8 to 0.2), with the loss scaled by ``scale``: gradients of about
    1e-11, which fp16 cannot hold (its smallest step is 6e-8), so the fp16 compression hook
    turns them into zeros and the model stops learning. Adam normalises the gradient, so fp32
    is not slowed by the scale. A setting that really drifts, for the numerics guard."""
    wl = tiny(**options)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 64, generator=g)
    wl.dataset = torch.utils.data.TensorDataset(x, 0.5 * x[:, :16])
    wl.model = lambda: torch.nn.Linear(64, 16)
    wl.loss = lambda out, y: torch.nn.functional.mse_loss(out, y) * scale
    wl.optimizer = lambda params: torch.optim.Adam(params, lr=0.02, eps=1e-20)
    return wl


def gpu_hog(*, mib_per_sample: int = 16, **options) -> Workload:
    """The tiny MLP with a forward pass that holds ``mib_per_sample`` MiB of activations per
    sample: a micro-batch that the GPU cannot hold raises torch's real CUDA out-of-memory error
    (not a planted one, as ``cuda_oom`` is), a smaller one trains."""
    wl = tiny(**options)
    build = wl.model
    wide = mib_per_sample * 2**18 // 64  # float32 elements per feature, 64 features

    class Hog(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = build()

        def forward(self, x):
            big = x.unsqueeze(-1).expand(*x.shape, wide) * 1.0001  # materialised
            return self.inner(big.mean(-1))

    wl.model = Hog
    return wl


def reads_torchrun_env(*, out_dir: str, **options) -> Workload:
    """Model code as most GPU scripts write it: it reads torchrun's variables when it builds
    the model, and leaves what it read (with the process group's own view) in ``out_dir``."""
    import json

    import torch.distributed as dist

    wl = tiny(**options)
    build = wl.model
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

    def model():
        seen = {k: os.environ[k] for k in names}  # a KeyError fails the trial
        seen["dist_rank"], seen["dist_world"] = dist.get_rank(), dist.get_world_size()
        with open(os.path.join(out_dir, f"{seen['RANK']}.json"), "w") as f:
            json.dump(seen, f)
        return build()

    wl.model = model
    return wl
