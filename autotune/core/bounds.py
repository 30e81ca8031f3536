"""The absolute bounds of every number a configuration may carry.

A configuration comes from a search space, a stored trial of a study (perhaps someone else's
database), a profile file or ``AUTOTUNE_PROFILE``; whatever its source, no value beyond these
bounds runs. They are far beyond what a tuned DDP job uses and small enough that no value
exhausts a machine by itself (a profile with ``num_workers: 100000`` would start 100,000
processes per rank). Values within them but beyond what the applying machine has (more
workers or threads than it has CPUs) are warned about, not refused
(``autotune.profile.profile.Profile.machine_warnings``).

docs/security.md lists them for users.
"""

from __future__ import annotations

__all__ = [
    "MAX_ACCUMULATION",
    "MAX_BUCKET_MB",
    "MAX_GLOBAL_BATCH",
    "MAX_MICRO_BATCH",
    "MAX_NCCL_BUFFSIZE",
    "MAX_NSOCKS_PERTHREAD",
    "MAX_POWERSGD_RANK",
    "MAX_POWERSGD_START",
    "MAX_PREFETCH",
    "MAX_THREADS",
    "MAX_WORKERS",
    "MAX_WORLD_SIZE",
]

#: Intra-op threads per rank (``threads``, ``OMP_NUM_THREADS``).
MAX_THREADS = 1024
#: DataLoader worker processes per rank (``num_workers``).
MAX_WORKERS = 256
#: Batches each DataLoader worker loads ahead (``prefetch_factor``).
MAX_PREFETCH = 64
#: DDP's gradient bucket size in MiB (``bucket_cap_mb``): 4 GiB.
MAX_BUCKET_MB = 4096.0
#: PowerSGD's ``matrix_approximation_rank``.
MAX_POWERSGD_RANK = 1024
#: PowerSGD's ``start_powerSGD_iter``.
MAX_POWERSGD_START = 1_000_000
#: Samples per rank per forward pass (``micro_batch``).
MAX_MICRO_BATCH = 2**20
#: Micro-steps per optimizer step (``accumulation_steps``).
MAX_ACCUMULATION = 2**16
#: Samples per optimizer step over all ranks (``global_batch``).
MAX_GLOBAL_BATCH = 2**30
#: Ranks of one job (``world_size``).
MAX_WORLD_SIZE = 2**16
#: ``NCCL_BUFFSIZE`` in bytes: 1 GiB (NCCL's default is 4 MiB).
MAX_NCCL_BUFFSIZE = 2**30
#: ``NCCL_NSOCKS_PERTHREAD`` (NCCL documents threads x sockets <= 64).
MAX_NSOCKS_PERTHREAD = 64
