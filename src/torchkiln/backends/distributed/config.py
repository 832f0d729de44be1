"""The distributed trial's options: ``--dist`` (the strategy that wraps the model) and
``--nproc`` (the ranks), checked before anything runs."""

from __future__ import annotations

from typing import Any

from torchkiln.errors import KilnUserError

STRATEGIES = ("ddp", "fsdp")


def check_dist(strategy: str | None, nproc: int | None, step: str) -> dict[str, Any] | None:
    """Validate ``--dist``/``--nproc``; returns the options a dist trial takes, or None."""
    if strategy is None:
        if nproc not in (None, 1):
            raise KilnUserError(f"--nproc {nproc} needs --dist; choose from {list(STRATEGIES)}")
        return None
    if strategy not in STRATEGIES:
        raise KilnUserError(f"--dist {strategy!r}; choose from {list(STRATEGIES)}")
    if step != "train":
        raise KilnUserError(f"--dist {strategy} wraps a training step: add --step train")
    nproc = 1 if nproc is None else nproc
    if nproc < 1:
        raise KilnUserError(f"--nproc {nproc}; it must be at least 1")
    return {"nproc": nproc, "strategy": strategy}
