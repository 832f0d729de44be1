"""An encoder block as it is often written: a NaN guard, a learned temperature read back as a
Python float, and a log line per call."""

import logging

import torch
import torch.nn as nn

log = logging.getLogger(__name__)


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, heads, batch_first=True)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )
        self.temp = nn.Parameter(torch.tensor(1.0))

    def forward(self, x):
        if torch.isnan(x).any():
            raise ValueError("NaN in the block input")
        h = self.norm1(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        x = x + a / self.temp.item()
        log.info("block output shape %s", tuple(x.shape))
        return x + self.ff(self.norm2(x))
