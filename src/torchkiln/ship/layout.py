"""Inputs in the pick's memory layout, as the tune measured them."""

from __future__ import annotations

from typing import Any


def to_layout(x: Any, channels_last: bool) -> Any:
    """4-D float inputs in channels_last when the pick is; anything else as it is."""
    import torch

    if channels_last and isinstance(x, torch.Tensor) and x.dim() == 4 and x.is_floating_point():
        return x.contiguous(memory_format=torch.channels_last)
    return x
