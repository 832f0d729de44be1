"""One default per option, read by the CLI and the Python API alike.

`auto` values depend on the device: a full-size model step takes seconds on a 2-core CPU, so
the CPU gets the tiny preset and a budget that ends the default tune within 5 minutes there.
"""

from __future__ import annotations

PRESETS = ("auto", "full", "tiny")
PRESET = "auto"  # full on a GPU, tiny on the CPU
BUDGET = "auto"  # TUNE_BUDGET for the device
TUNE_BUDGET = {"cuda": "15m", "cpu": "4m"}
TRIAL_TIMEOUT_S = 900.0
STEP = "infer"


def device(requested: str | None = None) -> str:
    """The device asked for, else cuda where a GPU is visible, else cpu."""
    if requested:
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _kind(device_name: str) -> str:
    return "cuda" if device_name.startswith("cuda") else "cpu"


def preset(requested: str, device_name: str) -> str:
    """`auto` is `full` on a GPU and `tiny` on the CPU, where full-size steps take seconds."""
    if requested == "auto":
        return "full" if _kind(device_name) == "cuda" else "tiny"
    return requested


def budget(requested: str | float, device_name: str) -> str | float:
    """`auto` is TUNE_BUDGET for the device; anything else as given."""
    return TUNE_BUDGET[_kind(device_name)] if requested == "auto" else requested
