"""ResNet-style CNN on synthetic images whose loading costs CPU (decode, crop, flip, normalise).

Each sample is "decoded" from a small seeded uint8 picture (bilinear upsampling and blur
passes stand in for JPEG decoding) and augmented (random crop, horizontal flip), all on the
CPU in ``__getitem__``: DataLoader workers, prefetching and pinned memory have real work to
overlap, unlike the MLP's cheap tensors. ``decode_passes`` sets how much.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from autotune.rank.workload import Workload

PAD = 4  # pixels of random-crop margin on each side


class SyntheticImages(torch.utils.data.Dataset):
    """``length`` labelled images computed from their index: every rank and run sees the same."""

    def __init__(self, *, length: int, size: int, classes: int, decode_passes: int, seed: int):
        self.length, self.size, self.classes = length, size, classes
        self.decode_passes, self.seed = decode_passes, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        small = torch.randint(
            0, 256, (3, self.size // 4, self.size // 4), generator=g, dtype=torch.uint8
        )
        # The label is a property of the picture (its brightest channel), so there is something
        # to learn and the loss falls.
        label = int(small.float().mean(dim=(1, 2)).argmax()) % self.classes
        # "Decode": upsample to full size plus margin, then blur passes.
        full = self.size + 2 * PAD
        img = F.interpolate(
            small.float().div(255).unsqueeze(0),
            size=(full, full),
            mode="bilinear",
            align_corners=False,
        )
        for _ in range(self.decode_passes):
            img = F.avg_pool2d(img, 3, stride=1, padding=1)
        # Augment: random crop and horizontal flip; normalise.
        i, j = torch.randint(0, 2 * PAD + 1, (2,), generator=g).tolist()
        img = img[0, :, i : i + self.size, j : j + self.size]
        if torch.rand((), generator=g) < 0.5:
            img = img.flip(-1)
        return (img - 0.5) / 0.25, label


class Block(nn.Module):
    """ResNet basic block: two 3x3 convolutions with batch norm and a shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = (
            nn.Identity()
            if stride == 1 and cin == cout
            else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.short(x))


def resnet(width: int, blocks: int, classes: int) -> nn.Module:
    layers: list[nn.Module] = [
        nn.Conv2d(3, width, 3, 1, 1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
    ]
    cin = width
    for stage in range(3):
        cout = width * 2**stage
        for b in range(blocks):
            layers.append(Block(cin, cout, 2 if stage and b == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def workload(
    *,
    size: int = 32,
    width: int = 32,
    blocks: int = 1,
    classes: int = 10,
    decode_passes: int = 16,
    global_batch: int = 64,
    samples: int = 1 << 16,
    lr: float = 0.05,
    seed: int = 0,
) -> Workload:
    return Workload(
        model=lambda: resnet(width, blocks, classes),
        dataset=SyntheticImages(
            length=samples, size=size, classes=classes, decode_passes=decode_passes, seed=seed
        ),
        loss=F.cross_entropy,
        optimizer=lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9),
        global_batch=global_batch,
        description=f"ResNet-style CNN width {width}, {size}x{size} images, "
        f"global batch {global_batch}",
    )
