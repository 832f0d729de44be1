"""FLOPs per step (torch.utils.flop_counter) and the device's peak, to report % of peak."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

# Dense (no sparsity) datasheet peaks in TFLOP/s, by a substring of the GPU's name; the
# precision key is what the matrix units run in. H100/H200 SXM share the same SMs and clocks,
# so the same rates (H200 measured here: 788 TFLOP/s for an 8192^3 bf16 product, 80% of 989).
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H100 SXM": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H100 80GB HBM3": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H100 PCIe": {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.2},
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
}


def peak_tflops(device_name: str | None, precision: str) -> tuple[float | None, str]:
    """The peak for ``precision`` on the named device and where it came from.

    KILN_PEAK_TFLOPS overrides the table, e.g. ``bf16=989,fp32=67`` or one number for all."""
    override = os.environ.get("KILN_PEAK_TFLOPS", "").strip()
    if override:
        if "=" not in override:
            return float(override), "KILN_PEAK_TFLOPS"
        table = dict(item.split("=", 1) for item in override.split(",") if item)
        if precision in table:
            return float(table[precision]), "KILN_PEAK_TFLOPS"
    if device_name:
        for key, table in PEAK_TFLOPS.items():
            if key.lower() in device_name.lower():
                return table[precision], f"datasheet ({key}, dense)"
    return None, "unknown device: set KILN_PEAK_TFLOPS"


def count_flops(fn: Callable[[], Any]) -> int:
    """FLOPs of one call of ``fn``, counted at the aten level (matmuls, convolutions, attention);
    elementwise work is not counted, as in the usual MFU accounting."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return int(counter.get_total_flops())
