"""Stacked Linear layers on synthetic regression data (Adam, MSE); communication-heavy.

With the defaults (4 x Linear(2048, 2048) plus a head, 16.8 M parameters, global batch 128 =
2 ranks x 64) this is the model the project's network-lab measurements were taken with.
"""

from __future__ import annotations

import torch
from torch import nn

from autotune.rank.workload import Workload


class SyntheticRegression(torch.utils.data.Dataset):
    """``length`` samples computed from their index, so every rank and run sees the same data."""

    def __init__(self, *, length: int, width: int, outputs: int, seed: int) -> None:
        self.length, self.width, self.outputs, self.seed = length, width, outputs, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        x = torch.randn(self.width, generator=g)
        y = torch.sin(x[: self.outputs]) + 0.1 * x[self.outputs : 2 * self.outputs]
        return x, y


def workload(
    *,
    width: int = 2048,
    layers: int = 4,
    outputs: int = 16,
    global_batch: int = 128,
    samples: int = 1 << 20,
    lr: float = 1e-3,
    seed: int = 0,
) -> Workload:
    def model() -> nn.Module:
        blocks: list[nn.Module] = []
        for _ in range(layers):
            blocks += [nn.Linear(width, width), nn.ReLU()]
        return nn.Sequential(*blocks, nn.Linear(width, outputs))

    return Workload(
        model=model,
        dataset=SyntheticRegression(length=samples, width=width, outputs=outputs, seed=seed),
        loss=nn.functional.mse_loss,
        optimizer=lambda params: torch.optim.Adam(params, lr=lr),
        global_batch=global_batch,
        description=f"MLP {layers}x{width}, global batch {global_batch}",
    )
