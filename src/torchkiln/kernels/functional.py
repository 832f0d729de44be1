"""Layer 4: the functional API. Validates its inputs, naming the bad argument, then calls the op.

Every check here is one the kernels rely on; none silently copies or casts what the user passed
(a hidden `.contiguous()` would double the memory traffic the kernels exist to save).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from torchkiln.kernels import ops
from torchkiln.kernels._direct import direct_call
from torchkiln.kernels._launch import direct_launches

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ACTIVATIONS = ("relu", "gelu")
# cuda runs the Triton kernels, cpu the plain-PyTorch implementation, meta only propagates shapes.
DEVICES = ("cuda", "cpu", "meta")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_tensor(fn: str, name: str, t: object, *, min_dim: int = 1, max_dim: int | None = None):
    if not isinstance(t, Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        allowed = ", ".join(_dtype_name(d) for d in FLOAT_DTYPES)
        raise TypeError(f"{fn}: {name}.dtype is {_dtype_name(t.dtype)}; supported: {allowed}")
    if t.device.type not in DEVICES:
        raise ValueError(
            f"{fn}: {name} is on {t.device}; kiln kernels run on cuda (Triton) or cpu "
            "(plain PyTorch)"
        )
    if t.dim() < min_dim or (max_dim is not None and t.dim() > max_dim):
        if max_dim is None:
            want = f"at least {min_dim} dimension(s)"
        elif max_dim == min_dim:
            want = f"exactly {min_dim} dimension(s)"
        else:
            want = f"{min_dim} to {max_dim} dimensions"
        raise ValueError(f"{fn}: {name} must have {want}, got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(
            f"{fn}: {name} must be contiguous (shape {tuple(t.shape)}, strides {t.stride()}); "
            f"the kernel reads whole rows in place. Pass {name}.contiguous() if the copy is "
            "intended."
        )


def check_scale(fn: str, scale: object) -> float:
    # torch.SymFloat: under torch.compile(dynamic=True) a float attribute may arrive symbolic.
    if isinstance(scale, bool) or not isinstance(scale, (int, float, torch.SymFloat)):
        raise TypeError(f"{fn}: scale must be a Python float, got {type(scale).__name__}")
    # Comparisons, not math.isfinite: they also trace on a SymFloat (NaN fails both).
    if not -math.inf < scale < math.inf:
        raise ValueError(f"{fn}: scale must be finite, got {scale!r}")
    return float(scale)


def _check_same_device(fn: str, name: str, t: Tensor, ref_name: str, ref: Tensor) -> None:
    if t.device != ref.device:
        raise ValueError(f"{fn}: {name} is on {t.device} but {ref_name} is on {ref.device}")


def _broadcasts(small: tuple[int, ...], big: tuple[int, ...]) -> bool:
    """Whether a tensor of shape `small` broadcasts to `big` without growing it. A loop, not
    any() over a generator: 0.18 against 0.65 us on this repository's CPU host, on every masked
    call (the H200 host's profile put the generator at 2.3 us)."""
    off = len(big) - len(small)
    if off < 0:
        return False
    for i, m in enumerate(small):
        if m != 1 and m != big[off + i]:
            return False
    return True


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Softmax over the last dimension of `x` (fp32, bf16 or fp16; contiguous).

    Computed in fp32, returned in x's dtype. A row of all -inf gives NaN, as torch.softmax.
    """
    fn = "softmax"
    _check_tensor(fn, "x", x)
    if dim not in (-1, x.dim() - 1):
        raise ValueError(
            f"{fn}: dim={dim}; kiln's softmax reduces over the last dimension only (dim=-1). "
            f"Move the axis: softmax(x.movedim({dim}, -1)).movedim(-1, {dim})"
        )
    if direct_call(x):
        with direct_launches():
            return ops._softmax(x)
    return ops.softmax(x)


def masked_softmax(scores: Tensor, mask: Tensor | None = None, scale: float = 1.0) -> Tensor:
    """softmax(scale * scores + mask) over the last dim of attention scores [batch, heads, q, k].

    `scores` has 1 to 4 dims (missing leading ones are taken as size 1). `mask` broadcasts to
    `scores`: bool, True = attend (as in scaled_dot_product_attention), or floating, added to the
    scaled scores (e.g. 0 / -inf). A row with nothing to attend to gives zeros, not NaN. The mask
    gets no gradient.
    """
    fn = "masked_softmax"
    _check_tensor(fn, "scores", scores, max_dim=4)
    scale = check_scale(fn, scale)
    if mask is not None:
        if not isinstance(mask, Tensor):
            raise TypeError(f"{fn}: mask must be a torch.Tensor or None, got {type(mask).__name__}")
        if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
            raise TypeError(
                f"{fn}: mask.dtype is {_dtype_name(mask.dtype)}; use bool (True = attend) or a "
                "floating additive mask"
            )
        _check_same_device(fn, "mask", mask, "scores", scores)
        if not _broadcasts(mask.shape, scores.shape):
            raise ValueError(
                f"{fn}: mask of shape {tuple(mask.shape)} does not broadcast to scores of shape "
                f"{tuple(scores.shape)} (each mask dim must be 1 or equal scores' dim)"
            )
        if mask.requires_grad:
            raise ValueError(
                f"{fn}: mask requires grad, but masked_softmax treats the mask as a constant and "
                "would silently drop its gradient; pass mask.detach()"
            )
    if direct_call(scores, mask):
        with direct_launches():
            return ops._masked_softmax(scores, mask, scale)
    return ops.masked_softmax(scores, mask, scale)


def bias_act_scale(x: Tensor, bias: Tensor, act: str = "relu", scale: float = 1.0) -> Tensor:
    """act(x + bias) * scale in one pass; `bias` has shape [x.shape[-1]] and x's dtype.

    `act` is "relu" or "gelu" (exact, erf-based, as torch.nn.functional.gelu's default).
    """
    fn = "bias_act_scale"
    _check_tensor(fn, "x", x)
    _check_tensor(fn, "bias", bias, min_dim=1, max_dim=1)
    if act not in ACTIVATIONS:
        raise ValueError(f"{fn}: act={act!r}; choose from {sorted(ACTIVATIONS)}")
    scale = check_scale(fn, scale)
    if bias.shape[0] != x.shape[-1]:
        raise ValueError(
            f"{fn}: bias has shape {tuple(bias.shape)} but x's last dim is {x.shape[-1]}; "
            f"bias must have shape ({x.shape[-1]},)"
        )
    if bias.dtype != x.dtype:
        raise TypeError(
            f"{fn}: bias.dtype is {_dtype_name(bias.dtype)} but x.dtype is "
            f"{_dtype_name(x.dtype)}; cast bias to x's dtype"
        )
    _check_same_device(fn, "bias", bias, "x", x)
    if direct_call(x, bias):
        with direct_launches():
            return ops._bias_act_scale(x, bias, act, scale)
    return ops.bias_act_scale(x, bias, act, scale)
