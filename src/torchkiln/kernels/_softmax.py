"""Row softmax in Triton, layer 2: the launchers (and the names other modules import from here).

softmax_forward and softmax_backward turn a call into a launch: the kernel and configuration
come from the launch policy (_softmax_policy, tabled in docs/kernels.md), the kernels from
_softmax_kernels. eager_forward and eager_backward replay a recorded launch for a repeated
direct eager call (_launch_cache). The kernels, the policy's rules and its constants are
importable from this module too, as benchmarks and tests import them.
"""

from __future__ import annotations

import torch

from torchkiln.kernels import _launch_cache
from torchkiln.kernels._launch import (  # noqa: F401 - next_power_of_2 re-exported
    cdiv,
    device_info,
    launchable,
    next_power_of_2,
)
from torchkiln.kernels._softmax_kernels import (  # noqa: F401 - re-exported
    _exp2_shifted,
    _exp_factor,
    _finite,
    _heads_inner_row,
    _inverse,
    _kept_or_neg_inf,
    _load_x,
    _mask_factor,
    _mask_row_offset,
    _normalise,
    _scores,
    _softmax_bwd_block,
    _softmax_bwd_loop,
    _softmax_fwd_block,
    _softmax_fwd_loop,
    _softmax_fwd_pieces,
    _softmax_fwd_rows,
    _softmax_fwd_rows_words,
    _taken_row,
    _x_factor,
)
from torchkiln.kernels._softmax_policy import (  # noqa: F401 - re-exported
    HEADS_INNER_2BYTE_BLOCK,
    HEADS_INNER_2BYTE_EVEN,
    HEADS_INNER_MIN_BLOCK_N,
    LONG_ROW_LOOP,
    LOOP_BLOCK_N,
    MASK_ADD,
    MASK_ALONG_B,
    MASK_ALONG_H,
    MASK_ALONG_Q,
    MASK_BOOL,
    MASK_BOOL_PTX,
    MASK_FLAT,
    MASK_NONE,
    MASKED_FP32_WIDE_MAXNREG,
    MASKED_WIDE_BLOCK_N,
    MAX_BLOCK_N,
    PIECE_N,
    PIECES_2BYTE_MAX_TAIL,
    ROW_TILE,
    ROW_TILE_SHORT,
    ROWS_HEADS_2BYTE,
    ROWS_LOOP,
    block_config,
    even_block,
    forward_config,
    forward_maxnreg,
    heads_inner_order,
    kernel_kind,
    long_row_loop,
    mask_dims,
    mask_layout,
    pieces_config,
    rows_heads_inner,
    rows_loop,
    shared_by_heads,
    wide_mask_vec,
    words_mask,
)


def forward_args(
    x: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, int, tuple]:
    """(y, MASK_KIND, the leading launch arguments: x, y, mask pointer, M, N, H, Q, its four
    strides, scale) of a forward over `x`, y allocated; with no mask, x itself stands in for
    the pointer (never read)."""
    n = x.shape[-1]
    y = torch.empty_like(x)
    if mask is None:
        kind, m_arg, h, q, strides = MASK_NONE, x, 1, 1, (0, 0, 0, 0)
    else:
        kind, m_arg = (MASK_BOOL if mask.dtype == torch.bool else MASK_ADD), mask
        h, q, strides = mask_layout(x.shape, mask)
    m = x.numel() // n if n else 0
    return y, kind, (x, y, m_arg, m, n, h, q, *strides, float(scale))


def softmax_forward(
    x: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float = 1.0,
    safe: bool = False,
    max_block_n: int = MAX_BLOCK_N,
    loop_block_n: int = LOOP_BLOCK_N,
    loop_warps: int = 8,
    loop_programs: int | None = None,
    loop_l2_hints: bool = False,
    loop_chunk_stats: bool = False,
    loop_maxnreg: int | None = None,
    rows_config: tuple[int, int, int] | None = None,
    heads_inner: bool | None = None,
    mask_vec: bool | None = None,
    even: bool | None = None,
    pieces: tuple[int, int, int, int, bool, bool] | bool | None = None,
    mask_words: bool | None = None,
) -> torch.Tensor:
    """softmax(scale * x + mask) over the last dim of a contiguous `x`.

    `mask` is None, or a tensor that broadcasts to x read as [B, H, Q, K] (mask_layout), bool
    (True = keep) or floating (added). `safe` gives zeros for rows with no
    finite score. `max_block_n` lets tests reach the looped kernel with short rows; the looped
    kernel's chunk, warps, grid (`loop_programs` programs taking rows in turn; one per row
    when None), its cache hints (`loop_l2_hints`), per-chunk statistics (`loop_chunk_stats`) and
    register cap (`loop_maxnreg`, ptxas's .maxnreg: at 32 registers two 32-warp programs fit an
    SM) are parameters so benchmarks/kernel_configs.py can time them; rows over 16384 elements
    without a mask take the loop with per-chunk statistics and hints (LONG_ROW_LOOP), whatever
    those parameters say, and rows of 16385-32768 the persistent rows kernel where ROWS_LOOP
    has their kind; `rows_config` (warps, programs per SM, stages) sends rows of any length
    there (tests, benchmarks). `heads_inner` True makes a single-block forward over several heads
    take one row a program, heads innermost (the block kernel's HEADS_INNER), False never; None
    leaves it to heads_inner_order (a masked forward whose heads share the mask, where that
    measured faster), which goes before ROWS_LOOP; heads innermost, 2-byte rows of exactly 32768
    with a bool mask take the rows kernel (rows_heads_inner), with MASK_VEC and EVEN unless
    told, and read their mask as 64-bit words where words_mask allows (`mask_words`: True sends
    a bool mask over rows that fill the block to _softmax_fwd_rows_words wherever the rows kernel
    runs, tests; False never). `even` (no predicates; only where rows fill the block and the
    grid) and `mask_vec` (the mask at x's load width) choose the block's (and an explicit rows
    kernel's) EVEN and MASK_VEC; None leaves them to even_block and, for MASK_VEC, to the
    heads-innermost forward with EVEN and to wide_mask_vec (which also turns EVEN off). `pieces`
    (piece, pieces, tail, warps, heads innermost, MASK_VEC) sends rows to _softmax_fwd_pieces
    (tests, benchmarks), False never; None leaves it to pieces_config (padded rows of
    8193-16383), which goes before everything else.
    """
    y, kind, common = forward_args(x, mask, scale)
    if x.numel() == 0:
        return y
    m, n = common[3], common[4]
    dims = mask_dims(kind, m, *common[5:10])  # H, Q and the three row strides
    # Scaling inside exp2's FFMA needs a positive scale (_x_factor).
    pos_scale = common[-1] > 0
    masked, itemsize = kind != MASK_NONE, x.element_size()
    launch_kind = kernel_kind(kind, x)  # the policy below reads `kind`
    explicit = rows_config is not None
    h = common[5]
    if pieces is None and not explicit and max_block_n == MAX_BLOCK_N:
        pieces = pieces_config(n, kind, itemsize, shared_by_heads(dims, h))
    if pieces:
        piece, count, tail, warps, inner, vec = pieces
        inner = inner if heads_inner is None else heads_inner
        launchable(_softmax_fwd_pieces)[(m,)](
            *common, MASK_KIND=launch_kind, SAFE=safe, PIECE=piece, PIECES=count, TAIL=tail,
            MASK_DIMS=dims, POS_SCALE=pos_scale, HEADS_INNER=h if inner and h > 1 else 0,
            MASK_VEC=16 // itemsize if vec and masked else 0, num_warps=warps,
        )  # fmt: skip
        return y
    if heads_inner is None:
        heads_inner = not explicit and heads_inner_order(n, dims, itemsize, h, kind)
    heads = h if heads_inner and h > 1 and n <= max_block_n else 0
    rows_vec, rows_even, rows_words = mask_vec, even, bool(mask_words)
    if not explicit and max_block_n == MAX_BLOCK_N:
        if not heads:
            rows_config = rows_loop(n, masked, itemsize)
        else:
            rows_config = rows_heads_inner(n, kind, itemsize)
            rows_vec = True if mask_vec is None else mask_vec
            rows_even = True if even is None else even
            if mask_words is None and rows_config is not None:
                rows_words = words_mask(mask, common[7:11], n)
    if rows_config is not None:
        sms, major = device_info(x)
        # ROWS_LOOP was measured on an H200 only, and its 3-stage pipeline takes 128 KB of shared
        # memory a program, more than sm_86 / sm_89 GPUs have (100 KB): before Hopper the
        # earlier kernels stay.
        if explicit or major >= 9:
            warps, per_sm, stages = rows_config
            block_n = next_power_of_2(n)
            if rows_words and kind == MASK_BOOL and n == block_n:
                launchable(_softmax_fwd_rows_words)[(per_sm * sms,)](
                    *common, SAFE=safe, BLOCK_N=block_n, STAGES=stages, MASK_DIMS=dims,
                    POS_SCALE=pos_scale, HEADS_INNER=heads, num_warps=warps,
                )  # fmt: skip
                return y
            vec = 16 // itemsize if rows_vec and masked else 0
            # Every program takes rows in turn: a grid larger than the rows adds programs that
            # exit at once.
            launchable(_softmax_fwd_rows)[(per_sm * sms,)](
                *common, MASK_KIND=launch_kind, SAFE=safe, BLOCK_N=block_n, STAGES=stages,
                MASK_DIMS=dims, POS_SCALE=pos_scale, HEADS_INNER=heads if masked else 0,
                MASK_VEC=vec, EVEN=bool(rows_even) and n == block_n, num_warps=warps,
            )  # fmt: skip
            return y
    long_loop = long_row_loop(n, masked, itemsize)
    if long_loop is not None:
        loop_block_n, loop_warps = long_loop
        loop_l2_hints, loop_chunk_stats = True, True
        max_block_n = MAX_BLOCK_N // 2  # into the loop below
    if n <= max_block_n:
        block_m, block_n, num_warps = forward_config(n, masked, itemsize)
        maxnreg = forward_maxnreg(n, masked, itemsize)
        if heads:
            block_m, num_warps = 1, max(1, num_warps // block_m)
        # EVEN and MASK_VEC where the H200 measured them faster (even_block, wide_mask_vec),
        # unless told.
        fits = n == block_n and m % block_m == 0
        wide_vec = wide_mask_vec(n, kind, itemsize)
        if even is None:
            even = even_block(n, block_m, block_n) and not wide_vec
        exact = fits and even
        if mask_vec is None:
            mask_vec = (bool(heads) and exact) or wide_vec
        vec = 16 // itemsize if mask_vec and masked else 0
        launchable(_softmax_fwd_block)[(cdiv(m, block_m),)](
            *common, MASK_KIND=launch_kind, SAFE=safe, BLOCK_M=block_m, BLOCK_N=block_n,
            MASK_DIMS=dims, POS_SCALE=pos_scale, HEADS_INNER=heads, MASK_VEC=vec, EVEN=exact,
            num_warps=num_warps, **({} if maxnreg is None else {"maxnreg": maxnreg}),
        )  # fmt: skip
    else:
        grid = m if loop_programs is None else max(1, min(m, loop_programs))
        cap = {} if loop_maxnreg is None else {"maxnreg": loop_maxnreg}
        launchable(_softmax_fwd_loop)[(grid,)](
            *common, MASK_KIND=launch_kind, SAFE=safe, BLOCK_N=min(loop_block_n, max_block_n),
            L2_HINTS=loop_l2_hints, CHUNK_STATS=loop_chunk_stats, MASK_DIMS=dims,
            POS_SCALE=pos_scale, num_warps=loop_warps, **cap,
        )  # fmt: skip
    return y


# Eager calls' replays (_launch_cache): every forward kernel takes (x, y, mask, M, N, H, Q, four
# mask strides, scale, ...), every backward kernel (y, dy, dx, M, N, scale, ...).
_FORWARD_CACHE = _launch_cache.LaunchCache(slots=(0, 1, 2, 11), outs=1)
_BACKWARD_CACHE = _launch_cache.LaunchCache(slots=(0, 1, 2, 5), outs=2)


def eager_forward(
    x: torch.Tensor, mask: torch.Tensor | None = None, scale: float = 1.0, safe: bool = False
) -> torch.Tensor:
    """softmax_forward, through the launch cache where the call is a direct eager one. The key
    holds what the launch depends on (_launch_cache): x's shape (x is contiguous), dtype,
    device and alignment, the mask's shape, strides, dtype and alignment, the scale's sign."""
    if not _launch_cache.active():
        return softmax_forward(x, mask, scale, safe)
    scale = float(scale)
    if mask is None:
        key = (x.shape, x.dtype, x.device, x.data_ptr() % 16, scale > 0, safe)
        m_arg = x
    else:
        key = (x.shape, x.dtype, x.device, x.data_ptr() % 16, scale > 0, safe,
               mask.shape, mask.stride(), mask.dtype, mask.data_ptr() % 16)  # fmt: skip
        m_arg = mask
    replay = _FORWARD_CACHE.entries.get(key)
    if replay is None:
        return _FORWARD_CACHE.record(key, lambda: softmax_forward(x, mask, scale, safe))
    y = torch.empty_like(x)
    replay((x, y, m_arg, scale))
    return y


def eager_backward(y: torch.Tensor, dy: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """softmax_backward through the launch cache (eager_forward)."""
    if not _launch_cache.active():
        return softmax_backward(y, dy, scale)
    key = (y.shape, y.dtype, y.device, y.data_ptr() % 16, dy.data_ptr() % 16)
    replay = _BACKWARD_CACHE.entries.get(key)
    if replay is None:
        return _BACKWARD_CACHE.record(key, lambda: softmax_backward(y, dy, scale))
    dx = torch.empty_like(y)
    replay((y, dy, dx, float(scale)))
    return dx


def softmax_backward(
    y: torch.Tensor, dy: torch.Tensor, scale: float = 1.0, max_block_n: int = MAX_BLOCK_N
) -> torch.Tensor:
    """scale * y * (dy - sum(dy * y)) row by row; `y` and `dy` contiguous, same shape and dtype."""
    n = y.shape[-1]
    dx = torch.empty_like(y)
    if y.numel() == 0:
        return dx
    m = y.numel() // n
    if n <= max_block_n:
        block_m, block_n, num_warps = block_config(n)
        launchable(_softmax_bwd_block)[(cdiv(m, block_m),)](
            y, dy, dx, m, n, float(scale), BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps
        )
    else:
        launchable(_softmax_bwd_loop)[(m,)](
            y, dy, dx, m, n, float(scale), BLOCK_N=min(LOOP_BLOCK_N, max_block_n), num_warps=8
        )
    return dx
