"""What a process runs on: recorded in every profile, compared when a profile is applied."""

from __future__ import annotations

import math
import os
import socket
from typing import Any

from autotune.core import compiling
from autotune.core.target import Target
from autotune.core.values import shown

__all__ = ["assumed", "bf16_matmul_ratio", "describe", "differences", "nvlink_active", "target_of"]

#: The ``hardware`` keys that a profile's measurements depend on.
COMPARED = ("device", "device_name", "device_count", "torch", "cuda", "nccl", "bf16_native")


def describe(backend: str) -> dict[str, Any]:
    """The hardware this process sees, as the profile's ``hardware`` section records it."""
    import platform

    import torch

    info: dict[str, Any] = {
        "host": socket.gethostname(),
        "cpus": os.cpu_count() or 1,
        "torch": str(torch.__version__),  # TorchVersion is a str subclass YAML cannot dump
        "nccl": None,
    }
    if backend == "nccl":
        if not torch.cuda.is_available():
            return {**info, "error": "no CUDA device is visible to the rank"}
        props = torch.cuda.get_device_properties(0)
        info.update(
            device="cuda",
            device_name=props.name,
            device_count=torch.cuda.device_count(),
            capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / 2**30, 1),
            bf16=bool(torch.cuda.is_bf16_supported()),
            bf16_native=bool(torch.cuda.is_bf16_supported(including_emulation=False)),
            tf32=props.major >= 8,
            cuda=torch.version.cuda,
            nccl=".".join(map(str, torch.cuda.nccl.version())),
            **_nvidia_smi(),
        )
    else:
        name, flags = _cpuinfo()
        ratio = bf16_matmul_ratio()
        # For a CPU the count is its cores: what the ranks of one node share. Every CPU runs
        # bf16 autocast; only one whose bf16 matmuls are faster than its fp32 ones runs it
        # fast: measured where it can be, else read from the instruction-set flags.
        info.update(
            device="cpu",
            device_name=name or platform.processor() or platform.machine(),
            device_count=info["cpus"],
            bf16=True,
            bf16_native=bool(CPU_BF16_FLAGS & flags) if ratio is None else ratio < BF16_FAST,
            bf16_matmul_ratio=None if ratio is None else round(ratio, 2),
            tf32=False,
        )
    # Why torch.compile cannot run on these ranks (no C++ compiler, no triton), or None: the
    # study's target leaves the compile knob out with it (core.compiling).
    info["compile_problem"] = compiling.problem(info["device"])
    return info


def target_of(
    hw: dict[str, Any],
    *,
    backend: str,
    world_size: int,
    global_batch: int,
    cpus_per_rank: int,
    free_batch: bool,
) -> Target:
    """What a search space is resolved against, from the hardware ``hw`` seen from rank 0
    (``describe``, with the ``node_count`` the ranks span); ``cpus_per_rank``: what each
    rank's bundle reserves, capped here by the CPUs its node has."""
    ranks_per_node = math.ceil(world_size / hw["node_count"])
    return Target(
        backend=backend,
        device=hw["device"],
        world_size=world_size,
        global_batch=global_batch,
        cpus_per_rank=max(1, min(cpus_per_rank, hw["cpus"] // ranks_per_node)),
        bf16=bool(hw.get("bf16")),
        bf16_native=bool(hw.get("bf16_native")),
        bf16_ratio=hw.get("bf16_matmul_ratio"),
        tf32=bool(hw.get("tf32")),
        free_batch=free_batch,
        ranks_per_node=ranks_per_node,
        compile_problem=hw.get("compile_problem", compiling.NOT_PROBED),
    )


def assumed(
    backend: str, *, world_size: int, node_count: int, cpus_per_rank: int
) -> dict[str, Any]:
    """The hardware a run assumes before its probe: the backend's device, on ``node_count``
    nodes with the CPUs its ranks' bundles reserve (``cpus_per_rank`` each), nothing else known
    (no bf16, no TF32, compile unprobed). The defaults' environment on it is what the probe's
    rank processes start with (``launcher.TrialRunner.probe``): it depends on the hardware
    through the CPUs per rank only, which the probe then confirms unless a node has fewer."""
    cpus = cpus_per_rank * math.ceil(world_size / node_count)
    return {
        "device": "cuda" if backend == "nccl" else "cpu",
        "node_count": node_count,
        "cpus": cpus,
    }


#: /proc/cpuinfo flags of CPUs whose instruction set has bf16 dot products (AVX512-BF16,
#: AMX): what says whether bf16 is native where the matmuls cannot be timed
#: (``bf16_matmul_ratio`` None). Only x86 flags are read: an ARM CPU reads as without.
CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})

#: A CPU runs bf16 natively where a bf16 matmul takes less time than the same fp32 one
#: (``bf16_matmul_ratio`` under this). The flags alone do not say it: on one machine with AMX,
#: a 256x512 by 512x512 matmul, one thread, bf16 over fp32: 0.17 as it is; with oneDNN capped
#: (``ONEDNN_MAX_CPU_ISA``) to AVX512_CORE_BF16 (AVX512-BF16 without AMX) 1.6, to AVX512_CORE
#: 3.6, to AVX2 60. The default MLP's whole bf16 step over its fp32 one under the same caps:
#: 0.8, 1.24, 2.6 and 80; an AVX2 machine without bf16 units ran it about 20x slower.
BF16_FAST = 1.0
#: The matmul ``bf16_matmul_ratio`` times: (rows, inner, columns).
BF16_PROBE_SHAPE = (256, 512, 512)
#: Timed calls of each dtype, after one untimed (oneDNN builds its kernel on the first).
BF16_PROBE_CALLS = 5


def bf16_matmul_ratio() -> float | None:
    """The best time of a bf16 matmul over the best time of the same fp32 one
    (``BF16_PROBE_SHAPE``, on one thread, calls of the two interleaved), or None where bf16
    matmuls fail here. About 10 ms where bf16 is native; a bf16 call that alone takes ten
    times fp32's best ends the timing (emulated: about 60 ms a call)."""
    import time

    import torch

    rows, inner, cols = BF16_PROBE_SHAPE
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the ratio of the two, not the machine's parallelism
    try:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(rows, inner, generator=gen)
        b = torch.randn(inner, cols, generator=gen)
        pairs = {torch.float32: (a, b), torch.bfloat16: (a.bfloat16(), b.bfloat16())}
        best = {dtype: math.inf for dtype in pairs}
        for call in range(BF16_PROBE_CALLS + 1):
            for dtype, (x, y) in pairs.items():
                start = time.perf_counter()
                torch.mm(x, y)
                took = time.perf_counter() - start
                if call:  # the first call of each builds its kernel
                    best[dtype] = min(best[dtype], took)
            if call and best[torch.bfloat16] > 10 * best[torch.float32]:
                break
        return best[torch.bfloat16] / best[torch.float32]
    except RuntimeError:  # a build without bf16 matmuls on this CPU
        return None
    finally:
        torch.set_num_threads(threads)


def _cpuinfo(path: str = "/proc/cpuinfo") -> tuple[str | None, frozenset[str]]:
    """The CPU's model name and instruction-set flags from /proc/cpuinfo (Linux); (None, no
    flags) where it cannot be read. torch has no public call that says whether the CPU has
    bf16 dot products."""
    name, flags = None, frozenset()
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and name is None:
                    name = value.strip()
                elif key == "flags" and not flags:
                    flags = frozenset(value.split())
                if name is not None and flags:
                    break
    except OSError:
        pass
    return name, flags


#: How long ``nvidia-smi`` may take to answer before the fields it gives are left unknown.
SMI_TIMEOUT_S = 10.0


def _nvidia_smi() -> dict[str, Any]:
    """The driver version and whether the visible GPUs are linked by NVLink, from
    ``nvidia-smi`` (torch reports neither). ``driver``: the version string or None;
    ``nvlink``: True when some GPU has an active NVLink, False when none has, None when
    ``nvidia-smi`` could not say (not installed, timed out). One GPU alone has no NVLink peer:
    False there says so."""
    import shutil
    import subprocess

    out: dict[str, Any] = {"driver": None, "nvlink": None}
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return out

    def ask(*args: str) -> str | None:
        try:
            p = subprocess.run(
                [smi, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return p.stdout if p.returncode == 0 else None

    driver = ask("--query-gpu=driver_version", "--format=csv,noheader")
    if driver and driver.strip():
        out["driver"] = driver.strip().splitlines()[0].strip()
    status = ask("nvlink", "--status")
    if status is not None:  # "Link 0: 26.562 GB/s" per active link; nothing without NVLink
        out["nvlink"] = nvlink_active(status)
    return out


def nvlink_active(status: str) -> bool:
    """Whether ``nvidia-smi nvlink --status`` output shows an active link (a ``Link N: <speed>``
    line; inactive links read ``<inactive>``)."""
    links = [ln.strip() for ln in status.splitlines() if ln.strip().startswith("Link ")]
    return any(":" in ln and "inactive" not in ln.split(":", 1)[1].lower() for ln in links)


#: The most characters of one recorded value a difference line shows (a profile may come from
#: someone else: its values are checked short, and shown cut besides).
SHOWN_CHARS = 80


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``key: recorded -> current`` for every compared key that differs, each value shown in
    at most ``SHOWN_CHARS`` characters."""
    return [
        f"{k}: {_shown(recorded.get(k))} -> {_shown(current.get(k))}"
        for k in COMPARED
        if k in recorded and recorded.get(k) != current.get(k)
    ]


def _shown(value: Any) -> str:
    if not isinstance(value, (str, int, float, bool, type(None))):
        return f"<{type(value).__name__}>"
    return shown(value, SHOWN_CHARS)
