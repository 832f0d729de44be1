"""On a CUDA GPU: the compiled kernels through every layer, and torch.compile with no graph break.

    PYTHONPATH=src python3 -m pytest -q tests/kernels -m gpu

Same references and tolerances as on CPU (kernels_reference), plus row lengths that take the
looped online-softmax kernels (> 32768) and the widest single block (32768).
"""

from __future__ import annotations

import argparse

import pytest
import torch
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
    softmax_backward_ref,
    softmax_ref,
    sum_atol,
)
from torch import nn

from torchkiln.kernels import (
    BiasActScale,
    MaskedSoftmax,
    Softmax,
    bias_act_scale,
    masked_softmax,
    ops,
    softmax,
)

pytestmark = pytest.mark.gpu
GPU_SHAPES = [*SHAPES, (3, 12672), (5, 32768), (3, 40000)]  # 12672: the pieces kernel (bf16)
shape_id = lambda s: "x".join(map(str, s))  # noqa: E731


def _randn(shape, dtype, seed=0, requires_grad=False):
    # Drawn on the CPU, so every machine tests the same numbers.
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen) * 3).to(dtype).cuda()
    return x.requires_grad_(requires_grad)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=shape_id)
def test_softmax_gpu(shape, dtype):
    x = _randn(shape, dtype, requires_grad=True)
    y = softmax(x)
    y_ref = softmax_ref(x.detach())
    assert_close(y, y_ref, dtype, "softmax")
    dy = _randn(shape, dtype, seed=1)
    (dx,) = torch.autograd.grad(y, x, dy)
    xr = x.detach().double().requires_grad_()
    (dx_ref,) = torch.autograd.grad(torch.softmax(xr, -1), xr, dy.double())
    assert_grad_close(dx, dx_ref, y_ref, dy.double(), dtype, "softmax dx")
    # The backward op alone, from the same rounded y: one rounding, the plain tolerance.
    dx_op = ops.softmax_backward(y.detach(), dy, 0.5)
    assert_close(dx_op, softmax_backward_ref(y.detach(), dy, 0.5), dtype, "softmax_backward")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize(
    "shape",
    [
        (3, 5, 7, 129),
        (2, 2, 3, 10240),
        (2, 2, 3, 12672),
        (2, 2, 3, 16384),
        (2, 2, 3, 32768),
        (2, 2, 3, 40000),
    ],
    ids=shape_id,
)
def test_masked_softmax_gpu(shape, kind, dtype):
    # fp32 rows of 12672-32768 with a mask shared by the heads (bool_per_query,
    # additive_causal) take the block heads innermost (heads_inner_order), and so do 2-byte
    # rows of 16384 with a shared bool mask (MASK_VEC), and of 32768 in the persistent rows
    # kernel (ROWS_HEADS_2BYTE); the others the default order, or at 32768 the persistent rows
    # kernel (fp32) or the block with MASK_VEC (2-byte, bool).
    mask = make_mask(kind, shape, torch.Generator().manual_seed(7))
    mask = None if mask is None else mask.cuda()
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
@pytest.mark.parametrize("shape", [*SHAPES, (4096, 1000)], ids=shape_id)
def test_bias_act_scale_gpu(shape, dtype, act):
    # 4096 rows: each backward program loops over several row blocks before its bias sums.
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


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_looped_kernels_with_short_rows_gpu(dtype):
    from torchkiln.kernels import _softmax

    x, dy = _randn((37, 781), dtype), _randn((37, 781), dtype, seed=1)
    y = _softmax.softmax_forward(x, max_block_n=128)
    assert_close(y, softmax_ref(x), dtype, "looped forward")
    # Five programs taking the 37 rows in turn (the grid-stride form kernel_configs.py times).
    y5 = _softmax.softmax_forward(x, max_block_n=128, loop_programs=5)
    assert_close(y5, softmax_ref(x), dtype, "looped forward, 5 programs")
    # The cache hints (the default for fp32 rows of 16385-32768) on the real hardware's loads.
    yh = _softmax.softmax_forward(x, max_block_n=128, loop_l2_hints=True)
    assert_close(yh, softmax_ref(x), dtype, "looped forward, L2 hints")
    # Per-chunk statistics under a 32-register cap (the experiment kernel_configs.py times;
    # this also checks the installed Triton takes `maxnreg` at launch).
    yc = _softmax.softmax_forward(
        x, max_block_n=128, loop_chunk_stats=True, loop_maxnreg=32, loop_warps=32
    )
    assert_close(yc, softmax_ref(x), dtype, "looped forward, chunk statistics, 32 registers")
    dx = _softmax.softmax_backward(y, dy, 2.0, max_block_n=128)
    assert_close(dx, softmax_backward_ref(y, dy, 2.0), dtype, "looped backward")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fast_gelu_matches_reference(dtype):
    # GELU_POLY_FAST (the 2-byte default on NVIDIA GPUs: approximate rcp and exp2) against the
    # fp64 reference, as the other kernels are held (kernels_reference's tolerances), forward
    # and backward; act_code picks it for CUDA tensors only.
    from torchkiln.kernels import _bias_act

    x, bias = _randn((37, 781), dtype), _randn((781,), dtype, seed=3)
    dy = _randn((37, 781), dtype, seed=4)
    code = _bias_act.GELU_POLY_FAST
    expected = code if torch.version.hip is None else _bias_act.GELU_POLY
    assert _bias_act.act_code("gelu", x) == expected
    y = _bias_act.bias_act_forward(x, bias, "gelu", 0.7, code=code)
    assert_close(y, bias_act_ref(x, bias, "gelu", 0.7), dtype, "fast gelu", GELU_ATOL * 0.7)
    dx, db = _bias_act.bias_act_backward(x, bias, dy, "gelu", 0.7, code=code)
    dx_ref, db_ref = bias_act_backward_ref(x, bias, dy, "gelu", 0.7)
    dz_atol = GELU_ATOL * 0.7 * dy.abs().max().item()
    assert_close(dx, dx_ref, dtype, "fast gelu dx", dz_atol)
    assert_close(db, db_ref, dtype, "fast gelu dbias", sum_atol(dx_ref, 37) + 37 * dz_atol)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_bias_act_backward_launch_choices_gpu(dtype):
    # The backward's launch choices on the hardware, two programs looping over the 37 rows: the
    # default (the next block's loads issued ahead, under a 64-register cap), the plain loop, and
    # 16 warps (kernel_configs.py's arms).
    from torchkiln.kernels import _bias_act

    x, bias = _randn((37, 781), dtype), _randn((781,), dtype, seed=3)
    dy = _randn((37, 781), dtype, seed=4)
    dx_ref, db_ref = bias_act_backward_ref(x, bias, dy, "gelu", 0.7)
    dz_atol = GELU_ATOL * 0.7 * dy.abs().max().item()
    for kw in ({}, {"prefetch": False, "maxnreg": None}, {"tile": (2, 1024, 16)}):
        dx, db = _bias_act.bias_act_backward(x, bias, dy, "gelu", 0.7, target_programs=2, **kw)
        assert_close(dx, dx_ref, dtype, f"dx {kw}", dz_atol)
        assert_close(db, db_ref, dtype, f"dbias {kw}", sum_atol(dx_ref, 37) + 37 * dz_atol)


@pytest.mark.parametrize("name", OPCHECK_CASES)
def test_opcheck_gpu(name):
    op, args = opcheck_case(name, "cuda")
    results = torch.library.opcheck(op, args)
    assert set(results.values()) == {"SUCCESS"}, results


class TinyAttentionBlock(nn.Module):
    """Uses all three kiln ops, one of each through its nn.Module."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.attend = MaskedSoftmax(scale=(dim // heads) ** -0.5)
        self.up = nn.Linear(dim, 4 * dim, bias=False)
        self.act = BiasActScale(4 * dim, "gelu", 0.5)
        self.out = Softmax()

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q = self.q(x).view(b, t, self.heads, -1).transpose(1, 2)
        k = self.k(x).view(b, t, self.heads, -1).transpose(1, 2)
        p = self.attend(q @ k.transpose(-1, -2), mask)  # [b, heads, t, t], fresh and contiguous
        h = (p @ x.unsqueeze(1)).mean(1)
        return self.out(self.act(self.up(h)))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_another_gpu_than_the_current_one():
    # Triton launches on the current device; the ops switch to the tensors' own.
    x = _randn((37, 781), torch.float32).to("cuda:1").requires_grad_()
    bias = torch.randn(781, device="cuda:1")
    with torch.cuda.device(0):
        y = softmax(bias_act_scale(x, bias, "gelu", 0.5))
        y.sum().backward()
    ref = torch.softmax(torch.nn.functional.gelu(x.detach() + bias) * 0.5, -1)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    assert x.grad is not None and x.grad.device == x.device


def _normalised_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_compile_fullgraph_no_graph_breaks_and_kernels_inlined(dtype, dynamic):
    import torch._functorch.config
    import torch._inductor.config
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    model = TinyAttentionBlock().cuda().to(dtype)
    with torch.no_grad():
        model.act.bias.normal_()
    compiled_model = TinyAttentionBlock().cuda().to(dtype)
    compiled_model.load_state_dict(model.state_dict())
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(compiled_model, fullgraph=True, dynamic=dynamic)
    # Compiled and eager run the same kiln kernels; what differs is Inductor's fusion of the
    # rest, which in bf16 rounds intermediates differently (a few bf16 ulps through the
    # backward). Errors are normalised by each tensor's largest magnitude.
    tol = 1e-4 if dtype == torch.float32 else 3e-2

    for batch, t in [(2, 37), (3, 37)]:  # a second batch size exercises the dynamic graph
        x = _randn((batch, t, 64), dtype, seed=batch)
        mask = (torch.rand(batch, 1, t, t, generator=torch.Generator().manual_seed(1)) > 0.2).cuda()
        mask[:, :, 0] = False  # fully masked query rows must give zeros here too

        def step(m=compiled, x=x, mask=mask):
            out = m(x, mask)
            out.float().pow(2).sum().backward()
            return out

        # Caches off, so Inductor really generates (and shows) the code in this process.
        with (
            torch._inductor.config.patch(fx_graph_cache=False),
            torch._functorch.config.patch(enable_autograd_cache=False),
        ):
            out, code = run_and_get_code(step)
        ref = step(model)
        assert _normalised_error(out, ref) <= tol
        # Gradients normalised by the largest of all of them: k.bias's is exactly zero in theory
        # (softmax ignores a per-row constant), so on its own it is rounding noise.
        grad_scale = max(p.grad.abs().max().item() for p in model.parameters())
        for (name, p), p_ref in zip(
            compiled_model.named_parameters(), model.parameters(), strict=True
        ):
            err = (p.grad.float() - p_ref.grad.float()).abs().max().item() / grad_scale
            assert err <= tol, f"{name}: {err:.2g}"
            p.grad, p_ref.grad = None, None
        if batch == 2:
            # Inductor emitted kiln's own kernels (the triton_op was traced through, not called
            # as an opaque op), forward and backward.
            source = "\n".join(code)
            for kernel in ("_softmax_fwd_block", "_softmax_bwd_block", "_bias_act_fwd",
                           "_bias_act_bwd"):  # fmt: skip
                assert kernel in source, f"{kernel} not in Inductor's output code"
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_kernels_bench_cli_gpu(capsys):
    from torchkiln.kernels import bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--kernel", "softmax", "--dtype", "fp32", "--direction", "fwd",
                              "--cols", "1024", "--no-compile", "--rep-ms", "5"])  # fmt: skip
    assert bench.run(args) == 0
    table = capsys.readouterr().out
    assert "softmax" in table and "4096x1024" in table
