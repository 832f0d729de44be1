"""Resolve a workload spec: a registered name, ``file.py:factory`` or ``pkg.mod:factory``."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from torchkiln.errors import KilnUserError
from torchkiln.workloads.base import PRESETS, STEP_KINDS, Workload, call_factory, registry


class WorkloadSpecError(KilnUserError):
    """The spec names no workload, its file is missing, or its factory raised."""


def _import_factory(spec: str):
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise WorkloadSpecError(f"workload spec {spec!r} must look like 'file.py:factory'")
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise WorkloadSpecError(f"workload file {str(path)!r} does not exist")
        # Named by a digest of the path, the same in every process: a compiled artifact that
        # names the module (a precompiled forward's guards and code) loads in another process.
        digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]
        mod_name = f"kiln_user_{digest}"
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        if module_spec is None or module_spec.loader is None:
            raise WorkloadSpecError(f"cannot import {str(path)!r} as a Python file")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[mod_name] = module
        # As `python file.py` would: the file's directory first, for the files it imports.
        here = str(path.resolve().parent)
        sys.path.insert(0, here)
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:  # noqa: BLE001  (every failure becomes a reported status)
            raise WorkloadSpecError(
                f"importing {str(path)!r} raised {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            sys.path.remove(here)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise WorkloadSpecError(f"cannot import module {target!r}: {exc}") from exc
    if not hasattr(module, attr):
        raise WorkloadSpecError(f"{target!r} has no attribute {attr!r}")
    return getattr(module, attr)


def _coerce(result: Any, spec: str, step: str) -> Workload:
    if isinstance(result, Workload):
        return result
    if isinstance(result, tuple) and len(result) == 2:
        model, inputs = result
        return Workload(model=model, example_inputs=inputs, name=spec, step=step)
    raise WorkloadSpecError(
        f"factory {spec!r} returned {type(result).__name__}; "
        "return a torchkiln.Workload or a (model, example_inputs) tuple"
    )


def load_workload(
    spec: str,
    *,
    preset: str = "full",
    batch_size: int | None = None,
    step: str | None = None,
) -> Workload:
    """Build a Workload from its spec; the step kind given here overrides the factory's."""
    if preset not in PRESETS:
        raise WorkloadSpecError(f"preset={preset!r}; choose from {list(PRESETS)}")
    if step is not None and step not in STEP_KINDS:
        raise WorkloadSpecError(f"step={step!r}; choose from {list(STEP_KINDS)}")
    entries = registry()
    if spec in entries:
        factory = entries[spec].factory
        name = spec
    elif ":" in spec:
        factory = _import_factory(spec)
        name = spec
    else:
        raise WorkloadSpecError(
            f"unknown workload {spec!r}; choose from {sorted(entries)} "
            "or give 'path/to/file.py:factory' or 'pkg.module:factory'"
        )
    try:
        result = call_factory(factory, preset=preset, batch_size=batch_size, step=step)
    except KilnUserError:
        raise
    except Exception as exc:  # noqa: BLE001  (every failure becomes a reported status)
        raise WorkloadSpecError(
            f"workload factory {spec!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    workload = _coerce(result, name, step or "infer")
    if step is not None:
        workload.step = step
    if workload.name in ("custom", ""):
        workload.name = name
    return workload
