"""Eager calls that need nothing from the dispatcher skip torch.library and run the op's body;
everything else keeps the op. The conditions are checked here on the CPU; the direct calls
themselves run on the GPU (marked `gpu`)."""

from __future__ import annotations

import pytest
import torch
from kernels_reference import (
    GELU_ATOL,
    assert_close,
    bias_act_ref,
    masked_softmax_ref,
    softmax_backward_ref,
    softmax_ref,
)
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import FlopCounterMode

from torchkiln.kernels import bias_act_scale, masked_softmax, softmax
from torchkiln.kernels._direct import direct_call, dispatch_free


class _PassThrough(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_plain_tensors_without_autograd_are_dispatch_free():
    x = torch.randn(4, 8)
    assert dispatch_free([x])
    with torch.no_grad():
        assert dispatch_free([x.requires_grad_()])
    assert not direct_call(torch.randn(4, 8))  # CPU tensors always keep the op


def test_what_the_dispatcher_must_see_keeps_the_op():
    x = torch.randn(4, 8)
    assert not dispatch_free([torch.randn(4, 8, requires_grad=True)])  # autograd
    assert not dispatch_free([x, torch.randn(8, requires_grad=True)])  # any input's autograd
    with FlopCounterMode(display=False):  # a dispatch mode
        assert not dispatch_free([x])
    with _PassThrough():  # a torch-function mode
        assert not dispatch_free([x])
    seen = []
    torch.func.vmap(lambda t: seen.append(dispatch_free([t])) or t)(x)  # a functorch transform
    assert seen == [False]
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = mode.from_tensor(x)
    assert not dispatch_free([fake])  # a tensor subclass


def test_compiled_code_keeps_the_op_without_a_graph_break():
    def f(x):
        return x + (1.0 if dispatch_free([x]) else 0.0)

    x = torch.zeros(3)
    assert torch.equal(torch.compile(f, fullgraph=True)(x), x)  # False while tracing
    assert torch.equal(f(x), x + 1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_direct_calls_on_the_gpu_match_the_references(dtype):
    torch.manual_seed(0)
    x = torch.randn(37, 781, device="cuda").to(dtype)
    s = torch.randn(2, 3, 5, 129, device="cuda").to(dtype)
    mask = torch.rand(2, 1, 1, 129, device="cuda") > 0.3
    bias = torch.randn(781, device="cuda").to(dtype)
    with torch.no_grad():
        assert direct_call(x) and direct_call(s, mask) and direct_call(x, bias)
        assert_close(softmax(x), softmax_ref(x), dtype, "softmax (direct)")
        assert_close(
            masked_softmax(s, mask, 0.5),
            masked_softmax_ref(s, mask, 0.5),
            dtype,
            "masked_softmax (direct)",
        )
        assert_close(
            bias_act_scale(x, bias, "gelu", 0.7),
            bias_act_ref(x, bias, "gelu", 0.7),
            dtype,
            "bias_act_scale (direct)",
            atol=GELU_ATOL,  # as test_kernels_gpu at the same scale
        )
    # Eager training: the backward's formula runs the body directly (no grad mode inside it).
    xg = x.detach().requires_grad_()
    dy = torch.randn_like(x)
    y = softmax(xg)
    y.backward(dy)
    with torch.no_grad():
        assert direct_call(y, dy)
    assert_close(xg.grad, softmax_backward_ref(y.detach(), dy, 1.0), dtype, "backward (direct)")


def _kernel_body(x_ptr):  # a @triton.jit body; decorating needs no GPU
    pass


def test_direct_launches_hand_back_the_bare_kernel():
    pytest.importorskip("triton")
    from triton.runtime.jit import JITFunction

    from torchkiln.kernels._launch import direct_launches, launchable

    kernel = JITFunction(_kernel_body)
    assert launchable(kernel) is not kernel  # wrap_triton: a tracer sees the launch
    with direct_launches():
        assert launchable(kernel) is kernel
        with direct_launches():
            assert launchable(kernel) is kernel
        assert launchable(kernel) is kernel  # the inner exit restores, not clears
    assert launchable(kernel) is not kernel


def test_the_direct_path_launches_inside_direct_launches(monkeypatch):
    from torchkiln.kernels import _launch, functional, ops

    seen = []

    def record(*args):
        seen.append(getattr(_launch._state, "direct", False))
        return args[0]

    monkeypatch.setattr(functional, "direct_call", lambda *ts: True)
    for name in ("_softmax", "_masked_softmax", "_bias_act_scale"):
        monkeypatch.setattr(ops, name, record)
    x = torch.randn(4, 8)
    softmax(x)
    masked_softmax(x, None, 0.5)
    bias_act_scale(x, torch.randn(8), "relu", 1.0)
    assert seen == [True, True, True]
    assert not getattr(_launch._state, "direct", False)


def test_the_autograd_backward_runs_the_body_directly_where_it_may(monkeypatch):
    # Eager training: the backward formula calls the op's body (inside direct_launches) where
    # direct_call allows it, else the op. On the CPU direct_call is False, so it is forced here;
    # the bodies' CPU branches then compute the gradients, checked against autograd's own.
    from torchkiln.kernels import _launch, ops

    real = {n: getattr(ops, n) for n in ("_softmax_backward", "_bias_act_scale_backward")}
    seen = []

    def recording(name):
        def body(*args):
            seen.append((name, getattr(_launch._state, "direct", False)))
            return real[name](*args)

        return body

    for name in real:
        monkeypatch.setattr(ops, name, recording(name))
    x = torch.randn(4, 8, requires_grad=True)
    bias = torch.randn(8, requires_grad=True)
    dy = torch.randn(4, 8)

    def grads():
        for t in (x, bias):
            t.grad = None
        softmax(x).backward(dy)
        gx = x.grad.clone()
        x.grad = None
        bias_act_scale(x, bias, "gelu", 0.5).backward(dy)
        return gx, x.grad.clone(), bias.grad.clone()

    via_op = grads()
    assert seen == []  # CPU tensors: the op, whose CPU kernel is registered with it
    monkeypatch.setattr(ops, "direct_call", lambda *ts: True)
    direct = grads()
    assert seen == [("_softmax_backward", True), ("_bias_act_scale_backward", True)]
    for a, b in zip(via_op, direct, strict=True):
        torch.testing.assert_close(a, b)
    ref = torch.func.vjp(lambda t: torch.softmax(t, -1), x.detach())[1](dy)[0]
    torch.testing.assert_close(direct[0], ref)


class _OnDevice:
    """Stands in for a CUDA tensor: the device guard reads only `.device`."""

    def __init__(self, index: int) -> None:
        self.device = torch.device("cuda", index)


def test_the_device_guard_switches_only_to_another_gpu(monkeypatch):
    import contextlib

    from torchkiln.kernels import ops

    switched = []
    monkeypatch.setattr(ops, "_cuda_available", lambda: True)
    monkeypatch.setattr(ops, "_current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda i: switched.append(i) or "switch")
    assert isinstance(ops._on_device_of(_OnDevice(0)), contextlib.nullcontext)
    assert ops._on_device_of(_OnDevice(1)) == "switch" and switched == [1]
    # A CPU tensor, or fake CUDA tensors on a machine without CUDA: nothing to switch.
    assert isinstance(ops._on_device_of(torch.zeros(1)), contextlib.nullcontext)
    monkeypatch.setattr(ops, "_cuda_available", lambda: False)
    assert isinstance(ops._on_device_of(_OnDevice(1)), contextlib.nullcontext)
    assert switched == [1]


@pytest.mark.parametrize("a, b", [(1, 1), (4096, 2), (4097, 2), (7, 8), (8, 8), (9, 8)])
def test_cdiv_rounds_up(a, b):
    from torchkiln.kernels._launch import cdiv

    assert cdiv(a, b) == -(-a // b) and (cdiv(a, b) - 1) * b < a <= cdiv(a, b) * b
