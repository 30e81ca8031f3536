"""``torch.compile`` as a knob: its modes, and the rules of where each can run.

One set of rules serves every side: the knob's legality (``core.knobs``: a mode that cannot run
on the study's target is left out with the reason), the check before a configuration is applied
(``core.validate.check_compile``: a profile from elsewhere asking a mode this machine cannot run
is refused with the same reason) and the probe of the ranks' machine (``launch.hardware``).

* ``none`` leaves the model as it is (PyTorch's default). The other values are
  ``torch.compile``'s own modes (``torch._inductor.list_mode_options()`` in torch 2.13).
* ``reduce-overhead`` and ``max-autotune`` capture CUDA graphs: on a CPU they are the same as
  ``default`` and ``max-autotune-no-cudagraphs``, so they act only on CUDA.
* Inductor, torch.compile's default backend, writes C++ kernels on a CPU (built with ``$CXX``
  or ``g++``, as ``torch._inductor.config.cpp.cxx`` says) and Triton kernels on a GPU: without
  the compiler or ``triton`` it fails at the first step. ``TORCH_COMPILE_DISABLE=1`` turns every
  ``torch.compile`` into a no-op. ``problem`` says which of these holds, without compiling
  anything (a first compile costs seconds: 11-18 s cold on a 2-core CPU).
* DDP under torch.compile: Dynamo's ``DDPOptimizer`` splits the compiled graph at DDP's bucket
  boundaries so that the all-reduce of each bucket still overlaps the backward. It asserts that
  DDP's bucket is at least its first bucket (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``,
  1 MiB in torch 2.13): ``bucket_cap_mb`` below 1 with compile fails at the first forward
  (seen here: "First bucket should be smaller/equal to other buckets").
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import Any

__all__ = [
    "CUDA_GRAPH_MODES",
    "FIRST_BUCKET_MB",
    "MODES",
    "NONE",
    "NOT_PROBED",
    "choice_problem",
    "combination_problem",
    "problem",
]

#: The value that leaves the model uncompiled.
NONE = "none"
#: ``torch.compile``'s modes, after ``none``.
MODES = (NONE, "default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
#: The modes that capture CUDA graphs (``triton.cudagraphs`` in their options).
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
#: DDPOptimizer's first bucket (MiB): DDP's buckets may not be smaller under compile.
FIRST_BUCKET_MB = 1.0
#: ``Target.compile_problem`` where nobody probed the ranks' machine: compile is left out.
NOT_PROBED = "whether torch.compile runs on the ranks' machine was not probed"


def problem(device: str, environ: Any = None) -> str | None:
    """Why ``torch.compile`` cannot run in this process on ``device`` (``cpu`` or ``cuda``), or
    None where it can; ``environ``: the environment to read (default ``os.environ``)."""
    env = os.environ if environ is None else environ
    if env.get("TORCH_COMPILE_DISABLE", "0") == "1":
        return "TORCH_COMPILE_DISABLE=1 makes torch.compile a no-op here"
    if importlib.util.find_spec("torch._inductor") is None:
        return "this torch has no inductor (torch.compile's default backend)"
    if device == "cuda":
        if importlib.util.find_spec("triton") is None:
            return "inductor needs triton for GPU kernels, and triton is not installed"
        return None
    cxx = env.get("CXX") or "g++"
    if shutil.which(cxx) is None:
        return f"inductor builds CPU kernels with a C++ compiler, and {cxx!r} is not on PATH"
    return None


def choice_problem(mode: Any, device: str) -> str | None:
    """Why ``mode`` cannot act on ``device`` though compile runs there, or None."""
    if mode in CUDA_GRAPH_MODES and device != "cuda":
        return f"{mode} captures CUDA graphs: it acts only on CUDA (the device is {device})"
    return None


def combination_problem(mode: Any, bucket_cap_mb: Any) -> str | None:
    """Why ``mode`` cannot run with DDP buckets of ``bucket_cap_mb`` MiB, or None."""
    small = isinstance(bucket_cap_mb, (int, float)) and bucket_cap_mb < FIRST_BUCKET_MB
    if mode not in (NONE, None) and small:
        return (
            f"torch.compile with DDP needs bucket_cap_mb >= {FIRST_BUCKET_MB:g} (its DDPOptimizer "
            f"asserts DDP's buckets are at least its {FIRST_BUCKET_MB:g} MiB first bucket), "
            f"got {bucket_cap_mb}"
        )
    return None
