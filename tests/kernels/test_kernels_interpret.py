"""The Triton kernels' numerics on CPU through Triton's interpreter (TRITON_INTERPRET=1).

The launchers are called directly, in a worker process (the `interpreted` fixture): the ops send
CPU tensors to their plain-PyTorch implementation, so this is where the kernels themselves are
checked without a GPU. Sizes stay small because the interpreter runs every program in numpy.
"""

from __future__ import annotations

import kernels_reference
import pytest
import torch
from kernels_reference import (
    DTYPES,
    GELU_ATOL,
    MASK_KINDS,
    SHAPES,
    bias_act_backward_ref,
    bias_act_ref,
    dtype_id,
    make_mask,
    masked_softmax_ref,
    softmax_backward_ref,
    softmax_ref,
    sum_atol,
)


def assert_close(got, ref, dtype, what, atol=0.0):
    # The interpreter truncates fp32 -> bf16 (see kernels_reference): one full bf16 ulp allowed.
    kernels_reference.assert_close(got, ref, dtype, what, interpreter=True, atol=atol)


# Row-length cap that sends 781- and 129-long rows through the looped online-softmax kernels in
# chunks of 128, with a partial last chunk.
LOOPED = 128
# The persistent rows kernel at any row length: on the CPU its grid is two programs a "SM" over
# two, so every program takes several rows in turn (_launch.device_info), pipelined in 2 stages.
ROWS = {"rows_config": (4, 1, 2)}
# The single-block forward taking one row a program, heads innermost (experimental: HEADS_INNER).
HEADS = {"heads_inner": True}


def _randn(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * 3).to(dtype)


@pytest.mark.parametrize("path", ["block", "looped", "rows"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_softmax_kernels_match_reference(interpreted, shape, dtype, path):
    cap = {"block": {}, "looped": {"max_block_n": LOOPED}, "rows": ROWS}[path]
    x = _randn(shape, dtype)
    y = interpreted("_softmax", "softmax_forward", x, **cap)
    assert y.dtype == dtype
    assert_close(y, softmax_ref(x), dtype, f"softmax forward ({path})")
    if path == "rows":
        return  # a forward kernel only; the backward's block and loop are covered above
    dy = _randn(shape, dtype, seed=1)
    dx = interpreted("_softmax", "softmax_backward", y, dy, 0.5, **cap)
    assert_close(dx, softmax_backward_ref(y, dy, 0.5), dtype, "softmax backward")


@pytest.mark.parametrize("programs", [1, 3])
def test_looped_forward_with_fewer_programs_than_rows_covers_every_row(interpreted, programs):
    # Each program takes rows pid, pid + grid, ...: 7 rows over 1 or 3 programs, masked too.
    x = _randn((1, 1, 7, 50), torch.float32)
    y = interpreted("_softmax", "softmax_forward", x, max_block_n=16, loop_programs=programs)
    assert_close(y, softmax_ref(x), torch.float32, f"looped forward, {programs} programs")
    mask = torch.ones(1, 1, 7, 50, dtype=torch.bool)
    mask[0, 0, 4] = False  # a fully masked row, handled by a program's second or later turn
    mask[0, 0, 2, 10:] = False
    y = interpreted("_softmax", "softmax_forward", x, mask, 0.5, safe=True, max_block_n=16,
                    loop_programs=programs)  # fmt: skip
    assert_close(y, masked_softmax_ref(x, mask, 0.5), torch.float32, "looped masked forward")
    assert torch.equal(y[0, 0, 4], torch.zeros(50))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_long_rows_take_their_kernels_and_compute_softmax(interpreted, dtype):
    # Rows over 16384 columns without a mask take LONG_ROW_LOOP's 16384- or 8192-long chunks,
    # the last one partial, except bf16 rows of up to 32768, which take the persistent rows
    # kernel (ROWS_LOOP); bf16 rows of 10000 take the pieces kernel (two of 4096 and a 2048
    # tail: pieces_config), fp32 ones the block;
    # masked rows of 20000 with one head take the rows kernel at both dtypes. Checked against
    # torch as every other path.
    for cols in (10000, 20000, 40000):
        x = _randn((1, 1, 3, cols), dtype)
        y = interpreted("_softmax", "softmax_forward", x)
        assert_close(y, softmax_ref(x), dtype, f"{cols} columns")
    mask = torch.ones(1, 1, 3, 20000, dtype=torch.bool)
    mask[0, 0, 1] = False
    mask[0, 0, 2, 7:] = False
    y = interpreted("_softmax", "softmax_forward", x[..., :20000].contiguous(), mask, 0.5, True)
    assert_close(y, masked_softmax_ref(x[..., :20000], mask, 0.5), dtype, "masked, 20000")
    assert torch.equal(y[0, 0, 1], torch.zeros(20000, dtype=dtype))
    # Two heads sharing a mask by query: fp32 rows of 8192 take the block heads innermost
    # (heads_inner_order), bf16 the default order.
    x = _randn((1, 2, 3, 8192), dtype, seed=1)
    mask = mask[..., :8192].contiguous()
    y = interpreted("_softmax", "softmax_forward", x, mask, 0.5, True)
    assert_close(y, masked_softmax_ref(x, mask, 0.5), dtype, "masked, 2 heads, 8192")
    assert torch.equal(y[0, :, 1], torch.zeros(2, 8192, dtype=dtype))
    # At 16384 both dtypes go heads innermost, unpredicated; bf16 with its mask at x's width.
    x = _randn((1, 2, 3, 16384), dtype, seed=2)
    mask = torch.ones(1, 1, 3, 16384, dtype=torch.bool)
    mask[0, 0, 1] = False
    mask[0, 0, 2, 7:] = False
    y = interpreted("_softmax", "softmax_forward", x, mask, 0.5, True)
    assert_close(y, masked_softmax_ref(x, mask, 0.5), dtype, "masked, 2 heads, 16384")
    assert torch.equal(y[0, :, 1], torch.zeros(2, 16384, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_unpredicated_block_and_mask_width_compute_the_same_softmax(interpreted, dtype):
    # Rows of 4096 fill their block: EVEN drops the predicates and MASK_VEC loads the mask at
    # x's width, each on and off, with a mask shared by the heads (a fully masked row, a row
    # masked past its 7th column), an additive causal one, and none.
    x = _randn((2, 2, 3, 4096), dtype, seed=4)
    shared = torch.ones(2, 1, 3, 4096, dtype=torch.bool)
    shared[1, 0, 1] = False
    shared[0, 0, 2, 7:] = False
    causal = torch.zeros(3, 4096).masked_fill(torch.ones(3, 4096).triu(1) > 0, float("-inf"))
    for mask in (shared, causal.to(dtype), None):
        ref = masked_softmax_ref(x, mask, 0.5)
        for even, vec in ((True, True), (True, False), (False, True)):
            y = interpreted("_softmax", "softmax_forward", x, mask, 0.5, mask is not None,
                            even=even, mask_vec=vec)  # fmt: skip
            what = f"{'no' if mask is None else mask.dtype} mask, even={even}, vec={vec}"
            assert_close(y, ref, dtype, what)
            if mask is shared:
                assert torch.equal(y[1, :, 1], torch.zeros(2, 4096, dtype=dtype)), what


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_rows_held_as_pieces_compute_the_same_softmax(interpreted, dtype):
    # _softmax_fwd_pieces with short pieces: rows of 300 as two pieces of 128 and a 64-element
    # tail, of 256 with an empty tail, of 100 as one piece of 64 and a tail of 64; heads
    # innermost or not, the mask at x's width or not; a bool mask the heads share (a fully
    # masked row, a row masked past its 7th column), an additive causal one, none; both signs
    # of the scale (POS_SCALE on and off).
    for cols, piece, count, tail in ((300, 128, 2, 64), (256, 128, 2, 1), (100, 64, 1, 64)):
        x = _randn((2, 2, 3, cols), dtype, seed=6)
        shared = torch.ones(2, 1, 3, cols, dtype=torch.bool)
        shared[1, 0, 1] = False
        shared[0, 0, 2, 7:] = False
        causal = torch.zeros(3, cols).masked_fill(torch.ones(3, cols).triu(1) > 0, float("-inf"))
        for mask in (shared, causal.to(dtype), None):
            for scale in (0.5, -0.5):
                ref = masked_softmax_ref(x, mask, scale)
                for inner, vec in ((False, False), (True, False), (True, True)):
                    config = (piece, count, tail, 4, inner, vec)
                    y = interpreted("_softmax", "softmax_forward", x, mask, scale,
                                    mask is not None, pieces=config)  # fmt: skip
                    what = f"{cols}, {'no' if mask is None else mask.dtype} mask, {scale}, {config}"
                    assert_close(y, ref, dtype, what)
                    if mask is shared:
                        assert torch.equal(y[1, :, 1], torch.zeros(2, cols, dtype=dtype)), what


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_rows_kernel_heads_innermost_computes_the_same_softmax(interpreted, dtype):
    # The persistent rows kernel taking its rows heads innermost (HEADS_INNER), two programs
    # over 2 batches x 3 heads x 5 queries (each takes 15 rows in turn, so the order is
    # exercised past a program's first row), with a bool mask the heads share that differs by
    # batch and query (a fully masked row, a row masked past its 7th column), its mask at x's
    # width or not, the block filled (EVEN) or not.
    for cols in (128, 100):
        x = _randn((2, 3, 5, cols), dtype, seed=9)
        shared = torch.rand(2, 1, 5, cols, generator=torch.Generator().manual_seed(3)) < 0.8
        shared[1, 0, 1] = False
        shared[0, 0, 2, 7:] = False
        ref = masked_softmax_ref(x, shared, 0.5)
        for vec, even in ((False, False), (True, False), (True, True)):
            y = interpreted("_softmax", "softmax_forward", x, shared, 0.5, True, heads_inner=True,
                            mask_vec=vec, even=even, **ROWS)  # fmt: skip
            what = f"{cols} columns, vec={vec}, even={even}"
            assert_close(y, ref, dtype, what)
            assert torch.equal(y[1, :, 1], torch.zeros(3, cols, dtype=dtype)), what


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_rows_kernel_reading_its_mask_as_words_computes_the_same_softmax(interpreted, dtype):
    # _softmax_fwd_rows_words (the mask's 8 bytes a group of 8 columns read as one 64-bit word),
    # two programs over 2 batches x 3 heads x 5 queries of 64 columns: heads innermost with a
    # mask the heads share (differing by batch and query), and in the default order with a
    # mask per head; a fully masked row, a row masked past its 7th column, both signs of the
    # scale.
    x = _randn((2, 3, 5, 64), dtype, seed=11)
    gen = torch.Generator().manual_seed(5)
    for mask_shape, inner in (((2, 1, 5, 64), True), ((2, 3, 5, 64), False)):
        mask = torch.rand(mask_shape, generator=gen) < 0.7
        mask[1, 0, 1] = False
        mask[0, 0, 2, 7:] = False
        for scale in (0.5, -0.5):
            y = interpreted("_softmax", "softmax_forward", x, mask, scale, True, heads_inner=inner,
                            mask_words=True, **ROWS)  # fmt: skip
            what = f"mask {mask_shape}, scale {scale}"
            assert_close(y, masked_softmax_ref(x, mask, scale), dtype, what)
            assert torch.equal(y[1, 0, 1], torch.zeros(64, dtype=dtype)), what


@pytest.mark.parametrize(
    "kw",
    [{"loop_l2_hints": True}, {"loop_chunk_stats": True, "loop_maxnreg": 32}],
    ids=["hints", "chunk-stats"],
)
def test_looped_forward_variants_compute_the_same_softmax(interpreted, kw):
    # The cache hints change how memory traffic is cached only; the per-chunk statistics how the
    # running max and sum are kept. A partial last chunk (50 = 3 x 16 + 2), a mask, a fully
    # masked row, and a row whose first chunk is fully masked (its max starts at -inf).
    x = _randn((1, 2, 3, 50), torch.float32)
    mask = torch.ones(1, 1, 3, 50, dtype=torch.bool)
    mask[0, 0, 1] = False
    mask[0, 0, 2, :20] = False
    kw = {"max_block_n": 16, **kw}
    y = interpreted("_softmax", "softmax_forward", x, **kw)
    assert_close(y, softmax_ref(x), torch.float32, f"looped forward, {kw}")
    y = interpreted("_softmax", "softmax_forward", x, mask, 0.5, safe=True, **kw)
    assert_close(y, masked_softmax_ref(x, mask, 0.5), torch.float32, f"masked, {kw}")
    assert torch.equal(y[0, :, 1], torch.zeros(2, 50))
    # Growing maxima: every chunk's max above the last, so the sum is rescaled each time.
    ramp = torch.linspace(-30.0, 30.0, 50).reshape(1, 50)
    assert_close(interpreted("_softmax", "softmax_forward", ramp, **kw), softmax_ref(ramp),
                 torch.float32, f"ramp, {kw}")  # fmt: skip


def test_softmax_kernel_row_of_neg_inf_is_nan_like_torch(interpreted):
    x = torch.zeros(3, 40)
    x[1] = float("-inf")
    for cap in ({}, {"max_block_n": 16}, {"max_block_n": 16, "loop_chunk_stats": True}, ROWS):
        y = interpreted("_softmax", "softmax_forward", x, **cap)
        assert torch.isnan(y[1]).all()
        torch.testing.assert_close(y[[0, 2]], torch.full((2, 40), 1 / 40))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("kind", MASK_KINDS)
def test_masked_softmax_kernel_matches_reference(interpreted, kind, dtype):
    shape = (3, 5, 7, 129)
    gen = torch.Generator().manual_seed(2)
    scores = _randn(shape, dtype)
    mask = make_mask(kind, shape, gen)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(dtype)
    m4 = None if mask is None else mask.reshape((1,) * (4 - mask.dim()) + mask.shape).expand(shape)
    ref = masked_softmax_ref(scores, mask, 0.125)
    # The op passes the mask as given (the launcher addresses it through broadcast strides);
    # an expanded view, as benchmarks pass, must read the same.
    # heads_inner: the experimental order (one row a program, heads innermost; HEADS_INNER).
    cases = (({}, mask), ({"max_block_n": 64}, mask), ({}, m4), (ROWS, mask), (HEADS, mask))
    for cap, m in cases:
        y = interpreted("_softmax", "softmax_forward", scores, m, 0.125, safe=True, **cap)
        assert not torch.isnan(y).any(), "a fully masked row gave NaN"
        assert_close(y, ref, dtype, f"masked softmax ({kind}, {cap or 'single block'})")


# Masks the kinds above leave out, by what the mask's address needs (_softmax.mask_dims): a
# mask per head shared over several batches (the batch index made only to take the head apart),
# per batch and head but not query, per head and query in one batch (no batch division), a full
# mask whose strides are not a contiguous row index (every division), and a full contiguous one
# (the row times the stride).
def _mask_cases():
    b, h, q, k = 3, 5, 7, 129
    full_t = (torch.rand(b, q, h, k, generator=torch.Generator().manual_seed(3)) > 0.3).transpose(
        1, 2
    )
    return [
        ("per head, 3 batches", (b, h, q, k), (1, h, q, k), None, 7),
        ("per batch and head", (b, h, q, k), (b, h, 1, k), None, 3),
        ("per head and query, one batch", (1, h, q, k), (1, h, q, k), full_t[:1], 6),
        ("full, strided", (b, h, q, k), None, full_t, 7),
        ("full, contiguous", (b, h, q, k), (b, h, q, k), None, 8),
    ]


@pytest.mark.parametrize("case", _mask_cases(), ids=lambda c: c[0])
def test_masked_forward_addresses_every_mask_layout(interpreted, case):
    from torchkiln.kernels import _softmax

    what, shape, mask_shape, given, dims = case
    gen = torch.Generator().manual_seed(4)
    scores = _randn(shape, torch.float32, seed=5)
    mask = given if given is not None else torch.rand(mask_shape, generator=gen) > 0.3
    h, q, strides = _softmax.mask_layout(shape, mask)
    m = scores.numel() // shape[-1]
    assert _softmax.mask_dims(_softmax.MASK_BOOL, m, h, q, *strides[:3]) == dims, what
    ref = masked_softmax_ref(scores, mask, 0.125)
    for cap in ({}, {"max_block_n": 64}, ROWS, HEADS):
        y = interpreted("_softmax", "softmax_forward", scores, mask, 0.125, safe=True, **cap)
        assert_close(y, ref, torch.float32, f"{what}, {cap or 'single block'}")


@pytest.mark.parametrize("scale", [0.0, -0.5])
@pytest.mark.parametrize("kind", ["bool_per_query", "additive_causal"])
def test_masked_forward_with_a_scale_that_is_not_positive(interpreted, kind, scale):
    # A positive scale rides in exp2's argument (_softmax._x_factor); zero and negative scales
    # take the other form, with the scores scaled up front. Every path: block, looped, rows.
    shape = (2, 3, 5, 129)
    scores = _randn(shape, torch.float32, seed=6)
    mask = make_mask(kind, shape, torch.Generator().manual_seed(7))
    ref = masked_softmax_ref(scores, mask, scale)
    for cap in ({}, {"max_block_n": 64}, ROWS, HEADS):
        y = interpreted("_softmax", "softmax_forward", scores, mask, scale, safe=True, **cap)
        assert_close(y, ref, torch.float32, f"scale {scale}, {kind}, {cap or 'single block'}")


def test_masked_softmax_kernel_fully_masked_rows_are_zero(interpreted):
    scores = torch.randn(2, 2, 3, 50)
    mask = torch.ones(2, 1, 3, 50, dtype=torch.bool)
    mask[1, 0, 2] = False
    for cap in ({}, {"max_block_n": 16}, ROWS):
        y = interpreted("_softmax", "softmax_forward", scores, mask, 1.0, safe=True, **cap)
        assert torch.equal(y[1, :, 2], torch.zeros(2, 50))
        torch.testing.assert_close(y.sum(-1)[0], torch.ones(2, 3))


@pytest.mark.parametrize("act", ["relu", "gelu"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_bias_act_kernels_match_reference(interpreted, shape, dtype, act):
    x = _randn(shape, dtype)
    bias = _randn(shape[-1:], dtype, seed=3)
    dy = _randn(shape, dtype, seed=4)
    gelu_atol = GELU_ATOL if act == "gelu" else 0.0
    y = interpreted("_bias_act", "bias_act_forward", x, bias, act, 0.7)
    assert_close(y, bias_act_ref(x, bias, act, 0.7), dtype, f"{act} forward", gelu_atol * 0.7)
    dx, db = interpreted("_bias_act", "bias_act_backward", x, bias, dy, act, 0.7)
    dx_ref, db_ref = bias_act_backward_ref(x, bias, dy, act, 0.7)
    dz_atol = gelu_atol * 0.7 * dy.abs().max().item()
    assert_close(dx, dx_ref, dtype, f"{act} dx", dz_atol)
    rows = x.numel() // shape[-1]
    assert_close(db, db_ref, dtype, f"{act} dbias", sum_atol(dx_ref, rows) + rows * dz_atol)


@pytest.mark.parametrize("tile", [(8, 512, 8), (2, 2048, 8), (1, 64, 1)], ids=str)
def test_bias_act_forward_is_exact_under_any_tile(interpreted, tile):
    # kernel_configs.py times tiles other than tile_config's; each must cover the partial
    # tiles at a row's end and the last rows (781 columns, 5 rows: no tile divides either).
    x = _randn((5, 781), torch.float32)
    bias = _randn((781,), torch.float32, seed=3)
    y = interpreted("_bias_act", "bias_act_forward", x, bias, "gelu", 0.7, tile=tile)
    assert_close(y, bias_act_ref(x, bias, "gelu", 0.7), torch.float32, f"tile {tile}")


def test_gelu_erfc_polynomial_is_exact_gelu_to_fp32_precision_in_both_tails(interpreted):
    # The polynomial the 2-byte dtypes take (_gelu_cdf), forced on fp32 so its own error shows:
    # relative to an fp64 GELU, including the negative tail where 0.5 * (1 + erf) cancels.
    pytest.importorskip("triton")
    from torchkiln.kernels._bias_act import GELU_POLY

    # The reference through erfc: torch's own fp64 gelu cancels to -0 from x ~ -8.4.
    x = torch.linspace(-12.0, 12.0, 4001).reshape(1, -1)
    bias = torch.zeros(x.shape[-1])
    xd = x.double()
    ref = xd * 0.5 * torch.special.erfc(-xd * 0.5**0.5)

    def worst_relative(y):
        return ((y.double() - ref).abs() / ref.abs()).nan_to_num(0.0).max().item()

    y = interpreted("_bias_act", "bias_act_forward", x, bias, "gelu", 1.0, code=GELU_POLY)
    # ~|z|^2 * fp32 rounding from the exp argument at |x| = 12; 1.4e-5 seen: 270x below a bf16
    # ulp, 70x below fp16's.
    assert worst_relative(y) < 3e-5
    # The same inputs through tl.erf lose the tail (the cancellation the polynomial avoids).
    y_erf = interpreted("_bias_act", "bias_act_forward", x, bias, "gelu", 1.0)
    assert worst_relative(y_erf) > 0.5


def test_act_code_takes_the_inline_ptx_gelu_only_on_nvidia_gpus():
    # GELU_POLY_FAST's inline PTX cannot run in the interpreter (CPU tensors) or on ROCm: there
    # 2-byte GELU takes the plain polynomial, fp32 keeps tl.erf, relu is relu.
    pytest.importorskip("triton")
    from torchkiln.kernels._bias_act import ACT_CODES, GELU_POLY, act_code

    assert act_code("gelu", torch.zeros(1, dtype=torch.bfloat16)) == GELU_POLY
    assert act_code("gelu", torch.zeros(1, dtype=torch.float16)) == GELU_POLY
    assert act_code("gelu", torch.zeros(1)) == ACT_CODES["gelu"]
    assert act_code("relu", torch.zeros(1, dtype=torch.bfloat16)) == ACT_CODES["relu"]


@pytest.mark.parametrize("prefetch", [False, True], ids=["loop", "prefetch"])
def test_bias_act_backward_programs_loop_over_row_blocks(interpreted, prefetch):
    # 2 programs over 37 rows in blocks of 2 (rows 0-19 and 20-36): each loops 9-10 times and
    # the partial bias sums of both are added, exercising the path a 4096-row batch takes on the
    # GPU. The second program's last block (rows 36-37) is partial, and with prefetch the block
    # loaded ahead of each program's last iteration lies wholly past its rows.
    x, dy = _randn((37, 1024), torch.float32), _randn((37, 1024), torch.float32, seed=5)
    bias = _randn((1024,), torch.float32, seed=6)
    dx, db = interpreted(
        "_bias_act", "bias_act_backward", x, bias, dy, "gelu", 1.5, target_programs=2,
        prefetch=prefetch,
    )  # fmt: skip
    dx_ref, db_ref = bias_act_backward_ref(x, bias, dy, "gelu", 1.5)
    dz_atol = GELU_ATOL * 1.5 * dy.abs().max().item()
    assert_close(dx, dx_ref, torch.float32, "dx", dz_atol)
    assert_close(db, db_ref, torch.float32, "dbias", sum_atol(dx_ref, 37) + 37 * dz_atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_bias_gradient_sums_every_partial_row_and_column(interpreted, dtype):
    # The backward's partial sums [groups, N] summed down each column: 300 rows (two full
    # SUM_BLOCK_G tiles and a partial one) by 37 columns (two SUM_BLOCK_N tiles, the second
    # partial), stored in the bias's dtype: against the fp64 sums, within a 300-term fp32
    # summation's rounding and, for bf16, one rounding of the result.
    partial = _randn((300, 37), torch.float32, seed=7)
    db = interpreted("_bias_act", "bias_grad", partial, dtype)
    assert db.dtype == dtype and db.shape == (37,)
    assert_close(db, partial.double().sum(0), dtype, "column sums", sum_atol(partial, 300))
