"""glibc malloc's thresholds, pinned: in autotune's rank processes, in script-mode trials and,
through the profile, in your own job.

Left dynamic, glibc starts a process at a 128 KiB mmap threshold and raises it only as it frees
mmapped blocks, trimming the heap in between: a training step maps, faults in (zeroed) and
unmaps its large tensors again and again. Measured on this project's 2-core box:

* rank processes of the warm pool: 10-20 % slower for their first 20-30 steps, then about
  10 % slower for good (0.229 s against 0.208 s a step of the default workload;
  ``bench/settle.py``) - the cause of the cold first baseline;
* the same model as a plain torchrun script (``bench/mlp_script.py``), new processes: 20-25 %
  slower in every step of a 300-step run (docs/measurement.md).

Pinned (``mallopt(M_MMAP_THRESHOLD, 32 MiB)``, ``mallopt(M_TRIM_THRESHOLD, 1 GiB)``; either
call also turns off the dynamic adjustment), large tensors come from the heap and the heap is
not given back between steps. Autotune measures every configuration, the defaults included,
with the allocator pinned, so the profile carries the pin as two environment variables
(``ENV``), which glibc reads when a process starts (``autotune launch``, script-mode trials)
and ``Profile.apply_env`` applies at once (``pin``) in a process already running.

On a C library other than glibc the variables do nothing and ``pin`` returns False. The cost:
a process keeps up to ``TRIM_THRESHOLD`` of freed heap instead of returning it at once.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Mapping

from autotune.core.values import int_range

__all__ = [
    "ENV",
    "MMAP_THRESHOLD",
    "TRIM_THRESHOLD",
    "legal_mmap",
    "legal_trim",
    "pin",
    "pinned",
    "pinned_by_env",
    "readable",
    "trim",
    "without_pin",
]

#: ``M_MMAP_THRESHOLD``: glibc's largest (32 MiB on 64-bit), so gradients, activations and
#: buckets up to that size come from the heap, not a fresh mmap.
MMAP_THRESHOLD = 32 * 2**20
#: ``M_TRIM_THRESHOLD``: the free heap is not given back while a trial runs (``trim`` gives it
#: back explicitly when a trial ends).
TRIM_THRESHOLD = 2**30
#: The same pin as glibc's environment variables (the trailing ``_`` is glibc's spelling).
MMAP_ENV, TRIM_ENV = "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"
ENV: Mapping[str, str] = {MMAP_ENV: str(MMAP_THRESHOLD), TRIM_ENV: str(TRIM_THRESHOLD)}
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # malloc.h


#: Why a value is not one for ``MALLOC_MMAP_THRESHOLD_`` (glibc's range), or None.
legal_mmap = int_range(0, MMAP_THRESHOLD)
#: Why a value is not one for ``MALLOC_TRIM_THRESHOLD_``, or None: ``mallopt`` takes a C int,
#: so a larger value reached glibc as another number (4294967296 became 0).
legal_trim = int_range(0, 2**31 - 1)


def pin(env: Mapping[str, str] = ENV) -> bool:
    """``mallopt`` the thresholds ``env`` names (default: ``ENV``) in this process; False
    where the C library is not glibc or glibc refused a value."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    ok = True
    for name, option in ((MMAP_ENV, _M_MMAP_THRESHOLD), (TRIM_ENV, _M_TRIM_THRESHOLD)):
        if name in env:
            ok = bool(mallopt(option, int(env[name]))) and ok
    return ok


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (glibc 2.33 on): ten ``size_t`` counters."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


#: The block ``pinned`` asks for: under the pinned mmap threshold, far over glibc's starting
#: 128 KiB (which only grows as the process frees mmapped blocks that large).
PROBE_BYTES = MMAP_THRESHOLD - 2**20


def pinned() -> bool | None:
    """Whether glibc's mmap threshold is pinned in this process now, seen in what glibc does,
    not in what was asked of it: a block of ``PROBE_BYTES`` comes from the heap when pinned and
    from a fresh mmap while the threshold is still glibc's own. Meant for a new process (the
    re-validation's rank processes, before any workload: the job as it runs today must run
    unpinned, the arms it is compared with pinned); a process that has freed mmapped blocks
    that large has raised its own threshold and reads as pinned. None off glibc or before
    glibc 2.33 (no ``mallinfo2``). It changes what it reads in a process that is not pinned
    (``pinned_by_env``): call it only where the pin was asked for."""
    try:
        libc = ctypes.CDLL(None)
        info, malloc, free = libc.mallinfo2, libc.malloc, libc.free
    except (OSError, AttributeError):
        return None
    info.restype = _MallInfo2
    malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    free.argtypes = [ctypes.c_void_p]
    before = info().hblks
    block = malloc(PROBE_BYTES)
    if not block:
        return None
    mapped = info().hblks > before
    free(block)
    trim()
    return not mapped


def readable() -> bool:
    """Whether ``pinned`` can tell (glibc 2.33 or newer: ``mallinfo2``), asked without
    allocating anything."""
    try:
        return hasattr(ctypes.CDLL(None), "mallinfo2")
    except OSError:
        return False


def pinned_by_env(environ: Mapping[str, str]) -> bool:
    """Whether a process started with ``environ`` has glibc's thresholds pinned from its
    start: glibc reads these variables once, as the process starts. Read instead of
    ``pinned`` where the process must stay unpinned: ``pinned``'s probe block, freed from an
    mmap, raises glibc's own thresholds to its size (a process nearly pinned after it)."""
    return any(environ.get(k, "").strip() for k in ENV)


def without_pin(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without this pin where a shell left it (``eval "$(autotune env best.yaml)"``
    sets it, and every command started from that shell inherits it): what ``autotune compare
    asis`` runs the job as it is with. The user's own values of those variables stay."""
    return {k: v for k, v in environ.items() if ENV.get(k) != v}


def trim() -> None:
    """Give the free heap back to the system now (``malloc_trim(0)``); nothing off glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
