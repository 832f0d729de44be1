"""An MLP whose middle layer goes through an untraceable helper in a second file."""

import torch
import torch.nn as nn
from _smoothing import soft_clip

from torchkiln.workloads.base import Workload

SIZES = {"full": (256, 1024), "tiny": (4, 32)}


class SmoothNet(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.inp = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d))
        self.out = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d))

    def forward(self, x):
        h = soft_clip(self.inp(x))
        return self.out(h) + x


def build(preset: str = "full", batch_size: int | None = None, step: str = "infer") -> Workload:
    batch, d = SIZES[preset]
    batch = batch_size or batch
    return Workload(
        model=SmoothNet(d),
        example_inputs=(torch.randn(batch, d),),
        name="zoo-smooth-net",
        step=step,
        description="MLP around an untraceable numpy helper in a second file",
    )
