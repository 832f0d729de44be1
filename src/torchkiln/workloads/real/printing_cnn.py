"""A small CNN that prints a debug line in forward."""

import torch
import torch.nn as nn

from torchkiln.workloads.base import Workload

SIZES = {"full": (32, 64), "tiny": (2, 16)}  # batch, resolution


class PrintingCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(32, 64, 3, padding=1, stride=2), nn.ReLU())
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        h = self.stem(x)
        print("stem output", h.shape)
        h = self.body(h)
        return self.head(h.mean(dim=(2, 3)))


def build(preset: str = "full", batch_size: int | None = None, step: str = "infer") -> Workload:
    batch, size = SIZES[preset]
    batch = batch_size or batch
    return Workload(
        model=PrintingCNN(),
        example_inputs=(torch.randn(batch, 3, size, size),),
        name="zoo-printing-cnn",
        step=step,
        targets=torch.randint(0, 10, (batch,)),
        convolutional=True,
        description="CNN with a print in forward",
    )
