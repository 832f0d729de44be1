"""Layer 3: the `kiln::*` torch.library ops, their autograd and their CPU implementations.

With triton installed each op is a `torch.library.triton_op`: under torch.compile the launches
inside it are traced (via `wrap_triton`) and Inductor calls the kernels itself, so a model using
them compiles with no graph break. CPU tensors take plain-PyTorch implementations that compute in
fp32 and round once, like the kernels; they need no triton at all. Without triton the same ops are
plain `custom_op`s whose CUDA path raises MissingExtraError naming the `triton` extra.

These ops trust their inputs; `torchkiln.kernels.functional` validates them and names the bad
argument.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from torchkiln.errors import MissingExtraError, require
from torchkiln.kernels._direct import direct_call
from torchkiln.kernels._launch import direct_launches

NAMESPACE = "kiln"


def _triton_installed() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


HAS_TRITON = _triton_installed()


@functools.cache
def launchers() -> tuple[ModuleType, ModuleType]:
    """The launcher modules (softmax, bias_act); MissingExtraError when triton is not installed.

    Cached: it sits on every CUDA call, whose Python overhead decides small-tensor timings.
    """
    require("triton", "triton", "kiln's CUDA kernels (torchkiln.kernels on a GPU tensor)")
    return (
        importlib.import_module("torchkiln.kernels._softmax"),
        importlib.import_module("torchkiln.kernels._bias_act"),
    )


# ---- CPU implementations (plain PyTorch, fp32 inside, one rounding at the end) -----------------


def _softmax_cpu(x: Tensor) -> Tensor:
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def _softmax_backward_cpu(y: Tensor, dy: Tensor, scale: float) -> Tensor:
    yf, dyf = y.float(), dy.float()
    return (yf * (dyf - (yf * dyf).sum(-1, keepdim=True)) * scale).to(y.dtype)


def _masked_softmax_cpu(scores: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    z = scores.float() * scale
    if mask is not None:
        z = z.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else z + mask.float()
    y = torch.softmax(z, dim=-1)
    # A row with no finite score is 0/0 in softmax; masked_softmax defines it as zeros.
    empty = torch.isneginf(z).all(dim=-1, keepdim=True)
    return y.masked_fill(empty, 0.0).to(scores.dtype)


def _act_cpu(z: Tensor, act: str) -> Tensor:
    return torch.relu(z) if act == "relu" else torch.nn.functional.gelu(z)


def _bias_act_cpu(x: Tensor, bias: Tensor, act: str, scale: float) -> Tensor:
    return (_act_cpu(x.float() + bias.float(), act) * scale).to(x.dtype)


def _bias_act_backward_cpu(
    x: Tensor, bias: Tensor, dy: Tensor, act: str, scale: float
) -> tuple[Tensor, Tensor]:
    z = x.float() + bias.float()
    dyf = dy.float() * scale
    if act == "relu":
        dz = torch.where(z > 0, dyf, 0.0)
    else:
        dz = torch.ops.aten.gelu_backward(dyf, z)
    return dz.to(x.dtype), dz.reshape(-1, x.shape[-1]).sum(0).to(bias.dtype)


# ---- op bodies: the kernels on CUDA, the CPU implementation elsewhere --------------------------
# The CPU branch also serves torch.compile on CPU tensors, where the body itself is traced.


@functools.cache
def _cuda_available() -> bool:
    # Cached: torch.cuda.is_available() costs ~1 us, on every eager call (this repo's CPU host).
    return torch.cuda.is_available()


# The current CUDA device's index, without torch.cuda.current_device()'s lazy-init check (the
# callers hold CUDA tensors already); None on a torch without it.
_current_device = getattr(torch._C, "_cuda_getDevice", None)


def _on_device_of(t: Tensor) -> contextlib.AbstractContextManager:
    """Triton launches on the *current* CUDA device; a tensor on another GPU needs it switched.
    (No CUDA at all: only fake CUDA tensors get here, and nothing is launched.) Already current,
    the common case, it is left alone: entering torch.cuda.device costs a few us a call."""
    index = t.device.index
    if index is None or not _cuda_available():
        return contextlib.nullcontext()
    if _current_device is not None and _current_device() == index:
        return contextlib.nullcontext()
    return torch.cuda.device(index)


def _softmax(x: Tensor) -> Tensor:
    if x.device.type != "cuda":
        return _softmax_cpu(x)
    with _on_device_of(x):
        return launchers()[0].eager_forward(x)


def _softmax_backward(y: Tensor, dy: Tensor, scale: float) -> Tensor:
    if y.device.type != "cuda":
        return _softmax_backward_cpu(y, dy, scale)
    with _on_device_of(y):
        return launchers()[0].eager_backward(y, dy, scale)


def _masked_softmax(scores: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    if scores.device.type != "cuda":
        return _masked_softmax_cpu(scores, mask, scale)
    # The launcher addresses the mask through its broadcast strides: no view is built here.
    with _on_device_of(scores):
        return launchers()[0].eager_forward(scores, mask, scale, safe=True)


def _bias_act_scale(x: Tensor, bias: Tensor, act: str, scale: float) -> Tensor:
    if x.device.type != "cuda":
        return _bias_act_cpu(x, bias, act, scale)
    with _on_device_of(x):
        return launchers()[1].eager_forward(x, bias, act, scale)


def _bias_act_scale_backward(
    x: Tensor, bias: Tensor, dy: Tensor, act: str, scale: float
) -> tuple[Tensor, Tensor]:
    if x.device.type != "cuda":
        return _bias_act_backward_cpu(x, bias, dy, act, scale)
    with _on_device_of(x):
        return launchers()[1].eager_backward(x, bias, dy, act, scale)


_CPU = {
    "softmax": _softmax_cpu,
    "softmax_backward": _softmax_backward_cpu,
    "masked_softmax": _masked_softmax_cpu,
    "bias_act_scale": _bias_act_cpu,
    "bias_act_scale_backward": _bias_act_backward_cpu,
}


def _define(name: str, body: Any, schema: str) -> Any:
    qualname = f"{NAMESPACE}::{name}"
    if HAS_TRITON:
        # triton_op also registers `body` as the fake (meta) implementation: on fake CUDA tensors
        # the launch becomes a traced triton_kernel_wrapper node that allocates nothing.
        op = torch.library.triton_op(qualname, body, mutates_args=(), schema=schema)
    else:
        op = torch.library.custom_op(qualname, body, mutates_args=(), schema=schema)
        # The CPU implementation is shape-correct and made of aten ops, so it is a valid fake.
        op.register_fake(_CPU[name])
    op.register_kernel("cpu", _CPU[name])
    return op


softmax = _define("softmax", _softmax, "(Tensor x) -> Tensor")
softmax_backward = _define(
    "softmax_backward", _softmax_backward, "(Tensor y, Tensor dy, float scale) -> Tensor"
)
masked_softmax = _define(
    "masked_softmax", _masked_softmax, "(Tensor scores, Tensor? mask, float scale) -> Tensor"
)
bias_act_scale = _define(
    "bias_act_scale", _bias_act_scale, "(Tensor x, Tensor bias, str act, float scale) -> Tensor"
)
bias_act_scale_backward = _define(
    "bias_act_scale_backward",
    _bias_act_scale_backward,
    "(Tensor x, Tensor bias, Tensor dy, str act, float scale) -> (Tensor, Tensor)",
)


# ---- autograd ------------------------------------------------------------------------------------
# Backward ops take contiguous gradients: autograd may hand over expanded (stride-0) ones, e.g.
# from `.sum()`, and the kernels address rows as contiguous memory.


def autograd_softmax_backward(y: Tensor, dy: Tensor, scale: float) -> Tensor:
    """What the softmax ops' backward runs: in eager training on CUDA, where nothing needs the
    dispatcher (`_direct.direct_call`: grad mode is off in a plain backward), the op's body
    directly, as an eager forward call does; the op otherwise (torch.compile traces it, double
    backward, profilers). On the H200 the backward call's host time (70-110 us against the
    forward's 30, commit 550ec6a) kept the short rows' backward launch-bound."""
    if direct_call(y, dy):
        with direct_launches():
            return _softmax_backward(y, dy, scale)
    return softmax_backward(y, dy, scale)


def autograd_bias_act_backward(
    x: Tensor, bias: Tensor, dy: Tensor, act: str, scale: float
) -> tuple[Tensor, Tensor]:
    """bias_act_scale's backward as autograd runs it (see autograd_softmax_backward)."""
    if direct_call(x, bias, dy):
        with direct_launches():
            return _bias_act_scale_backward(x, bias, dy, act, scale)
    return bias_act_scale_backward(x, bias, dy, act, scale)


def _softmax_setup(ctx: Any, inputs: tuple, output: Tensor) -> None:
    ctx.save_for_backward(output)


def _softmax_grad(ctx: Any, dy: Tensor) -> Tensor:
    (y,) = ctx.saved_tensors
    return autograd_softmax_backward(y, dy.contiguous(), 1.0)


def _masked_softmax_setup(ctx: Any, inputs: tuple, output: Tensor) -> None:
    ctx.save_for_backward(output)
    ctx.scale = inputs[2]


def _masked_softmax_grad(ctx: Any, dy: Tensor) -> tuple[Tensor, None, None]:
    # The mask is a constant: functional.masked_softmax refuses a mask that requires grad.
    (y,) = ctx.saved_tensors
    return autograd_softmax_backward(y, dy.contiguous(), ctx.scale), None, None


def _bias_act_setup(ctx: Any, inputs: tuple, output: Tensor) -> None:
    x, bias, act, scale = inputs
    # x and bias, not the output: the backward needs act'(x + bias), which the output alone does
    # not determine for gelu.
    ctx.save_for_backward(x, bias)
    ctx.act, ctx.scale = act, scale


def _bias_act_grad(ctx: Any, dy: Tensor) -> tuple[Tensor, Tensor, None, None]:
    x, bias = ctx.saved_tensors
    dx, dbias = autograd_bias_act_backward(x, bias, dy.contiguous(), ctx.act, ctx.scale)
    return dx, dbias, None, None


softmax.register_autograd(_softmax_grad, setup_context=_softmax_setup)
masked_softmax.register_autograd(_masked_softmax_grad, setup_context=_masked_softmax_setup)
bias_act_scale.register_autograd(_bias_act_grad, setup_context=_bias_act_setup)

__all__ = [
    "HAS_TRITON",
    "MissingExtraError",
    "autograd_bias_act_backward",
    "autograd_softmax_backward",
    "bias_act_scale",
    "bias_act_scale_backward",
    "launchers",
    "masked_softmax",
    "softmax",
    "softmax_backward",
]
