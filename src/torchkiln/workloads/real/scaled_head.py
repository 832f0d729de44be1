"""A classifier head whose logit scale is a learned tensor read back with `.item()`."""

import torch
import torch.nn as nn

from torchkiln.workloads.base import Workload

SIZES = {"full": (256, 1024), "tiny": (4, 32)}


class ScaledHead(nn.Module):
    def __init__(self, d: int, classes: int = 100) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d))
        self.head = nn.Linear(d, classes)
        self.logit_scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        h = self.body(x)
        return self.head(h) * self.logit_scale.item()


def build(preset: str = "full", batch_size: int | None = None, step: str = "infer") -> Workload:
    batch, d = SIZES[preset]
    batch = batch_size or batch
    return Workload(
        model=ScaledHead(d),
        example_inputs=(torch.randn(batch, d),),
        name="zoo-scaled-head",
        step=step,
        description="classifier head scaled by a learned tensor's .item()",
    )
