"""Hand-written Triton kernels for what the compiler does badly, usable in training.

    from torchkiln.kernels import softmax, masked_softmax, bias_act_scale

Four layers per kernel, lowest first: private @triton.jit kernels (`_softmax_kernels`,
`_bias_act`), the launchers (`_softmax` with its launch policy `_softmax_policy`, `_bias_act`),
the `kiln::*` torch.library ops with autograd and a CPU implementation (`ops`), and this
functional API with thin nn.Modules (`functional`, `modules`).

Importing this package imports neither torch nor triton; the names below load on first use. CPU
tensors need no triton; on a CUDA tensor without triton the call raises MissingExtraError naming
the `triton` extra.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "softmax": "functional",
    "masked_softmax": "functional",
    "bias_act_scale": "functional",
    "ACTIVATIONS": "functional",
    "Softmax": "modules",
    "MaskedSoftmax": "modules",
    "BiasActScale": "modules",
    "HAS_TRITON": "ops",
    "launch_cache_status": "_launch_cache",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'torchkiln.kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"torchkiln.kernels.{_EXPORTS[name]}"), name)
    # Cached as a real attribute: `kernels.softmax(x)` in a loop must not pay an import lookup
    # per call (about 10 us on the CPU here).
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
