"""A remedied arm inside a trial process: the workload built from the rewritten copy with the
unmodified model's weights and inputs, the configuration remedies around each compiled call,
untraceable helpers disabled for Dynamo."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from torchkiln.errors import KilnUserError
from torchkiln.repair import config as cfg
from torchkiln.repair.plan import load_plan, resolve

PLAN_KEY = "repair_plan"  # TrialSpec.extra: the path of the tune's plan.json


def _plan(spec: Any) -> dict[str, Any]:
    path = (spec.extra or {}).get(PLAN_KEY)
    if not path:
        raise KilnUserError("a fix= variant needs a repair plan: run it through kiln tune")
    return load_plan(path)


def load_patched(code: str, plan: dict[str, Any], **kwargs: Any) -> Any:
    """The workload from the rewritten copy ``code`` of ``plan``."""
    from torchkiln.repair.loader import import_file
    from torchkiln.workloads.base import call_factory
    from torchkiln.workloads.loader import _coerce

    copy = plan["code"][code]
    module = import_file(copy["entry"], copy["dir"])
    factory = getattr(module, copy["factory"], None)
    if factory is None:
        raise KilnUserError(f"the rewritten copy {copy['entry']} has no {copy['factory']!r}")
    return _coerce(call_factory(factory, **kwargs), plan["workload"], kwargs.get("step") or "infer")


def load_for(spec: Any, variant: Any, load: Callable[[], Any]) -> tuple[Any, list[str]]:
    """(the workload for this arm, the configuration remedies to apply around its calls).
    ``load`` builds the unmodified workload (seeded by the caller)."""
    fixes = getattr(variant, "fixes", ())
    original = load()
    if not fixes:
        return original, []
    plan = _plan(spec)
    code, names = resolve(plan, fixes)
    workload = original
    if code is not None:
        from torchkiln.runner.protocol.settings import seed_everything

        seed_everything(spec.seed)
        workload = load_patched(
            code, plan, preset=spec.preset, batch_size=spec.batch_size, step=spec.step
        )
        # Same weights as the unmodified model (the correctness reference), same inputs.
        workload.model.load_state_dict(original.model.state_dict())
        workload.example_inputs = original.example_inputs
        workload.targets = original.targets
        workload.step = original.step
    if "disable" in names:
        disable_helpers(workload.model, [h["function"] for h in plan.get("helpers", [])])
    return workload, names


def disable_helpers(model: Any, names: list[str]) -> int:
    """Replace each named module-level function, where the model's forward methods see it
    (as a global or through an imported module), with torch.compiler.disable of it."""
    import types

    import torch

    done = 0
    seen: set[int] = set()
    for m in model.modules():
        fwd = getattr(type(m), "forward", None)
        glb = getattr(fwd, "__globals__", None)
        if glb is None or id(glb) in seen:
            continue
        seen.add(id(glb))
        here = os.path.dirname(os.path.abspath(glb.get("__file__") or "."))
        spaces = [glb] + [
            vars(v)
            for v in glb.values()
            if isinstance(v, types.ModuleType)
            and os.path.dirname(os.path.abspath(getattr(v, "__file__", None) or "/")) == here
        ]
        for space in spaces:
            for name in names:
                fn = space.get(name)
                # Wrapped once: the remedy is applied where the model is built and again where
                # it is loaded, in the same process.
                if isinstance(fn, types.FunctionType) and not getattr(
                    fn, "_torchdynamo_disable", False
                ):
                    space[name] = torch.compiler.disable(fn)
                    done += 1
    return done


@contextlib.contextmanager
def around_calls(names: list[str]) -> Iterator[None]:
    with cfg.patched([n for n in names if n not in ("disable", "dynamic")]):
        yield


def mark_inputs_dynamic(inputs: Any, names: list[str]) -> None:
    if "dynamic" not in names:
        return
    import torch

    leaves = inputs.values() if isinstance(inputs, dict) else inputs
    for t in leaves:
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            torch._dynamo.mark_dynamic(t, 0)
