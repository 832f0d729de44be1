"""The softmax kernels' launch policy: which kernel and which configuration a call of a given
shape, dtype and mask takes.

Every constant and rule here was chosen by a measurement on an H200 (torch 2.11, Triton 3.6);
docs/kernels.md has the policy as one table and docs/decisions.md one entry per choice (the
anchors named beside each constant), with the alternatives measured and their numbers. Where a
rule was not measured (fp16, padded lengths between measured ones) it takes the nearest measured
case's, and says so in its entry.
"""

from __future__ import annotations

import torch

from torchkiln.kernels._launch import next_power_of_2

# Longest row held whole in registers by one program; longer rows loop (#softmax-row-length).
MAX_BLOCK_N = 32768
# Chunk of the looped kernels that LONG_ROW_LOOP does not configure: 16 a thread at 8 warps.
LOOP_BLOCK_N = 4096
# Elements a program of short rows holds, below / from 1024 columns (#softmax-row-tile).
ROW_TILE_SHORT, ROW_TILE = 2048, 4096
# Block width from which the masked forward runs 16 warps, below MAX_BLOCK_N (#softmax-warps).
MASKED_WIDE_BLOCK_N = 16384

# The kernels' MASK_KIND: no mask, bool (True keeps), additive.
MASK_NONE, MASK_BOOL, MASK_ADD = 0, 1, 2
# A bool mask tested in PTX, for 2-byte scores on NVIDIA GPUs (#softmax-mask-bool-ptx).
MASK_BOOL_PTX = 3
# MASK_DIMS bits: what the mask varies along, or a contiguous [B * H * Q] row index (MASK_FLAT).
MASK_ALONG_B, MASK_ALONG_H, MASK_ALONG_Q, MASK_FLAT = 1, 2, 4, 8

# (chunk, warps) by element size of the unmasked loop over rows past 16384 (#softmax-long-rows).
LONG_ROW_LOOP = {4: (16384, 32), 2: (8192, 16)}
# (masked, itemsize) -> (warps, programs an SM, stages) of the rows kernel (#softmax-rows-32768).
ROWS_LOOP = {(False, 2): (32, 1, 3), (True, 4): (32, 1, 1)}
# The rows kernel heads innermost: 2-byte, bool mask, rows of 32768 (#softmax-rows-heads-32768).
ROWS_HEADS_2BYTE = (32, 1, 3)
# Full piece and longest masked 2-byte tail of the pieces kernel, 8193-16383 (#softmax-pieces).
PIECE_N, PIECES_2BYTE_MAX_TAIL = 4096, 512
# ptxas register cap of the masked fp32 forward in 16384 blocks (#softmax-masked-fp32-maxnreg).
MASKED_FP32_WIDE_MAXNREG = 64
# Smallest block in which the masked fp32 forward goes heads innermost (#softmax-heads-inner).
HEADS_INNER_MIN_BLOCK_N = 8192
# Where the masked 2-byte forward goes heads innermost: rows of / blocks of (#softmax-heads-inner).
HEADS_INNER_2BYTE_EVEN, HEADS_INNER_2BYTE_BLOCK = 16384, MAX_BLOCK_N


def block_config(n_cols: int, masked: bool = False) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) of the single-block kernels for rows of `n_cols` elements.

    16 elements per thread (32 at the 32768 cap): enough independent 16-byte loads in flight to
    cover DRAM latency without spilling; 32 warps is the most a program can have. The masked
    forward holds 32 per thread at 16 warps in 16384-element blocks (decisions.md#softmax-warps).
    """
    block_n = next_power_of_2(n_cols)
    block_m = max(1, (ROW_TILE_SHORT if block_n < 1024 else ROW_TILE) // block_n)
    most = 16 if masked and MASKED_WIDE_BLOCK_N <= block_n < MAX_BLOCK_N else 32
    num_warps = min(most, max(4, block_m * block_n // 512))
    return block_m, block_n, num_warps


def forward_config(n_cols: int, masked: bool, itemsize: int) -> tuple[int, int, int]:
    """block_config for the forward, with twice the values per thread (half the warps) where
    that measured faster: 2048-element blocks of every kind and dtype, and the 2-byte masked
    forward in 4096- to 16384-element blocks (decisions.md#softmax-warps)."""
    block_m, block_n, num_warps = block_config(n_cols, masked)
    if block_n == 2048 or (masked and itemsize == 2 and block_n in (4096, 8192, 16384)):
        num_warps = max(4, num_warps // 2)
    return block_m, block_n, num_warps


def long_row_loop(n_cols: int, masked: bool, itemsize: int) -> tuple[int, int] | None:
    """(chunk, warps) of the looped forward with per-chunk statistics and L2 hints where rows of
    `n_cols` take it (LONG_ROW_LOOP: no mask, over 16384 elements), else None."""
    if masked or n_cols <= MAX_BLOCK_N // 2:
        return None
    return LONG_ROW_LOOP.get(itemsize, LONG_ROW_LOOP[2])


def rows_loop(n_cols: int, masked: bool, itemsize: int) -> tuple[int, int, int] | None:
    """(warps, programs per SM, stages) of the persistent rows kernel where rows of `n_cols` take
    it (ROWS_LOOP: rows held in a 32768-element block), else None."""
    if not MAX_BLOCK_N // 2 < n_cols <= MAX_BLOCK_N:
        return None
    return ROWS_LOOP.get((masked, itemsize))


def rows_heads_inner(n_cols: int, kind: int, itemsize: int) -> tuple[int, int, int] | None:
    """(warps, programs per SM, stages) of the rows kernel heads innermost, with MASK_VEC and EVEN,
    where a forward that goes heads innermost (heads_inner_order) takes it instead of the block
    (ROWS_HEADS_2BYTE: a 2-byte one with a bool mask over rows of exactly 32768), else None."""
    if kind == MASK_BOOL and itemsize == 2 and n_cols == MAX_BLOCK_N:
        return ROWS_HEADS_2BYTE
    return None


def kernel_kind(kind: int, x: torch.Tensor) -> int:
    """The kernels' MASK_KIND for a mask of `kind` over `x`: MASK_BOOL_PTX for a bool mask over
    2-byte scores on an NVIDIA GPU (measured faster there; the interpreter and ROCm cannot run
    its PTX), else `kind`."""
    if kind == MASK_BOOL and x.element_size() == 2 and x.is_cuda and torch.version.hip is None:
        return MASK_BOOL_PTX
    return kind


def words_mask(mask: torch.Tensor, strides: tuple[int, ...], n_cols: int) -> bool:
    """Whether a bool `mask`, addressed by `strides` (mask_layout's) over rows of `n_cols`, can
    be read as 64-bit words: contiguous along K and every row starting on 8 bytes. Never for a
    traced mask (torch.compile's fake tensors): the launch chosen there is replayed on whatever
    address the real mask has, and the words kernel needs its 8-byte alignment."""
    from torch._subclasses.fake_tensor import is_fake

    if mask.dtype != torch.bool or strides[3] != 1 or n_cols % 8:
        return False
    if torch.compiler.is_compiling() or is_fake(mask):
        return False
    return mask.data_ptr() % 8 == 0 and all(s % 8 == 0 for s in strides[:3])


def shared_by_heads(dims: int, heads: int) -> bool:
    """Whether a mask (MASK_DIMS `dims`) is shared by several heads and differs by query."""
    shared = dims & MASK_ALONG_Q and not dims & (MASK_ALONG_H | MASK_FLAT)
    return bool(shared) and heads > 1


def pieces_config(
    n_cols: int, kind: int, itemsize: int, shared: bool
) -> tuple[int, int, int, int, bool, bool] | None:
    """(piece, pieces, tail, warps, heads innermost, MASK_VEC) of _softmax_fwd_pieces where rows of
    `n_cols` (8193-16383, padded in a 16384-element block) take it by default, else None; `shared`:
    the heads share a bool mask (shared_by_heads). Measurements: decisions.md#softmax-pieces."""
    if not MAX_BLOCK_N // 4 < n_cols < MAX_BLOCK_N // 2:
        return None
    pieces, rest = divmod(n_cols, PIECE_N)
    tail = next_power_of_2(rest)  # 1 where the pieces cover the row: an empty tail
    if kind == MASK_NONE:
        warps = 8 if pieces == 2 else 4 if tail >= 2048 else 16
        return (PIECE_N, pieces, tail, warps, False, False) if itemsize == 2 else None
    if kind != MASK_BOOL:
        return None
    if itemsize == 4:
        return (PIECE_N, pieces, tail, 4, True, True) if shared else None
    if pieces == 2 or tail <= PIECES_2BYTE_MAX_TAIL:
        return (PIECE_N, pieces, tail, 8, shared, False)
    return None


def heads_inner_order(
    n_cols: int, dims: int, itemsize: int, heads: int, kind: int = MASK_BOOL
) -> bool:
    """Whether the single-block forward takes its rows heads innermost by default: several
    heads and a mask (MASK_DIMS `dims`, MASK_KIND `kind`) that differs by query but not by head;
    fp32 in 8192- to 32768-element blocks (HEADS_INNER_MIN_BLOCK_N), 2-byte dtypes with a bool
    mask where a row fills a 16384-element block or in 32768-element blocks
    (HEADS_INNER_2BYTE_EVEN, HEADS_INNER_2BYTE_BLOCK; decisions.md#softmax-heads-inner)."""
    block_n = next_power_of_2(n_cols)
    if not shared_by_heads(dims, heads) or not HEADS_INNER_MIN_BLOCK_N <= block_n <= MAX_BLOCK_N:
        return False
    if itemsize == 4:
        return True
    fills = n_cols == HEADS_INNER_2BYTE_EVEN
    return kind == MASK_BOOL and (fills or block_n == HEADS_INNER_2BYTE_BLOCK)


def even_block(n_cols: int, block_m: int, block_n: int) -> bool:
    """Whether the single block runs without predicates (EVEN): one row a program, filling
    the block (decisions.md#softmax-even)."""
    return block_m == 1 and n_cols == block_n


def wide_mask_vec(n_cols: int, kind: int, itemsize: int) -> bool:
    """Whether the single-block forward over rows of `n_cols` loads its mask (MASK_KIND `kind`)
    at x's width (MASK_VEC) and keeps its predicates (no EVEN) by default: the 2-byte forward
    with a bool mask in 32768-element blocks (decisions.md#softmax-mask-vec)."""
    return kind == MASK_BOOL and itemsize == 2 and next_power_of_2(n_cols) == MAX_BLOCK_N


def forward_maxnreg(n_cols: int, masked: bool, itemsize: int) -> int | None:
    """ptxas's register cap for the single-block forward over rows of `n_cols`, or None:
    MASKED_FP32_WIDE_MAXNREG for the masked fp32 forward in 16384-element blocks on NVIDIA GPUs."""
    wide = MASKED_WIDE_BLOCK_N == next_power_of_2(n_cols)
    if masked and itemsize == 4 and wide and torch.version.hip is None:
        return MASKED_FP32_WIDE_MAXNREG
    return None


def mask_layout(shape: tuple[int, ...], mask: torch.Tensor) -> tuple[int, int, tuple[int, ...]]:
    """(H, Q, strides) that address `mask` broadcast over scores of `shape` (1 to 4 dims, read
    as [B, H, Q, K] aligned from the right, as broadcasting aligns them): a mask dimension of
    size 1 gets stride 0. Arithmetic on shapes, so no view is built per call (the masked forward
    built four and spent 89 us a call on an H200's host against softmax's 28; commit 550ec6a)."""
    dims = (1, 1, 1, 1, *shape)[-4:]
    mask_dims = (1, 1, 1, 1, *mask.shape)[-4:]
    mask_strides = (0, 0, 0, 0, *mask.stride())[-4:]
    strides = tuple(0 if d == 1 else s for d, s in zip(mask_dims, mask_strides, strict=True))
    return dims[1], dims[2], strides


def mask_dims(kind: int, m: int, h: int, q: int, smb: int, smh: int, smq: int) -> int:
    """The forward's MASK_DIMS: which of batch, heads and queries the mask's address needs (a
    dimension of one, or of stride 0, does not, but the batch index is made wherever there are
    several batches and the head is needed, to take the head apart from it), or MASK_FLAT when
    the strides are a contiguous [B, H, Q] index's (a full mask: the row times smq)."""
    if kind == MASK_NONE:
        return 0
    b = m // (h * q) if h * q else 1
    if smq != 0 and (h == 1 or smh == q * smq) and (b == 1 or smb == h * q * smq):
        return MASK_FLAT
    along_h, along_q = h > 1 and smh != 0, q > 1 and smq != 0
    along_b = b > 1 and (smb != 0 or along_h)
    return along_b * MASK_ALONG_B + along_h * MASK_ALONG_H + along_q * MASK_ALONG_Q
