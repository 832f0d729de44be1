"""The op layer and the public API on CPU tensors: numerics, gradients, masks, opcheck, errors.

CPU tensors take the ops' plain-PyTorch implementations (the kernels themselves are checked in
test_kernels_interpret.py and, on a GPU, test_kernels_gpu.py). Tolerances: kernels_reference.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernels_reference import (
    DTYPES,
    GELU_ATOL,
    MASK_KINDS,
    OPCHECK_CASES,
    SHAPES,
    assert_close,
    assert_grad_close,
    bias_act_backward_ref,
    bias_act_ref,
    dtype_id,
    make_mask,
    masked_softmax_ref,
    opcheck_case,
    softmax_ref,
    sum_atol,
)

from torchkiln.kernels import (
    BiasActScale,
    MaskedSoftmax,
    Softmax,
    bias_act_scale,
    masked_softmax,
    ops,
    softmax,
)

shape_id = lambda s: "x".join(map(str, s))  # noqa: E731


def _randn(shape, dtype, seed=0, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * 3).to(dtype).requires_grad_(requires_grad)


# ---- numerics and gradients against the fp64 references ----------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_softmax_forward_and_gradient(shape, dtype):
    x = _randn(shape, dtype, requires_grad=True)
    y = softmax(x)
    assert y.dtype == dtype and y.shape == x.shape
    assert_close(y, softmax_ref(x.detach()), dtype, "softmax")
    dy = _randn(shape, dtype, seed=1)
    (dx,) = torch.autograd.grad(y, x, dy)
    xr = x.detach().double().requires_grad_()
    (dx_ref,) = torch.autograd.grad(torch.softmax(xr, -1), xr, dy.double())
    assert_grad_close(dx, dx_ref, softmax_ref(x.detach()), dy.double(), dtype, "softmax dx")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("kind", MASK_KINDS)
def test_masked_softmax_forward_and_gradient(kind, dtype):
    shape = (3, 5, 7, 129)
    mask = make_mask(kind, shape, torch.Generator().manual_seed(7))
    scores = _randn(shape, dtype, requires_grad=True)
    y = masked_softmax(scores, mask, 0.125)
    ref = masked_softmax_ref(scores.detach(), mask, 0.125)
    assert not torch.isnan(y).any()
    assert_close(y, ref, dtype, f"masked_softmax {kind}")
    dy = _randn(shape, dtype, seed=1)
    (ds,) = torch.autograd.grad(y, scores, dy)
    sr = scores.detach().double().requires_grad_()
    (ds_ref,) = torch.autograd.grad(masked_softmax_ref(sr, mask, 0.125), sr, dy.double())
    assert not torch.isnan(ds).any()
    assert_grad_close(ds, ds_ref, ref, 0.125 * dy.double(), dtype, f"masked_softmax {kind} grad")


@pytest.mark.parametrize("act", ["relu", "gelu"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_bias_act_scale_forward_and_gradients(shape, dtype, act):
    x = _randn(shape, dtype, requires_grad=True)
    bias = _randn(shape[-1:], dtype, seed=2, requires_grad=True)
    y = bias_act_scale(x, bias, act, 0.7)
    gelu_atol = GELU_ATOL if act == "gelu" else 0.0
    ref = bias_act_ref(x.detach(), bias.detach(), act, 0.7)
    assert_close(y, ref, dtype, act, atol=gelu_atol)
    dy = _randn(shape, dtype, seed=3)
    dx, db = torch.autograd.grad(y, (x, bias), dy)
    dx_ref, db_ref = bias_act_backward_ref(x.detach(), bias.detach(), dy, act, 0.7)
    dz_atol = gelu_atol * 0.7 * dy.abs().max().item()
    assert_close(dx, dx_ref, dtype, f"{act} dx", atol=dz_atol)
    rows = x.numel() // shape[-1]
    db_atol = sum_atol(dx_ref, rows) + rows * dz_atol
    assert_close(db, db_ref, dtype, f"{act} dbias", atol=db_atol)


# ---- masks ----------------------------------------------------------------------------------


def test_fully_masked_rows_give_zeros_and_zero_gradient():
    scores = torch.randn(2, 4, 3, 10, requires_grad=True)
    mask = torch.ones(2, 1, 1, 10, dtype=torch.bool)
    mask[1] = False  # batch 1 may attend to nothing
    y = masked_softmax(scores, mask)
    assert torch.equal(y[1], torch.zeros(4, 3, 10))
    torch.testing.assert_close(y[0].sum(-1), torch.ones(4, 3))
    y.pow(2).sum().backward()
    assert torch.equal(scores.grad[1], torch.zeros(4, 3, 10))
    assert not torch.isnan(scores.grad).any()


def test_bool_and_additive_masks_agree():
    scores = torch.randn(2, 3, 4, 9)
    keep = torch.rand(2, 1, 4, 9) > 0.4
    additive = torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    torch.testing.assert_close(
        masked_softmax(scores, keep, 0.5), masked_softmax(scores, additive, 0.5)
    )


@pytest.mark.parametrize(
    ("scores_shape", "mask_shape"),
    [((5, 9), (9,)), ((2, 5, 9), (5, 1)), ((2, 3, 5, 9), (2, 1, 1, 9)), ((2, 3, 5, 9), (5, 9))],
)
def test_lower_dim_scores_and_masks_broadcast(scores_shape, mask_shape):
    scores = torch.randn(scores_shape)
    mask = torch.rand(mask_shape) > 0.3
    y = masked_softmax(scores, mask, 2.0)
    assert y.shape == scores.shape
    assert_close(y, masked_softmax_ref(scores, mask, 2.0), torch.float32, "broadcast mask")


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 3), h=st.integers(1, 3), q=st.integers(1, 5), k=st.integers(1, 40),
    p=st.floats(0.0, 1.0), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_masked_softmax_rows_sum_to_one_or_are_all_zero(b, h, q, k, p, seed):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, h, q, k, generator=gen)
    mask = torch.rand(b, 1, q, k, generator=gen) < p
    sums = masked_softmax(scores, mask).sum(-1)
    live = mask.any(-1).expand(b, h, q)
    torch.testing.assert_close(sums[live], torch.ones(int(live.sum())))
    assert torch.equal(sums[~live], torch.zeros(int((~live).sum())))


# ---- the op layer -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", OPCHECK_CASES)
def test_opcheck(name):
    op, args = opcheck_case(name, "cpu")
    results = torch.library.opcheck(op, args)
    assert set(results.values()) == {"SUCCESS"}, results


def test_ops_are_registered_under_kiln_namespace():
    for name in ("softmax", "softmax_backward", "masked_softmax", "bias_act_scale"):
        assert hasattr(torch.ops.kiln, name), name


def test_cuda_path_traces_with_fake_cuda_tensors():
    """The CUDA branch of every op (launcher, grid, block sizes, wrap_triton) runs on fake CUDA
    tensors without a GPU: shapes and dtypes come out right, including the looped softmax."""
    pytest.importorskip("triton")
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(37, 781, device="cuda", dtype=torch.bfloat16)
        b = torch.empty(781, device="cuda", dtype=torch.bfloat16)
        long_rows = torch.empty(2, 3, 4, 40000, device="cuda")  # past the single-block limit
        mask = torch.empty(2, 1, 1, 40000, device="cuda", dtype=torch.bool)
        outs = [
            ops.softmax(x),
            ops.masked_softmax(long_rows, mask, 0.125),
            ops.bias_act_scale(x, b, "gelu", 0.5),
            ops.softmax_backward(long_rows, long_rows, 2.0),
            *ops.bias_act_scale_backward(x, b, x, "relu", 2.0),
        ]
    expected = [x, long_rows, x, long_rows, x, b]
    for out, ref in zip(outs, expected, strict=True):
        assert (out.shape, out.dtype, out.device.type) == (ref.shape, ref.dtype, "cuda")


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compiles_on_cpu_without_graph_breaks(dynamic):
    # dynamic=True makes float attributes (the scales) symbolic: validation must still trace.
    model = torch.nn.Sequential(BiasActScale(16, "gelu", 0.5), Softmax())
    scores = torch.randn(2, 3, 4, 16)
    mask = torch.rand(2, 1, 4, 16) > 0.2
    attend = MaskedSoftmax(0.25)

    def fn(s, m):
        return attend(model(s), m)

    # aot_eager traces dynamo and AOT autograd (the ops' CPU branch) without compiling C++.
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True, dynamic=dynamic)
    torch.testing.assert_close(compiled(scores, mask), fn(scores, mask))


# ---- modules ------------------------------------------------------------------------------


def test_modules_match_functional_and_learn_bias():
    x = torch.randn(4, 6, 10)
    layer = BiasActScale(10, "relu", 2.0)
    with torch.no_grad():
        layer.bias.copy_(torch.linspace(-1, 1, 10))
    torch.testing.assert_close(layer(x), bias_act_scale(x, layer.bias.detach(), "relu", 2.0))
    layer(x).sum().backward()
    assert layer.bias.grad is not None and layer.bias.grad.abs().sum() > 0
    torch.testing.assert_close(Softmax()(x), softmax(x))
    mask = torch.rand(6, 10) > 0.5
    torch.testing.assert_close(MaskedSoftmax(0.5)(x, mask), masked_softmax(x, mask, 0.5))
    assert "act='relu'" in repr(layer)


# ---- errors name the argument -------------------------------------------------------------

_x = torch.randn(4, 8)
_s = torch.randn(2, 3, 4, 8)


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: softmax(_x.to(torch.int32)), TypeError, ["x.dtype", "int32", "bfloat16"]),
        (lambda: softmax(_x.t()), ValueError, ["x must be contiguous", ".contiguous()"]),
        (lambda: softmax(_x, dim=0), ValueError, ["dim=0", "last dimension"]),
        (lambda: softmax(torch.tensor(1.0)), ValueError, ["x must have at least 1 dimension"]),
        (lambda: softmax([1.0]), TypeError, ["x must be a torch.Tensor", "list"]),
        (lambda: masked_softmax(torch.randn(2, 2, 2, 2, 8)), ValueError,
         ["scores must have 1 to 4 dimensions"]),
        (lambda: masked_softmax(_s, torch.ones(3, 8)), ValueError, ["mask of shape (3, 8)"]),
        (lambda: masked_softmax(_s, torch.ones(5, 2, 3, 4, 8)), ValueError, ["mask of shape"]),
        (lambda: masked_softmax(_s, torch.ones(8, dtype=torch.int64)), TypeError,
         ["mask.dtype", "int64", "bool"]),
        (lambda: masked_softmax(_s, torch.zeros(8, requires_grad=True)), ValueError,
         ["mask requires grad", "mask.detach()"]),
        (lambda: masked_softmax(_s, None, float("nan")), ValueError, ["scale must be finite"]),
        (lambda: masked_softmax(_s, None, torch.tensor(2.0)), TypeError, ["scale", "Tensor"]),
        (lambda: bias_act_scale(_x, torch.randn(7)), ValueError, ["bias has shape (7,)", "(8,)"]),
        (lambda: bias_act_scale(_x, torch.randn(8).half()), TypeError,
         ["bias.dtype is float16", "x.dtype is float32"]),
        (lambda: bias_act_scale(_x, torch.randn(2, 8)), ValueError,
         ["bias must have exactly 1 dimension"]),
        (lambda: bias_act_scale(_x, torch.randn(8), act="tanh"), ValueError,
         ["act='tanh'", "'gelu'", "'relu'"]),
        (lambda: bias_act_scale(_x, torch.randn(8).to("meta")), ValueError,
         ["bias is on meta", "x is on cpu"]),
        (lambda: BiasActScale(8, "swish"), ValueError, ["act='swish'"]),
        (lambda: BiasActScale(0), ValueError, ["features must be a positive int"]),
    ],
)  # fmt: skip
def test_errors_name_the_argument(call, error, words):
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
