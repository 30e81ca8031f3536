"""What a search space and a trial's configuration are resolved against: the machine's
backend and device, and the workload's world size and global batch (``Target``)."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.core.compiling import NOT_PROBED

__all__ = ["Target"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Target:
    """What a search space is resolved against: the backend, the device and the workload."""

    backend: str
    """Process-group backend of every trial: ``gloo`` (CPU) or ``nccl`` (one GPU per rank)."""
    device: str
    """``cpu`` or ``cuda``."""
    world_size: int
    """Number of DDP ranks in one trial."""
    global_batch: int
    """Samples per optimizer step over all ranks, as the workload declares it."""
    cpus_per_rank: int
    """CPU cores available to one rank on its node (the upper bound for ``threads``)."""
    bf16: bool = False
    """The device runs bf16 autocast (any CPU; CUDA devices that report bf16 support)."""
    bf16_native: bool = False
    """bf16 matmuls run in hardware: a CUDA device that reports bf16 support, or a CPU whose
    bf16 matmuls take less time than its fp32 ones (``hardware.bf16_matmul_ratio``; where
    that cannot be timed, one with AVX512-BF16 or AMX, ``hardware.CPU_BF16_FLAGS``). Where
    not, bf16 autocast on a CPU is legal but slow, and it is left out of the search."""
    bf16_ratio: float | None = None
    """A CPU's bf16 matmul time over its fp32 one, as measured (``bf16_native``); None where
    not measured."""
    tf32: bool = False
    """The device has TF32 tensor cores (CUDA compute capability 8.0 or newer)."""
    free_batch: bool = False
    """``--free-batch``: ``micro_batch`` is the per-rank batch itself (no accumulation), so the
    global batch changes with it; otherwise accumulation keeps the workload's global batch."""
    ranks_per_node: int | None = None
    """Ranks of one trial per node; None: not known (taken as several)."""
    compile_problem: str | None = NOT_PROBED
    """Why ``torch.compile`` cannot run on the ranks' machine (``core.compiling.problem``,
    probed by ``launch.hardware.describe``), or None where it can. Unprobed: it cannot."""

    @property
    def per_rank_batch(self) -> int:
        return self.global_batch // self.world_size
