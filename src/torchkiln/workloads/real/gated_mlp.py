"""An MLP that picks its activation from a statistic of the input: a Python branch on a
tensor (a data-dependent jump Dynamo cannot trace)."""

import torch
import torch.nn as nn

from torchkiln.workloads.base import Workload

SIZES = {"full": (256, 1024), "tiny": (4, 32)}


class GatedMLP(nn.Module):
    def __init__(self, d: int, layers: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            h = layer(x)
            if h.mean() > 0:
                h = torch.relu(h)
            else:
                h = torch.tanh(h)
            x = x + h
        return x


def build(preset: str = "full", batch_size: int | None = None, step: str = "infer") -> Workload:
    batch, d = SIZES[preset]
    batch = batch_size or batch
    return Workload(
        model=GatedMLP(d),
        example_inputs=(torch.randn(batch, d),),
        name="zoo-gated-mlp",
        step=step,
        description="MLP with a Python branch on a tensor per layer",
    )
