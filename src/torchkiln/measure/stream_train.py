"""A training stream: each item is one training step (forward, loss, backward, optimizer step) on
that item's inputs, as a padding-free data loader yields batches of varying sequence length.

What this module adds to the inference replay (measure.stream_replay): the rule that compares a
candidate's losses with eager's, and the data-path padding of a bucketed candidate, whose pad
values the workload declares (``Workload.pad_values``) so that padding leaves the loss unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

# Item 0 runs on identical weights, so its loss checks the forward; item k's loss also reads the
# weights after k optimizer steps, so a wrong backward or update shows on the next items. Beyond
# a few items the two copies' weights have drifted apart by rounding (training amplifies it), and
# a loss difference then measures that drift, not the candidate: only the first items are held to
# the tolerance, every item's loss must be finite where eager's is.
LOSS_CHECK_ITEMS = 8


class LossCheck:
    """``check(candidate_loss, eager_loss)`` for the replay, called once per item in order: it
    keeps both losses and is False where the rule above fails."""

    def __init__(self, tol: float, checked_items: int = LOSS_CHECK_ITEMS) -> None:
        self.tol = tol
        self.checked_items = checked_items
        self.losses: list[float] = []
        self.eager_losses: list[float] = []

    def __call__(self, out: Any, ref: Any) -> bool:
        i = len(self.losses)
        a, b = float(out), float(ref)
        self.losses.append(a)
        self.eager_losses.append(b)
        if not math.isfinite(a):
            return not math.isfinite(b)
        if i >= self.checked_items:
            return True
        return abs(a - b) <= self.tol * (1.0 + abs(b))

    def report(self) -> dict[str, Any]:
        def finite(xs: list[float]) -> list[float | None]:
            return [x if math.isfinite(x) else None for x in xs]  # JSON has no NaN

        return {
            "loss_per_item": finite(self.losses),
            "eager_loss_per_item": finite(self.eager_losses),
            "loss_checked_items": min(self.checked_items, len(self.losses)),
        }


def pad_refusal(workload: Any, dims: Mapping[Any, Mapping[int, str]]) -> str | None:
    """Why this workload's training inputs cannot be padded to buckets (None when they can): every
    input that follows a varying size needs a declared pad value."""
    pads = getattr(workload, "pad_values", None) or {}
    if not pads:
        return (
            f"workload {workload.name!r} declares no pad_values (the value that pads each input "
            "without changing the loss: 0 for an attention mask, the loss's ignore index for "
            "labels): padding its training inputs could change the loss"
        )
    missing = [k for k in dims if k not in pads]
    if missing:
        return (
            f"workload {workload.name!r} declares no pad value for input(s) {missing}, which "
            "follow the stream's varying sizes: padding them could change the loss"
        )
    return None


def item_sizes(x: Any, dims: Mapping[Any, Mapping[int, str]]) -> dict[str, int]:
    """The varying sizes of one item, read from its tensors' shapes."""
    out: dict[str, int] = {}
    for key, ds in dims.items():
        t = x[key]
        for d, name in ds.items():
            out[name] = int(t.shape[d])
    return out


def pad_item(
    x: Any,
    dims: Mapping[Any, Mapping[int, str]],
    target: Mapping[str, int],
    pad_values: Mapping[Any, float],
) -> Any:
    """``x`` with each varying dim padded up to ``target``, filled with the input's pad value;
    the real values keep their positions (the start of each padded dim)."""
    items = dict(x) if isinstance(x, dict) else dict(enumerate(x))
    for key, ds in dims.items():
        t = items[key]
        shape = list(t.shape)
        for d, name in ds.items():
            shape[d] = target[name]
        if list(t.shape) != shape:
            out = t.new_full(shape, pad_values[key])
            out[tuple(slice(0, n) for n in t.shape)] = t
            items[key] = out
    return items if isinstance(x, dict) else tuple(items[i] for i in range(len(x)))


def as_item_fn(fn: Callable[[Any], Any]) -> Callable[..., Any]:
    """``fn(inputs)`` called the way the replay calls a model: keywords for a dict item,
    positionals for a tuple one."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(kwargs if kwargs else args)

    return call


def keeping_buffers(model: Any, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` and put the model's buffers back as they were (batch norm running statistics
    move in a training forward): a warm-up or priming call must leave no trace in the model."""
    import torch

    saved = {k: b.detach().clone() for k, b in model.named_buffers()}
    try:
        return fn()
    finally:
        with torch.no_grad():
            for k, b in model.named_buffers():
                b.copy_(saved[k])
