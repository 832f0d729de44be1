"""The AOTInductor route: torch.export of the model, the package, and, where export fails, the
reason in plain words with its remedy (as `kiln explain` does for a graph break)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

DYNAMIC_CACHE_REASON = (
    "the model's output holds a key/value cache object (a Hugging Face DynamicCache) that "
    "torch.export cannot flatten"
)
# (pattern in the exception's text, reason, remedy). First match wins.
EXPORT_FAILURES: tuple[tuple[str, str, str], ...] = (
    (
        r"DynamicCache|Cache.*(pytree|flatten)|not a pytree|pytree.*Cache",
        DYNAMIC_CACHE_REASON,
        "model.config.use_cache = False before shipping (a decoder then returns logits only)",
    ),
    (
        r"Constraints violated|specialized|guard.*Dim|Dim\(",
        "a dimension the run varied is fixed by the model's code (export specialised it to "
        "one value)",
        "give that dimension a torch.export.Dim range that the code allows, or ship the "
        "buckets the model serves as fixed shapes",
    ),
    (
        r"data.dependent|GuardOnDataDependentSymNode|Could not guard on data-dependent",
        "the model branches on a tensor's value, which export cannot trace",
        "replace the branch with torch.where or torch.cond",
    ),
    (
        r"Unsupported|graph break|torch._dynamo.exc",
        "the model's code has a construct torch.export cannot capture in one graph",
        "run `kiln explain` on the workload: each graph break it lists must be removed",
    ),
)


def diagnose(exc: BaseException) -> dict[str, str]:
    """Why export failed and what to do, in plain words; the first line of the error kept."""
    text = f"{type(exc).__name__}: {exc}"
    first = text.strip().splitlines()[0][:300] if text.strip() else type(exc).__name__
    for pattern, reason, remedy in EXPORT_FAILURES:
        if re.search(pattern, text, re.IGNORECASE | re.DOTALL):
            return {"reason": reason, "remedy": remedy, "error": first}
    return {
        "reason": "torch.export could not capture the model",
        "remedy": "see the error; the compile-cache route serves the model meanwhile",
        "error": first,
    }


def _leaves(inputs: Any) -> list[Any]:
    if isinstance(inputs, dict):
        return [x for v in inputs.values() for x in _leaves(v)]
    if isinstance(inputs, (tuple, list)):
        return [x for v in inputs for x in _leaves(v)]
    return [inputs]


def varying_dims(shape_sets: list[list[list[int]]]) -> dict[int, dict[int, tuple[int, int]]]:
    """For each tensor input (by position among the leaves), the dims whose size varied over the
    shapes the pick serves, with their (min, max)."""
    out: dict[int, dict[int, tuple[int, int]]] = {}
    if len(shape_sets) < 2:
        return out
    for i, first in enumerate(shape_sets[0]):
        for d in range(len(first)):
            sizes = [s[i][d] for s in shape_sets if i < len(s) and d < len(s[i])]
            if len(set(sizes)) > 1:
                out.setdefault(i, {})[d] = (min(sizes), max(sizes))
    return out


def dynamic_shapes(inputs: Any, ranges: dict[int, dict[int, tuple[int, int]]]) -> Any:
    """torch.export's dynamic_shapes for ``inputs`` (a tuple of args or a dict of kwargs), with a
    Dim for each dim that varied. A size-1 lower bound is lifted to 2: export specialises 0 and
    1, so a range starting at 1 would fail for a reason the user did not cause."""
    if not ranges:
        return None
    from torch.export import Dim

    dims: dict[tuple[int, int], Any] = {}
    for i, per in ranges.items():
        for d, (lo, hi) in per.items():
            dims[(i, d)] = Dim(f"in{i}_d{d}", min=max(2, lo), max=max(hi, max(2, lo) + 1))
    leaf = iter(range(10**6))

    def spec(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {k: spec(v) for k, v in obj.items()}
        if isinstance(obj, (tuple, list)):
            return tuple(spec(v) for v in obj)
        i = next(leaf)
        return {d: dims[(i, d)] for d in range(getattr(obj, "dim", lambda: 0)()) if (i, d) in dims}

    return spec(inputs)


def build_package(
    model: Any,
    inputs: Any,
    shape_sets: list[list[list[int]]],
    path: Path,
    autocast: Any,
) -> tuple[dict[str, Any] | None, dict[str, str] | None]:
    """Export ``model`` on ``inputs`` and compile it to an AOTInductor package at ``path``.
    Returns (what was built, None) or (None, the diagnosis)."""
    import torch

    compile_pkg = getattr(torch._inductor, "aoti_compile_and_package", None)
    if compile_pkg is None:
        return None, {
            "reason": f"torch {torch.__version__} has no torch._inductor.aoti_compile_and_package",
            "remedy": "use torch 2.6 or later for the AOTInductor route",
            "error": "",
        }
    args, kwargs = (tuple(), dict(inputs)) if isinstance(inputs, dict) else (tuple(inputs), {})
    ranges = varying_dims(shape_sets)
    try:
        with torch.no_grad(), autocast():
            ep = torch.export.export(
                model, args, kwargs or None, dynamic_shapes=dynamic_shapes(inputs, ranges)
            )
            compile_pkg(ep, package_path=str(path))
    except Exception as exc:  # noqa: BLE001  (an export failure is diagnosed, not fatal)
        return None, diagnose(exc)
    return {
        "dynamic": {str(i): {str(d): list(r) for d, r in per.items()} for i, per in ranges.items()}
    }, None
