"""One probe arm checked against a reference and timed: shared by the kernel probes
(tma_rows_probe.py, mask_words_probe.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def time_arm(
    fn: Callable[[], Any], ref: Any, nbytes: int, copy_bytes: int, copy_ms: float, bench: Callable
) -> dict[str, Any]:
    """`fn`'s largest error relative to `ref`'s largest value; where it is under 3e-2, its time
    by `bench` (do_bench: median ms, L2 flushed) and its bandwidth in % of the copy's, counted
    as bench_kernels.py counts it (`nbytes` over the time, against `copy_bytes` over
    `copy_ms`). An arm that fails is reported with its reason, not raised."""
    try:
        err = ((fn().float() - ref).abs().max() / ref.abs().max()).item()
        ms = bench(fn) if err < 3e-2 else None
        status = "ok" if ms is not None else f"wrong (max error {err:.3g})"
    except Exception as e:  # noqa: BLE001 - a failed arm is reported with its reason, the rest run on
        ms, err, status = None, None, f"{type(e).__name__}: {str(e)[:200]}"
    pct = 100 * (nbytes / ms) / (copy_bytes / copy_ms) if ms else None
    return {"ms": ms, "max_error": err, "status": status, "bytes": nbytes, "pct_of_copy": pct}
