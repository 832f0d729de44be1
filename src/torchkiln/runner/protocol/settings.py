"""Per-arm numeric settings, seeding and the helpers both arms share."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device too


@contextlib.contextmanager
def precision_flags(precision: str) -> Iterator[None]:
    """TF32 on for the `tf32` policy only, off otherwise: the fp32 arm is full fp32.

    Set around every call of an arm, so two arms interleaved in one process each run under
    their own flags; restored afterwards."""
    import torch

    tf32 = precision == "tf32"
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def autocast(device: str, precision: str) -> contextlib.AbstractContextManager:
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.split(":")[0], dtype=dtype)


def active_dropout(model: Any) -> bool:
    import torch.nn as nn

    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules())


def disable_dropout(model: Any) -> None:
    """p=0 on every dropout module (attention dropout in transformers reads `dropout.p` too)."""
    import torch.nn as nn

    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0


def call_model(model: Any, inputs: Any) -> Any:
    return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def map_tensors(obj: Any, fn: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(map_tensors(v, fn) for v in obj)
    return obj
