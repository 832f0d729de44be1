"""Variants: one frozen dataclass per way of running a model, a registry and spec strings.

A spec is ``backend[:key=value,...][+policy...]``, for example
``inductor:mode=max-autotune,dynamic=false+bf16+channels_last``.
"""

from torchkiln.variants import builtin  # noqa: F401  (registers eager, inductor, cudagraphs)
from torchkiln.variants.base import (
    LAYOUTS,
    PRECISIONS,
    Backend,
    Variant,
    VariantSpecError,
    available_backends,
    parse_variant,
    register_backend,
    split_variants,
)

__all__ = [
    "LAYOUTS",
    "PRECISIONS",
    "Backend",
    "Variant",
    "VariantSpecError",
    "available_backends",
    "parse_variant",
    "register_backend",
    "split_variants",
]
