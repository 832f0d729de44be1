"""A 6-block transformer encoder (d 512, 8 heads, nn.MultiheadAttention) whose blocks each carry
a NaN guard, a `.item()` and a `log.info` call: three graph breaks per block."""

import torch
import torch.nn as nn
from _encoder_blocks import Block

from torchkiln.workloads.base import Workload

SIZES = {"full": (16, 128, 512, 8), "tiny": (2, 16, 32, 2)}  # batch, seq, d_model, heads


class Encoder(nn.Module):
    def __init__(self, d_model: int, heads: int, blocks: int = 6) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(blocks))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


def build(preset: str = "full", batch_size: int | None = None, step: str = "infer") -> Workload:
    batch, seq, d, heads = SIZES[preset]
    batch = batch_size or batch
    return Workload(
        model=Encoder(d, heads),
        example_inputs=(torch.randn(batch, seq, d),),
        name="zoo-encoder",
        step=step,
        description="6-block encoder with a NaN guard, .item() and log.info per block",
        meta={"batch": batch, "seq_len": seq, "d_model": d},
    )
