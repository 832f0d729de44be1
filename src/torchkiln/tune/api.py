"""`torchkiln.tune(model_or_factory, example_inputs, ...)`: the Python face of `kiln tune`."""

from __future__ import annotations

import copy
import hashlib
import os
import re
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchkiln import defaults
from torchkiln.errors import KilnUserError
from torchkiln.tune import inmemory, recommend


def parse_budget(text: str | float | int) -> float:
    """'15m', '90s', '1h', '1h30m' or a number of seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    parts = re.fullmatch(
        r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text
    )
    if not text.strip() or parts is None or not any(parts.groups()):
        raise KilnUserError(f"budget {text!r}: write it like 15m, 90s, 1h30m or 600")
    h, m, s = (float(g) if g else 0.0 for g in parts.groups())
    return h * 3600 + m * 60 + s


@dataclass
class TuneResult:
    doc: dict[str, Any]
    out: Path

    @property
    def best(self) -> str | None:
        return (self.doc.get("selection") or {}).get("best")

    @property
    def report_path(self) -> Path:
        return self.out / "report.html"

    def apply(self, model: Any) -> Any:
        """The model with the chosen variant applied, ready to call."""
        if self.best is None:
            raise KilnUserError("no variant passed, so there is nothing to apply")
        return recommend.apply(model, self.best, self.doc["device"])


def _factory_spec(factory: Any) -> str | None:
    mod = getattr(factory, "__module__", None)
    qual = getattr(factory, "__qualname__", "")
    if not mod or mod == "__main__" or "<" in qual:
        return None
    return f"{mod}:{qual}"


def tune(
    model_or_factory: Any = "simple",
    example_inputs: Any = None,
    *,
    step: str = "infer",
    device: str | None = None,
    budget: str | float = defaults.BUDGET,
    steps: int | None = None,
    allow_precision: tuple[str, ...] | list[str] = (),
    preset: str = defaults.PRESET,
    out: str | Path | None = None,
    **overrides: Any,
) -> TuneResult:
    """Tune a workload spec (str), a factory function, or an in-memory model + example inputs.

    An in-memory model is handed to each trial process with torch.save; where that cannot work
    (a class defined in __main__, an unpicklable model) trials run in this process instead,
    with a warning: no isolation from crashes, and Dynamo's caches are shared between trials.
    ``budget`` and ``preset`` default as `kiln tune`'s do (torchkiln.defaults: 15 minutes and
    the full preset on a GPU, 4 minutes and the tiny preset on the CPU)."""
    import torch

    from torchkiln.tune.pipeline import tune as run_pipeline

    device = defaults.device(device)
    out = Path(out or Path("kiln-runs") / f"tune-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    kwargs = dict(
        step=step,
        device=device,
        preset=defaults.preset(preset, device),
        budget_s=parse_budget(defaults.budget(budget, device)),
        steps=steps,
        allow_precision=set(allow_precision),
        out=out,
        spec_overrides=overrides or None,
    )
    if isinstance(model_or_factory, str):
        return TuneResult(run_pipeline(model_or_factory, **kwargs), out)
    if isinstance(model_or_factory, torch.nn.Module):
        if example_inputs is None:
            raise KilnUserError("an in-memory model needs example_inputs")
        why = inmemory.save(model_or_factory, example_inputs, out / "inmemory.pt")
        if why is None:
            os.environ[inmemory.ENV] = str((out / "inmemory.pt").resolve())
            # Every in-memory model has the same workload spec: its bytes tell them apart, so
            # a later tune into this directory reuses no trial of another model.
            digest = hashlib.sha256((out / "inmemory.pt").read_bytes()).hexdigest()
            extra = {**overrides.get("extra", {}), "model_sha256": digest}
            kwargs["spec_overrides"] = {**overrides, "extra": extra}
            return TuneResult(run_pipeline(inmemory.SPEC, **kwargs), out)
        warnings.warn(f"{why}; running trials in this process (no crash isolation)", stacklevel=2)
        model, inputs = model_or_factory, example_inputs
        return TuneResult(_in_process(lambda: (copy.deepcopy(model), inputs), kwargs), out)
    if callable(model_or_factory):
        spec = _factory_spec(model_or_factory)
        if spec is not None:
            return TuneResult(run_pipeline(spec, **kwargs), out)
        warnings.warn(
            "the factory is not importable by a trial process (defined in __main__ "
            "or locally); running trials in this process",
            stacklevel=2,
        )
        return TuneResult(_in_process(model_or_factory, kwargs), out)
    raise KilnUserError(
        f"tune() takes a workload name, a factory or an nn.Module, not "
        f"{type(model_or_factory).__name__}"
    )


def _in_process(factory: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    from torchkiln.tune.pipeline import tune as run_pipeline
    from torchkiln.workloads.base import _REGISTRY, register_workload

    name = "__kiln_in_process__"
    _REGISTRY.pop(name, None)
    register_workload(name, description="in-process model")(factory)
    try:
        return run_pipeline(name, in_process=True, **kwargs)
    finally:
        # Not a workload of the caller's: gone from the registry (and from `kiln workloads`,
        # and every unknown-workload message) once the tune ends.
        _REGISTRY.pop(name, None)
