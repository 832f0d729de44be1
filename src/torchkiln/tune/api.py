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
from torchkiln.durations import parse_budget  # noqa: F401  (tune.api.parse_budget, as before)
from torchkiln.errors import KilnUserError
from torchkiln.repair.plan import check_mode as check_fix_mode
from torchkiln.tune import inmemory, recommend


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

    def __repr__(self) -> str:
        # The whole document is tens of kB: a notebook cell shows this line instead.
        return f"TuneResult({self._summary()}, report={str(self.report_path)!r})"

    def _summary(self) -> str:
        d = self.doc
        head = f"{d.get('workload')!r} {d.get('step')} on {d.get('device')}"
        trials = len(d.get("trials") or [])
        best = next((t for t in d.get("trials") or [] if t.get("variant") == self.best), None)
        if best is None:
            return f"{head}: no variant passed, {trials} trials"
        baseline = (d.get("trials") or [{}])[0].get("variant")
        # The baseline's speedup over itself is noise, not a gain.
        sp = (best.get("speedup") or {}) if self.best != baseline else {}
        gain = (
            f" {sp['median']:.2f}x [{sp['ci95'][0]:.2f}, {sp['ci95'][1]:.2f}] over eager"
            if sp.get("median") and sp.get("ci95")
            else ""
        )
        return f"{head}: best {self.best!r}{gain}, {trials} trials"

    def _repr_html_(self) -> str:
        """A notebook's view: the pick, why, the code, and the report's path."""
        from html import escape

        rec = self.doc.get("recommendation") or {}
        sel = self.doc.get("selection") or {}
        why = "".join(f"<li>{escape(w)}</li>" for w in rec.get("why") or [])
        code = f"<pre>{escape(rec['code'])}</pre>" if rec.get("code") else ""
        return (
            f"<div><b>kiln tune</b>: {escape(self._summary())}<br>"
            f"<i>{escape(sel.get('reason') or '')}</i><ul>{why}</ul>{code}"
            f"report: <code>{escape(str(self.report_path))}</code></div>"
        )

    def apply(self, model: Any) -> Any:
        """The model with the chosen variant applied, ready to call, in the mode the trials
        measured (an inference tune: eval mode, calls under no_grad)."""
        if self.best is None:
            raise KilnUserError("no variant passed, so there is nothing to apply")
        from torchkiln.repair.remedies import Remedies

        remedies = Remedies.of((self.doc.get("recommendation") or {}).get("fixes"))
        if remedies.patch:
            warnings.warn(
                f"the pick {self.best!r} was measured on the model's source with "
                f"{self.out / remedies.patch} applied: apply that patch to the model's code (the "
                "configuration remedies are applied here, the source is yours)",
                stacklevel=2,
            )
        return recommend.apply(
            model, self.best, self.doc["device"], self.doc.get("step"), remedies=remedies
        )


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
    history: str | Path | bool | None = None,
    fix: str = "code",
    stream: str | Path | None = None,
    stream_len: int | None = None,
    variants: list[str] | None = None,
    **overrides: Any,
) -> TuneResult:
    """Tune a workload spec (str), a factory function, or an in-memory model + example inputs.

    An in-memory model is handed to each trial process with torch.save; where that cannot work
    (a class defined in __main__, an unpicklable model) trials run in this process instead,
    with a warning: no isolation from crashes, and Dynamo's caches are shared between trials.
    ``history``: the store the result is appended to (None: the default, False: none).

    ``fix`` (none, config or code) says which remedies for the model's graph breaks are measured
    as candidates: code (the default) both source rewrites of a copy and configuration; config
    only Dynamo settings; none neither. A model without a source file gets configuration only.

    ``budget`` and ``preset`` default as `kiln tune`'s do (torchkiln.defaults: 15 minutes and
    the full preset on a GPU, 4 minutes and the tiny preset on the CPU).

    ``stream`` (a JSONL trace of sizes) or ``stream_len`` (items of the workload's default
    stream) tunes on a stream of varying shapes instead of one fixed input (docs/streams.md);
    it takes a workload spec (a str), whose Workload makes inputs from sizes.

    ``variants`` (specs, e.g. ``["inductor+bf16", "inductor:mode=max-autotune+bf16"]``)
    replaces the search's plan: exactly those are measured, in that order, without the profile
    and explain stages or refinements; the head-to-head and the selection run as usual."""
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
        history=history,
        fix=check_fix_mode(fix),
    )
    if variants is not None:
        kwargs["variants"] = list(variants)
    if stream is not None or stream_len is not None:
        if not isinstance(model_or_factory, str):
            raise KilnUserError(
                "a stream tune takes a workload spec (a name, file.py:factory or "
                "pkg.module:factory) whose Workload has make_inputs"
            )
        kwargs.update(stream=None if stream is None else str(stream), stream_len=stream_len)
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
        name = type(model).__name__
        return TuneResult(_in_process(lambda: (copy.deepcopy(model), inputs), kwargs, name), out)
    if callable(model_or_factory):
        spec = _factory_spec(model_or_factory)
        if spec is not None:
            return TuneResult(run_pipeline(spec, **kwargs), out)
        warnings.warn(
            "the factory is not importable by a trial process (defined in __main__ "
            "or locally); running trials in this process",
            stacklevel=2,
        )
        name = getattr(model_or_factory, "__name__", None) or type(model_or_factory).__name__
        return TuneResult(_in_process(model_or_factory, kwargs, name), out)
    raise KilnUserError(
        f"tune() takes a workload name, a factory or an nn.Module, not "
        f"{type(model_or_factory).__name__}"
    )


def _in_process(factory: Any, kwargs: dict[str, Any], name: str) -> dict[str, Any]:
    """Run the tune here, the workload registered for its length under ``name`` (the model's
    class, or the factory's name: what the report's title shows), kept apart from any
    registered workload of that name."""
    from torchkiln.tune.pipeline import tune as run_pipeline
    from torchkiln.workloads.base import _REGISTRY, register_workload, registry

    name = re.sub(r"[^\w.\-]+", "_", name) or "model"
    if name in registry():
        name = f"{name}-in-process"
    _REGISTRY.pop(name, None)
    register_workload(name, description="in-process model")(factory)
    try:
        return run_pipeline(name, in_process=True, **kwargs)
    finally:
        # Not a workload of the caller's: gone from the registry (and from `kiln workloads`,
        # and every unknown-workload message) once the tune ends.
        _REGISTRY.pop(name, None)
