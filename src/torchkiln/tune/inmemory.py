"""Handing an in-memory model to trial processes: saved with torch.save, loaded by the worker
through the factory below (the path travels in KILN_INMEMORY_PATH)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

ENV = "KILN_INMEMORY_PATH"
SPEC = "torchkiln.tune.inmemory:load"


def save(model: Any, example_inputs: Any, path: Path, **workload_fields: Any) -> str | None:
    """Save for the workers; returns why it cannot be done (None when it can)."""
    import torch

    if type(model).__module__ == "__main__":
        return (
            f"{type(model).__name__} is defined in __main__, which a trial process cannot "
            "import; define it in a module to get isolated trials"
        )
    try:
        torch.save({"model": model, "inputs": example_inputs, **workload_fields}, path)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        return f"the model cannot be serialised for a trial process: {exc}"
    return None


def load(preset: str = "full", batch_size: int | None = None, step: str = "infer"):
    import torch

    from torchkiln.workloads import Workload

    path = os.environ.get(ENV)
    if not path:
        raise RuntimeError(f"{ENV} is not set: this factory is for kiln's own trial processes")
    data = torch.load(path, weights_only=False)  # our own file, written by save() above
    return Workload(
        model=data["model"],
        example_inputs=data["inputs"],
        name="in-memory model",
        step=step,
        targets=data.get("targets"),
    )
