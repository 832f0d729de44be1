"""An MLP that asserts its activations stay bounded: an assert on a tensor value with an
f-string message (Dynamo rewrites a constant-message assert itself, not this one)."""

import torch
import torch.nn as nn

from torchkiln.workloads.base import Workload

SIZES = {"full": (256, 1024), "tiny": (4, 32)}


class CheckedMLP(nn.Module):
    def __init__(self, d: int, layers: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = torch.relu(layer(self.norm(x))) + x
            assert (x.abs() < 1e6).all(), f"activation overflow after layer {i}"
        return x


def build(preset: str = "full", batch_size: int | None = None, step: str = "infer") -> Workload:
    batch, d = SIZES[preset]
    batch = batch_size or batch
    return Workload(
        model=CheckedMLP(d),
        example_inputs=(torch.randn(batch, d),),
        name="zoo-checked-mlp",
        step=step,
        description="MLP with an assert on its activations per layer",
    )
