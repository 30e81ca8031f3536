"""What a process runs on: recorded in every profile, compared when a profile is applied."""

from __future__ import annotations

import os
import socket
from typing import Any

__all__ = ["describe", "differences"]

#: The ``hardware`` keys that a profile's measurements depend on.
COMPARED = ("device", "device_name", "device_count", "torch", "nccl")


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
            bf16=bool(torch.cuda.is_bf16_supported()),
            tf32=props.major >= 8,
            nccl=".".join(map(str, torch.cuda.nccl.version())),
        )
    else:
        name = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        name = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        # For a CPU the count is its cores: what the ranks of one node share.
        info.update(
            device="cpu", device_name=name, device_count=info["cpus"], bf16=True, tf32=False
        )
    return info


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``key: recorded -> current`` for every compared key that differs."""
    return [
        f"{k}: {recorded.get(k)!r} -> {current.get(k)!r}"
        for k in COMPARED
        if k in recorded and recorded.get(k) != current.get(k)
    ]
