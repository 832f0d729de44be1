"""What an inference and a training stream trial set up alike: dynamo's recompile limit, and
the input dims that follow the stream's varying sizes."""

from __future__ import annotations

from typing import Any

from torchkiln.errors import KilnUserError


def _raise_recompile_limit(n: int) -> None:
    import torch._dynamo.config as cfg

    # torch 2.11-2.14 differ: recompile_limit was cache_size_limit
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, name, max(n, int(getattr(cfg, name))))


def _varying_dims(stream: Any) -> list[list[Any]] | None:
    """[input, dim, size name] per input dim that follows a varying size (None when the stream
    has no sizes): a list, as JSON keeps no integer keys, for the recommendation's code."""
    from torchkiln.measure.stream_buckets import dynamic_dims

    try:
        dims = dynamic_dims(stream)
    except KilnUserError:
        return None
    return [[k, d, n] for k, ds in dims.items() for d, n in ds.items()]
