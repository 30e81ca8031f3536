"""What can be tuned: every knob, where it acts, its PyTorch/NCCL default, and its legality.

A search space (``space.py``) may only name knobs listed here. Each knob knows:

* its ``section`` in the space YAML and in the exported profile;
* its ``default``: the value PyTorch, NCCL or torchrun use when nobody sets anything. The
  baseline trial is made of these, so every search space must contain them;
* when it cannot act on a target (``drop``): NCCL knobs on gloo, pinning without an accelerator,
  a thread count with only one possible value. Such a dimension is left out of the study with
  the reason, so no trial is spent on a no-op;
* which single choices cannot act (``drop_choice``): the bf16 hook without NCCL, tf32 on CPU,
  compile's CUDA-graph modes on CPU (``core.compiling`` holds compile's rules);
* which single values are illegal (``legal``), and which combinations are (``illegal_combination``).

NCCL knobs take the string ``default`` for "leave the variable unset".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from autotune.core import bounds, compiling
from autotune.core.knobdef import Knob
from autotune.core.target import Target
from autotune.core.values import boolean, int_range, is_int, number_in, one_of

__all__ = [
    "HALF_HOOKS",
    "KNOBS",
    "SECTIONS",
    "Knob",
    "changed_knobs",
    "defaults",
    "illegal_combination",
    "knob",
]

#: Sections of a search space, in the order trials suggest them.
SECTIONS = ("ddp", "batch", "data", "precision", "cpu", "nccl")

#: The value of an NCCL knob that means "leave the variable unset".
UNSET = "default"

COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")
#: The comm hooks that cast each bucket to a 2-byte dtype before its all-reduce and back after.
HALF_HOOKS = ("fp16", "bf16")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
NCCL_ALGOS = ("Ring", "Tree", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT")
NCCL_PROTOS = ("LL", "LL128", "Simple")
NCCL_NTHREADS = (64, 128, 256, 512)
#: NCCL documents NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD <= 64.
MAX_SOCKET_PRODUCT = 64


def _nccl(check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    """NCCL values: ``default`` (unset) or a value ``check`` accepts."""

    def legal(v: Any) -> str | None:
        if v == UNSET:
            return None
        reason = check(v)
        return None if reason is None else f"{reason}, or '{UNSET}' to leave it unset"

    return legal


def _only_nccl(t: Target) -> str | None:
    if t.backend != "nccl":
        return f"NCCL variables act only with the nccl backend (this study uses {t.backend})"
    return None


def _needs_cuda_for_pinning(t: Target) -> str | None:
    if t.device != "cuda":
        return "pinned memory only speeds up copies to an accelerator (the device is cpu)"
    return None


def _default_threads(t: Target) -> int:
    """torchrun's: 1 thread per rank when it starts several on a node, else every core (the
    rank's CPUs). A 1-thread baseline of one rank overstated a speedup 2.9x for 1.2x (H100)."""
    return t.cpus_per_rank if t.ranks_per_node == 1 else 1


def _threads_drop(t: Target) -> str | None:
    if t.cpus_per_rank <= 1:
        return "only 1 thread per rank is possible (each rank has 1 CPU of its node)"
    return None


def _micro_batch_drop(t: Target) -> str | None:
    if t.per_rank_batch <= 1 and not t.free_batch:
        return f"the per-rank batch is {t.per_rank_batch}: there is nothing to split"
    return None


def _micro_batch_choice(t: Target, v: Any) -> str | None:
    if t.free_batch:
        return None if is_int(v) and v >= 1 else "is not a positive whole number"
    if not is_int(v) or v < 1 or t.per_rank_batch % v:
        return f"does not divide the per-rank batch {t.per_rank_batch}"
    return None


def _hook_choice(t: Target, v: Any) -> str | None:
    if v == "bf16" and t.backend != "nccl":
        return "torch refuses bf16_compress_hook without NCCL"
    if v == "powersgd" and t.backend == "gloo":
        # Known upstream (pytorch/pytorch#58467; torch's own parity test is disabled on gloo).
        return "PowerSGD crashes or hangs on gloo (4 of 4 trials here; pytorch#58467)"
    return None


def _precision_choice(t: Target, v: Any) -> str | None:
    if v == "tf32" and not t.tf32:
        return "TF32 needs a CUDA device of compute capability 8.0 or newer"
    if v == "bf16" and not t.bf16:
        return "the device does not support bf16"
    if v == "bf16" and t.device == "cpu" and not t.bf16_native:
        if t.bf16_ratio is not None:
            return (
                f"this CPU's bf16 matmuls took {t.bf16_ratio:.1f}x the time of fp32 ones "
                "(measured): bf16 autocast would slow the step (where no bf16 units, "
                "AVX512-BF16 or AMX, run it, a step ran 20x slower than fp32)"
            )
        return (
            "this CPU has no bf16 units (AVX512-BF16, AMX): bf16 autocast is emulated "
            "(a step ran 20x slower than fp32 on such a CPU)"
        )
    if v == "fp16" and t.device != "cuda":
        return "fp16 autocast is a GPU setting (on a CPU here it ran 20x slower than fp32)"
    return None


def _compile_drop(t: Target) -> str | None:
    return None if t.compile_problem is None else f"torch.compile: {t.compile_problem}"


def _compile_choice(t: Target, v: Any) -> str | None:
    return compiling.choice_problem(v, t.device)


def _threads_choice(t: Target, v: Any) -> str | None:
    if is_int(v) and v > t.cpus_per_rank:
        return f"more threads than the {t.cpus_per_rank} CPUs each rank has"
    return None


def _workers_on(v: Any, t: Target) -> bool:
    return is_int(v) and v > 0


def _no_accumulation(v: Any, t: Target) -> bool:
    return t.free_batch or v == t.per_rank_batch


_KNOB_LIST = [
    # Batch first: static_graph depends on it. Accumulation keeps the global batch.
    Knob(
        name="micro_batch",
        section="batch",
        default=lambda t: t.per_rank_batch,
        legal=int_range(1, bounds.MAX_MICRO_BATCH),
        drop=_micro_batch_drop,
        drop_choice=_micro_batch_choice,
        doc="samples per rank per forward pass; accumulation steps keep the global batch",
    ),
    # DistributedDataParallel(...) kwargs and the communication hook.
    Knob(
        name="bucket_cap_mb",
        section="ddp",
        default=25.0,
        legal=number_in(0.0, bounds.MAX_BUCKET_MB),
        doc="DDP gradient bucket size in MiB (PyTorch default 25)",
    ),
    Knob(
        name="gradient_as_bucket_view",
        choices_only=True,
        section="ddp",
        default=False,
        legal=boolean,
        doc="gradients are views into the all-reduce buckets (saves a copy)",
    ),
    Knob(
        name="static_graph",
        choices_only=True,
        section="ddp",
        default=False,
        legal=boolean,
        parent=("micro_batch", _no_accumulation),
        doc="declare the graph static (only without accumulation: torch's reducer asserts)",
    ),
    Knob(
        name="comm_hook",
        choices_only=True,
        section="ddp",
        default="none",
        legal=one_of(COMM_HOOKS),
        drop_choice=_hook_choice,
        doc="DDP communication hook: none, fp16/bf16 compression, or PowerSGD",
    ),
    Knob(
        name="powersgd_rank",
        section="ddp",
        default=1,
        legal=int_range(1, bounds.MAX_POWERSGD_RANK),
        parent=("comm_hook", lambda v, t: v == "powersgd"),
        doc="PowerSGD matrix_approximation_rank (only when comm_hook is powersgd)",
    ),
    Knob(
        name="compile",
        choices_only=True,
        section="ddp",
        default=compiling.NONE,
        legal=one_of(compiling.MODES),
        drop=_compile_drop,
        drop_choice=_compile_choice,
        doc="torch.compile the model DDP wraps: none or a mode (compile time is warm-up)",
    ),
    # DataLoader kwargs.
    Knob(
        name="num_workers",
        section="data",
        default=0,
        legal=int_range(0, bounds.MAX_WORKERS),
        doc="DataLoader worker processes per rank",
    ),
    Knob(
        name="pin_memory",
        choices_only=True,
        section="data",
        default=False,
        legal=boolean,
        drop=_needs_cuda_for_pinning,
        doc="DataLoader pins host batches for faster H2D copies",
    ),
    Knob(
        name="prefetch_factor",
        section="data",
        default=2,
        legal=int_range(1, bounds.MAX_PREFETCH),
        parent=("num_workers", _workers_on),
        doc="batches each DataLoader worker loads ahead (only with workers)",
    ),
    Knob(
        name="persistent_workers",
        choices_only=True,
        section="data",
        default=False,
        legal=boolean,
        parent=("num_workers", _workers_on),
        doc="keep DataLoader workers alive across epochs (only with workers)",
    ),
    # Precision.
    Knob(
        name="precision",
        choices_only=True,
        section="precision",
        default="fp32",
        legal=one_of(PRECISIONS),
        drop_choice=_precision_choice,
        doc="fp32, tf32 matmuls, bf16 autocast, or fp16 autocast with GradScaler",
    ),
    # CPU threads per rank (torchrun sets OMP_NUM_THREADS=1 when it starts several ranks).
    Knob(
        name="threads",
        section="cpu",
        default=_default_threads,
        legal=int_range(1, bounds.MAX_THREADS),
        drop=_threads_drop,
        drop_choice=_threads_choice,
        doc="intra-op CPU threads per rank (OMP_NUM_THREADS; default as torchrun's)",
    ),
    # NCCL environment, read once per process before the process group exists.
    Knob(
        name="NCCL_ALGO",
        choices_only=True,
        section="nccl",
        default=UNSET,
        legal=_nccl(one_of(NCCL_ALGOS)),
        drop=_only_nccl,
        doc="collective algorithm",
    ),
    Knob(
        name="NCCL_PROTO",
        choices_only=True,
        section="nccl",
        default=UNSET,
        legal=_nccl(one_of(NCCL_PROTOS)),
        drop=_only_nccl,
        doc="protocol; forcing LL128 where NCCL disabled it can corrupt data",
    ),
    Knob(
        name="NCCL_BUFFSIZE",
        choices_only=True,
        section="nccl",
        default=UNSET,
        legal=_nccl(int_range(1, bounds.MAX_NCCL_BUFFSIZE)),
        drop=_only_nccl,
        doc="bytes of buffer per channel between peers (NCCL default 4 MiB)",
    ),
    Knob(
        name="NCCL_NTHREADS",
        choices_only=True,
        section="nccl",
        default=UNSET,
        legal=_nccl(one_of(NCCL_NTHREADS)),
        drop=_only_nccl,
        doc="CUDA threads per NCCL block: 64, 128, 256 or 512",
    ),
    Knob(
        name="NCCL_MIN_CTAS",
        choices_only=True,
        section="nccl",
        default=UNSET,
        legal=_nccl(int_range(1, 64)),
        drop=_only_nccl,
        doc="minimum CTAs (channels) NCCL uses",
    ),
    Knob(
        name="NCCL_MAX_CTAS",
        choices_only=True,
        section="nccl",
        default=UNSET,
        legal=_nccl(int_range(1, 64)),
        drop=_only_nccl,
        doc="maximum CTAs (channels) NCCL uses",
    ),
    Knob(
        name="NCCL_SOCKET_NTHREADS",
        choices_only=True,
        section="nccl",
        default=UNSET,
        legal=_nccl(int_range(1, 16)),
        drop=_only_nccl,
        doc="CPU helper threads per socket connection (1-16)",
    ),
    Knob(
        name="NCCL_NSOCKS_PERTHREAD",
        choices_only=True,
        section="nccl",
        default=UNSET,
        legal=_nccl(int_range(1, bounds.MAX_NSOCKS_PERTHREAD)),
        drop=_only_nccl,
        doc="sockets per helper thread; threads x sockets must be <= 64",
    ),
]

KNOBS: Mapping[str, Knob] = {k.name: k for k in _KNOB_LIST}


def knob(name: str) -> Knob:
    return KNOBS[name]


def changed_knobs(
    params: Mapping[str, Any], reference: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The settings of ``params`` that differ from ``reference`` (a baseline trial's params, or
    a resolved space's defaults). A knob ``reference`` lacks (one the baseline left inactive,
    such as persistent_workers without workers) compares with the knob's own default; a knob
    without a fixed default (its default depends on the target) then counts as changed."""
    fixed = {k: kn.default for k, kn in KNOBS.items() if not callable(kn.default)}
    ref = {**fixed, **(reference or {})}
    return {k: v for k, v in params.items() if k not in ref or ref[k] != v}


def defaults(target: Target) -> dict[str, Any]:
    """Every knob at its default on ``target``: PyTorch's, NCCL's and torchrun's, the
    baseline's full assignment."""
    return {name: k.default_for(target) for name, k in KNOBS.items()}


def illegal_combination(values: Mapping[str, Any], target: Target) -> str | None:
    """Why this full assignment of knob values breaks a documented rule, or None."""
    accumulates = not target.free_batch and values.get("micro_batch", 0) < target.per_rank_batch
    if values.get("static_graph") and accumulates:
        # Seen here: torch 2.13's reducer fails an internal assert on the first no_sync step.
        return "static_graph cannot be combined with gradient accumulation (DDP no_sync)"
    threads = values.get("NCCL_SOCKET_NTHREADS", UNSET)
    socks = values.get("NCCL_NSOCKS_PERTHREAD", UNSET)
    if threads != UNSET and socks != UNSET and threads * socks > MAX_SOCKET_PRODUCT:
        return (
            f"NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD must be <= {MAX_SOCKET_PRODUCT}, "
            f"got {threads} x {socks} = {threads * socks}"
        )
    reason = compiling.combination_problem(values.get("compile"), values.get("bucket_cap_mb"))
    if reason:
        return reason
    lo = values.get("NCCL_MIN_CTAS", UNSET)
    hi = values.get("NCCL_MAX_CTAS", UNSET)
    if lo != UNSET and hi != UNSET and lo > hi:
        return f"NCCL_MIN_CTAS must be <= NCCL_MAX_CTAS, got {lo} > {hi}"
    return None
