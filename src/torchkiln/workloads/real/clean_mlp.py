"""A residual MLP with no graph break: the control of the zoo."""

import torch
import torch.nn as nn

from torchkiln.workloads.base import Workload

SIZES = {"full": (256, 1024), "tiny": (4, 32)}


class CleanMLP(nn.Module):
    def __init__(self, d: int, layers: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        for layer in self.layers:
            x = x + torch.relu(layer(self.norm(x)))
        return x


def build(preset: str = "full", batch_size: int | None = None, step: str = "infer") -> Workload:
    batch, d = SIZES[preset]
    batch = batch_size or batch
    return Workload(
        model=CleanMLP(d),
        example_inputs=(torch.randn(batch, d),),
        name="zoo-clean-mlp",
        step=step,
        description="residual MLP without graph breaks",
    )
