"""act(x + bias) * scale in Triton: layer 1 (private @triton.jit kernels) and layer 2 (launchers).

The forward reads x once and writes y once. The backward recomputes x + bias instead of saving
it (one tensor less held between forward and backward), writes dx, and folds the bias gradient
into the same pass as per-program column sums that a small column-sum kernel finishes
(_bias_grad_sum). The constants below were chosen by measurements on an H200 (torch 2.11, Triton
3.6); each names its entry in docs/decisions.md (#anchor), which has the numbers.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from torchkiln.kernels import _launch_cache
from torchkiln.kernels._launch import cdiv, device_info, launchable, next_power_of_2

ACT_CODES = {"relu": 0, "gelu": 1}
# 2-byte GELU through the erfc polynomial, in PTX on NVIDIA GPUs (#bias-act-gelu-poly); fp32 tl.erf.
GELU_POLY, GELU_POLY_FAST = 2, 3
# Tile elements forward / backward, at most 8 rows x 1024 columns; ptxas, sm_90 (#bias-act-tiles).
FWD_TILE, BWD_TILE, MAX_BLOCK_M, MAX_BLOCK_N = 4096, 2048, 8, 1024
# The backward prefetches the next rows and runs under a 64-register cap (#bias-act-backward).
BWD_PREFETCH, BWD_MAXNREG = True, 64
# The backward's grid: one wave of this many programs an SM, looping over rows (#bias-act-backward).
PROGRAMS_PER_SM = 4
# Tile (partial rows x columns) of the bias gradient's column sums (#bias-act-bias-grad).
SUM_BLOCK_G, SUM_BLOCK_N = 128, 16


@triton.jit
def _rcp(x, FAST: tl.constexpr):
    if FAST:  # one MUFU op; `1.0 / x` is div.full.f32 with range checks (sm_90 SASS)
        r = tl.inline_asm_elementwise(
            "rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        r = 1.0 / x
    return r


@triton.jit
def _exp2(x, FAST: tl.constexpr):
    if FAST:  # flushes results below 2^-126 to 0: only GELU's far negative tail, x < -13
        r = tl.inline_asm_elementwise(
            "ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        r = tl.exp2(x)
    return r


@triton.jit
def _erfc_log2_poly(t):
    # log2(erfc(a) / t) + a^2 * log2(e) - 1 as a polynomial in t = 1 / (1 + a / 2): the
    # Chebyshev-fitted exponent of Press et al.'s erfc (Numerical Recipes, "erfcc"; fractional
    # error below 1.2e-7 everywhere), its coefficients times log2(e) and the constant less 1,
    # so 0.5 * erfc(a) = t * exp2(poly(t) - a^2 * log2(e)) with no further multiply. Literals:
    # Inductor copies this source into its output, globals would not follow.
    p = 0.24651729790196045
    p = -1.1861149450768025 + t * p
    p = 2.147474463933521 + t * p
    p = -1.637753152343414 + t * p
    p = 0.40232158165127635 + t * p
    p = -0.2687568603388257 + t * p
    p = 0.1396300565225048 + t * p
    p = 0.5397006155284324 + t * p
    p = 1.4427292039075317 + t * p
    return -2.825748218405333 + t * p


@triton.jit
def _gelu_poly(z, FAST: tl.constexpr):
    # GELU(z) = z * Phi(z) through tail = Phi(-|z|) = 0.5 * erfc(|z| / sqrt(2)): relu(z) minus
    # |z| * tail on both sides (z * (1 - tail) for z >= 0, z * tail below), no select. The tail
    # is relative-accurate, so the negative side, where 0.5 * (1 + erf) cancels, keeps its
    # precision. Exact GELU within fp32 rounding (the exp argument's error, ~z^2 * 6e-8, is far
    # below a 2-byte output's ulp); FAST takes the hardware's approximate rcp and exp2.
    # (1 / sqrt(2)) / 2 and log2(e) / 2.
    t = _rcp(1.0 + 0.35355339059327373 * tl.abs(z), FAST)
    tail = t * _exp2(_erfc_log2_poly(t) - z * z * 0.7213475204444817, FAST)
    return tl.maximum(z, 0.0) - tl.abs(z) * tail


@triton.jit
def _gelu_poly_grad(z, FAST: tl.constexpr):
    # Phi(z) + z * phi(z), with phi(z) = exp(-z^2 / 2) / sqrt(2 * pi) shared with the tail.
    t = _rcp(1.0 + 0.35355339059327373 * tl.abs(z), FAST)
    e = _exp2(z * z * -0.7213475204444817, FAST)
    tail = t * _exp2(_erfc_log2_poly(t), FAST) * e
    cdf = tl.where(z >= 0.0, 1.0 - tail, tail)
    return cdf + z * e * 0.3989422804014327


@triton.jit
def _act(z, ACT: tl.constexpr):
    if ACT == 0:
        out = tl.maximum(z, 0.0)
    elif ACT == 1:
        # Exact (erf) GELU, as torch.nn.functional.gelu(approximate="none"). Constants are
        # literals: Inductor copies this source into its output, globals would not follow.
        out = 0.5 * z * (1.0 + tl.erf(z * 0.7071067811865476))
    else:
        out = _gelu_poly(z, ACT == 3)  # 3: GELU_POLY_FAST (a literal: Inductor copies source)
    return out


@triton.jit
def _act_grad(z, ACT: tl.constexpr):
    if ACT == 0:
        # 0 at z == 0, as torch's threshold_backward.
        g = tl.where(z > 0.0, 1.0, 0.0)
    elif ACT == 1:
        # Phi(z) + z * phi(z), with 1/sqrt(2) and 1/sqrt(2*pi).
        cdf = 0.5 * (1.0 + tl.erf(z * 0.7071067811865476))
        # exp(-z^2 / 2) as exp2(z^2 * -log2(e) / 2): tl.exp adds a denormal fix-up
        # (as the softmax kernels' _x_factor).
        g = cdf + z * tl.exp2(z * z * -0.7213475204444817) * 0.3989422804014327
    else:
        g = _gelu_poly_grad(z, ACT == 3)  # 3: GELU_POLY_FAST
    return g


def act_code(act: str, x: torch.Tensor) -> int:
    """The kernels' ACT constexpr for `act` on `x`: gelu on 2-byte dtypes takes the erfc
    polynomial, with the approximate rcp and exp2 where the tensor is on an NVIDIA GPU."""
    code = ACT_CODES[act]
    if code != ACT_CODES["gelu"] or x.element_size() != 2:
        return code
    return GELU_POLY_FAST if x.is_cuda and torch.version.hip is None else GELU_POLY


@triton.jit
def _bias_act_fwd(
    x_ptr, b_ptr, y_ptr, M, N, scale,
    ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    scale = tl.cast(scale, tl.float32)  # Inductor passes Python floats as fp64 (H200 run)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    inb = (rows[:, None] < M) & col_ok[None, :]
    # A 64-bit start per row plus 32-bit columns: fewer registers than 64-bit offsets per element.
    row_start = (rows.to(tl.int64) * N)[:, None]
    b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + row_start + cols[None, :], mask=inb, other=0.0).to(tl.float32)
    y = _act(x + b[None, :], ACT) * scale
    tl.store(y_ptr + row_start + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=inb)


@triton.jit
def _bias_act_bwd_tile(x, dy, b, dx_ptrs, inb, scale, ACT: tl.constexpr):
    # Out-of-bounds lanes load dy == 0, so they add nothing to the bias sums.
    dz = dy.to(tl.float32) * scale * _act_grad(x.to(tl.float32) + b[None, :], ACT)
    tl.store(dx_ptrs, dz.to(dx_ptrs.dtype.element_ty), mask=inb)
    return dz


@triton.jit
def _bias_act_bwd(
    x_ptr, b_ptr, dy_ptr, dx_ptr, db_partial_ptr, M, N, rows_per_prog, scale,
    ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PREFETCH: tl.constexpr = False,
):  # fmt: skip
    scale = tl.cast(scale, tl.float32)  # Inductor passes Python floats as fp64 (H200 run)
    pid_m = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    # Summed element-wise across the loop and reduced over rows once at the end.
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    row0 = pid_m * rows_per_prog
    row_end = tl.minimum(row0 + rows_per_prog, M)
    if PREFETCH:
        # The next row block's loads are issued before this one's arithmetic and store, so
        # each program keeps two blocks in flight instead of waiting out a DRAM round trip
        # per iteration (kernel_configs.py times it against the plain loop).
        rows = row0 + tl.arange(0, BLOCK_M)
        inb = (rows[:, None] < row_end) & col_ok[None, :]
        row_start = (rows.to(tl.int64) * N)[:, None]
        x = tl.load(x_ptr + row_start + cols[None, :], mask=inb, other=0.0)
        dy = tl.load(dy_ptr + row_start + cols[None, :], mask=inb, other=0.0)
        for start in range(row0, row_end, BLOCK_M):
            rows_n = start + BLOCK_M + tl.arange(0, BLOCK_M)
            inb_n = (rows_n[:, None] < row_end) & col_ok[None, :]
            start_n = (rows_n.to(tl.int64) * N)[:, None]
            x_n = tl.load(x_ptr + start_n + cols[None, :], mask=inb_n, other=0.0)
            dy_n = tl.load(dy_ptr + start_n + cols[None, :], mask=inb_n, other=0.0)
            dx_ptrs = dx_ptr + row_start + cols[None, :]
            acc += _bias_act_bwd_tile(x, dy, b, dx_ptrs, inb, scale, ACT)
            x, dy, inb, row_start = x_n, dy_n, inb_n, start_n
    else:
        for start in range(row0, row_end, BLOCK_M):
            rows = start + tl.arange(0, BLOCK_M)
            inb = (rows[:, None] < row_end) & col_ok[None, :]
            row_start = (rows.to(tl.int64) * N)[:, None]
            x = tl.load(x_ptr + row_start + cols[None, :], mask=inb, other=0.0)
            dy = tl.load(dy_ptr + row_start + cols[None, :], mask=inb, other=0.0)
            dx_ptrs = dx_ptr + row_start + cols[None, :]
            acc += _bias_act_bwd_tile(x, dy, b, dx_ptrs, inb, scale, ACT)
    tl.store(db_partial_ptr + pid_m.to(tl.int64) * N + cols, tl.sum(acc, axis=0), mask=col_ok)


@triton.jit
def _bias_grad_sum(p_ptr, db_ptr, G, N, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr):
    # Column sums of the [G, N] fp32 partials, in a fixed order: the same bias gradient for the
    # same inputs on every run (no atomics).
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    acc = tl.zeros([BLOCK_G, BLOCK_N], tl.float32)
    for g in range(0, G, BLOCK_G):
        rows = g + tl.arange(0, BLOCK_G)
        ok = (rows[:, None] < G) & col_ok[None, :]
        acc += tl.load(p_ptr + rows[:, None].to(tl.int64) * N + cols[None, :], mask=ok, other=0.0)
    tl.store(db_ptr + cols, tl.sum(acc, axis=0).to(db_ptr.dtype.element_ty), mask=col_ok)


def bias_grad(
    partial: torch.Tensor, dtype: torch.dtype, blocks: tuple[int, int] | None = None
) -> torch.Tensor:
    """The bias gradient in `dtype` from backward_launch's fp32 partial sums [groups, N].
    `blocks` (rows, columns) replaces (SUM_BLOCK_G, SUM_BLOCK_N), so that tiles can be timed."""
    g, n = partial.shape
    block_g, block_n = (SUM_BLOCK_G, SUM_BLOCK_N) if blocks is None else blocks
    db = torch.empty(n, dtype=dtype, device=partial.device)
    launchable(_bias_grad_sum)[(cdiv(n, block_n),)](
        partial, db, g, n, BLOCK_G=block_g, BLOCK_N=block_n
    )
    return db


def tile_config(n_cols: int, tile: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for rows of `n_cols`: 16 elements per thread forward,
    8 backward (at most 8 warps)."""
    block_n = min(next_power_of_2(n_cols), MAX_BLOCK_N)
    block_m = max(1, min(MAX_BLOCK_M, tile // block_n))
    per_thread = 16 if tile == FWD_TILE else 8
    return block_m, block_n, max(1, min(8, block_m * block_n // (32 * per_thread)))


def forward_tile(n_cols: int, itemsize: int) -> tuple[int, int, int]:
    """The forward's tile: tile_config's, except that 2-byte rows of 1024 columns or more take
    half its rows at half its warps (2 x 1024 at 4 warps, still 16 values a thread), where that
    measured faster on an H200 (decisions.md#bias-act-tiles)."""
    block_m, block_n, warps = tile_config(n_cols, FWD_TILE)
    if itemsize == 2 and block_n == MAX_BLOCK_N:
        return max(1, block_m // 2), block_n, max(1, warps // 2)
    return block_m, block_n, warps


def bias_act_forward(
    x: torch.Tensor,
    bias: torch.Tensor,
    act: str,
    scale: float,
    code: int | None = None,
    tile: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """act(x + bias) * scale; `x` contiguous [..., N], `bias` [N] of x's dtype. `code` forces
    the kernel's ACT (benchmarks/kernel_configs.py times tl.erf against the polynomial), `tile`
    the (BLOCK_M, BLOCK_N, warps) that forward_tile would choose (kernel_configs.py times tiles)."""
    n = x.shape[-1]
    y = torch.empty_like(x)
    if x.numel() == 0:
        return y
    m = x.numel() // n
    block_m, block_n, num_warps = forward_tile(n, x.element_size()) if tile is None else tile
    grid = (cdiv(m, block_m), cdiv(n, block_n))
    launchable(_bias_act_fwd)[grid](
        x, bias, y, m, n, float(scale),
        ACT=act_code(act, x) if code is None else code, BLOCK_M=block_m,
        BLOCK_N=block_n, num_warps=num_warps,
    )  # fmt: skip
    return y


# Eager calls' replays (_launch_cache): the forward kernel takes (x, bias, y, M, N, scale, ...).
_FORWARD_CACHE = _launch_cache.LaunchCache(slots=(0, 1, 2, 5), outs=2)


def eager_forward(x: torch.Tensor, bias: torch.Tensor, act: str, scale: float) -> torch.Tensor:
    """bias_act_forward, through the launch cache where the call is a direct eager one; the key:
    x's shape (contiguous), dtype, device, the alignment of x and bias, the activation."""
    if not _launch_cache.active():
        return bias_act_forward(x, bias, act, scale)
    key = (x.shape, x.dtype, x.device, x.data_ptr() % 16, bias.data_ptr() % 16, act)
    replay = _FORWARD_CACHE.entries.get(key)
    if replay is None:
        return _FORWARD_CACHE.record(key, lambda: bias_act_forward(x, bias, act, scale))
    y = torch.empty_like(x)
    replay((x, bias, y, float(scale)))
    return y


# The backward kernel takes (x, bias, dy, dx, partial bias sums, M, N, rows a program, scale, ...);
# the bias gradient's (partial sums, bias gradient, G, N, ...).
_BACKWARD_CACHE = _launch_cache.LaunchCache(slots=(0, 1, 2, 3, 4, 8), outs=(3, 4))
_BIAS_GRAD_CACHE = _launch_cache.LaunchCache(slots=(0, 1), outs=1)


def eager_backward(
    x: torch.Tensor, bias: torch.Tensor, dy: torch.Tensor, act: str, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """bias_act_backward, its two launches through the launch cache where the call is a
    direct eager one (eager_forward's key, with dy's alignment); the partial sums' shape is the
    recorded one."""
    if not _launch_cache.active() or x.numel() == 0:
        return bias_act_backward(x, bias, dy, act, scale)
    key = (x.shape, x.dtype, x.device, x.data_ptr() % 16, bias.data_ptr() % 16,
           dy.data_ptr() % 16, act)  # fmt: skip
    replay = _BACKWARD_CACHE.entries.get(key)
    if replay is None:
        dx, partial = _BACKWARD_CACHE.record(key, lambda: backward_launch(x, bias, dy, act, scale))
    else:
        dx = torch.empty_like(x)
        partial = torch.empty(replay.shapes[1], dtype=torch.float32, device=x.device)
        replay((x, bias, dy, dx, partial, float(scale)))
    # The partials are ours, fresh from the caching allocator: aligned, contiguous.
    sum_key = (partial.shape, bias.dtype, x.device)
    sum_replay = _BIAS_GRAD_CACHE.entries.get(sum_key)
    if sum_replay is None:
        return dx, _BIAS_GRAD_CACHE.record(sum_key, lambda: bias_grad(partial, bias.dtype))
    db = torch.empty(partial.shape[1], dtype=bias.dtype, device=x.device)
    sum_replay((partial, db))
    return dx, db


def bias_act_backward(
    x: torch.Tensor, bias: torch.Tensor, dy: torch.Tensor, act: str, scale: float, **choices: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dbias) of act(x + bias) * scale; `x` and `dy` contiguous and of the same shape.
    `choices` are backward_launch's launch choices (tests, benchmarks/kernel_configs.py)."""
    if x.numel() == 0:
        return torch.empty_like(x), torch.zeros_like(bias)
    dx, partial = backward_launch(x, bias, dy, act, scale, **choices)
    return dx, bias_grad(partial, bias.dtype)


def backward_launch(
    x: torch.Tensor,
    bias: torch.Tensor,
    dy: torch.Tensor,
    act: str,
    scale: float,
    target_programs: int | None = None,
    code: int | None = None,
    prefetch: bool = BWD_PREFETCH,
    tile: tuple[int, int, int] | None = None,
    maxnreg: int | None = BWD_MAXNREG,
) -> tuple[torch.Tensor, torch.Tensor]:
    """bias_act_backward's kernel launch on a non-empty `x`: (dx, the fp32 partial bias sums, a
    row a program group, which bias_act_backward sums).

    `target_programs` (None: PROGRAMS_PER_SM an SM) is how many programs the grid aims at, rows
    split into groups over the column blocks; tests make each program loop over several row
    blocks with a small one. `code` forces
    the kernel's ACT, as in bias_act_forward. `prefetch` (the next row block's loads issued
    before this one's arithmetic), `tile` ((BLOCK_M, BLOCK_N, num_warps) instead of
    tile_config's) and `maxnreg` (ptxas's register cap, None for none) are the launch choices
    benchmarks/kernel_configs.py times; the defaults are BWD_PREFETCH and BWD_MAXNREG.
    """
    n = x.shape[-1]
    dx = torch.empty_like(x)
    m = x.numel() // n
    block_m, block_n, num_warps = tile_config(n, BWD_TILE) if tile is None else tile
    col_blocks = cdiv(n, block_n)
    row_blocks = cdiv(m, block_m)
    if target_programs is None:
        target_programs = PROGRAMS_PER_SM * device_info(x)[0]
    groups = min(row_blocks, max(1, target_programs // col_blocks))
    rows_per_prog = cdiv(row_blocks, groups) * block_m
    groups = cdiv(m, rows_per_prog)
    partial = torch.empty((groups, n), dtype=torch.float32, device=x.device)
    cap = {} if maxnreg is None or torch.version.hip is not None else {"maxnreg": maxnreg}
    launchable(_bias_act_bwd)[(groups, col_blocks)](
        x, bias, dy, dx, partial, m, n, rows_per_prog, float(scale),
        ACT=act_code(act, x) if code is None else code, BLOCK_M=block_m,
        BLOCK_N=block_n, PREFETCH=prefetch, num_warps=num_warps, **cap,
    )  # fmt: skip
    return dx, partial
