"""Layer 4: thin nn.Modules over the functional API, for models built from modules."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from torchkiln.kernels import functional as F


class Softmax(nn.Module):
    """`torchkiln.kernels.softmax` over the last dimension (only dim=-1 is supported)."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return F.softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class MaskedSoftmax(nn.Module):
    """`torchkiln.kernels.masked_softmax` with a fixed scale, e.g. 1/sqrt(head_dim)."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = F.check_scale("MaskedSoftmax", scale)

    def forward(self, scores: Tensor, mask: Tensor | None = None) -> Tensor:
        return F.masked_softmax(scores, mask, self.scale)

    def extra_repr(self) -> str:
        return f"scale={self.scale}"


class BiasActScale(nn.Module):
    """act(x + bias) * scale with a learned bias of shape [features] (initialised to zeros)."""

    def __init__(
        self,
        features: int,
        act: str = "relu",
        scale: float = 1.0,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if act not in F.ACTIVATIONS:
            raise ValueError(f"BiasActScale: act={act!r}; choose from {sorted(F.ACTIVATIONS)}")
        if isinstance(features, bool) or not isinstance(features, int) or features < 1:
            raise ValueError(f"BiasActScale: features must be a positive int, got {features!r}")
        self.act = act
        self.scale = F.check_scale("BiasActScale", scale)
        self.bias = nn.Parameter(torch.zeros(features, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        return F.bias_act_scale(x, self.bias, self.act, self.scale)

    def extra_repr(self) -> str:
        return f"features={self.bias.shape[0]}, act={self.act!r}, scale={self.scale}"
