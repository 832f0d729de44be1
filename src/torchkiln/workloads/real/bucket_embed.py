"""Bucketised features through numpy: `np.digitize` on the tensor's array, then an embedding
and an MLP. numpy.digitize is not one Dynamo can trace."""

import numpy as np
import torch
import torch.nn as nn

from torchkiln.workloads.base import Workload

SIZES = {"full": (256, 64, 256), "tiny": (4, 8, 16)}  # batch, features, embedding dim


class BucketEmbed(nn.Module):
    def __init__(self, features: int, dim: int, buckets: int = 16) -> None:
        super().__init__()
        self.edges = np.linspace(-2.0, 2.0, buckets - 1).astype(np.float32)
        self.embed = nn.Embedding(buckets, dim)
        self.mlp = nn.Sequential(
            nn.Linear(features * dim, 4 * dim), nn.ReLU(), nn.Linear(4 * dim, dim)
        )

    def forward(self, x):
        idx = torch.from_numpy(np.digitize(x.detach().cpu().numpy(), self.edges))
        e = self.embed(idx.to(x.device))
        return self.mlp(e.flatten(1))


def build(preset: str = "full", batch_size: int | None = None, step: str = "infer") -> Workload:
    batch, features, dim = SIZES[preset]
    batch = batch_size or batch
    return Workload(
        model=BucketEmbed(features, dim),
        example_inputs=(torch.randn(batch, features),),
        name="zoo-bucket-embed",
        step=step,
        description="numpy.digitize buckets, an embedding and an MLP",
    )
