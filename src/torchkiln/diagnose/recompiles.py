"""Recompilations and CUDA-graph skips: what happened, why, and what to change."""

from __future__ import annotations

import re
from typing import Any

# "0/1: tensor 'x' size mismatch at index 0. expected 2, actual 3" (compile id, then the guard).
_GUARD = re.compile(r"^\s*(?P<cid>\[?\d+/\d+\]?):\s*(?P<text>.*)$", re.S)
_LIMIT = re.compile(r"hit config\.(?P<name>\w+) \((?P<value>\d+)\)")
_FUNCTION = re.compile(r"function: '(?P<func>[^']+)' \((?P<loc>[^)]+)\)")
# "tensor 'x' size mismatch at index 1. expected 5, actual 9": the input and dim that changed.
# The input's name may hold quotes of its own: "tensor 'kwargs['input_ids']' size mismatch".
_SIZE = re.compile(r"tensor '(?P<input>.+?)' size mismatch at index (?P<dim>\d+)")
# the name a user's code has for it: the last subscript of L['x'] or kwargs['input_ids']
_NAME = re.compile(r"\[['\"](?P<name>[^'\"]+)['\"]\]$")
_VALUES = re.compile(r"\.?\s*expected \S+, actual \S+")

_GUARD_FIXES = (
    (
        "size mismatch",
        "Mark the varying dimension dynamic before the first call "
        "(`torch._dynamo.mark_dynamic(x, 0)`) or compile with `dynamic=True`; to keep static "
        "kernels, pad inputs to a few fixed sizes (kiln serve's bucketing does this).",
    ),
    (
        "stride mismatch",
        "Pass inputs with one memory layout (e.g. `.contiguous()` or always channels_last).",
    ),
    (
        "dtype mismatch",
        "Cast inputs to one dtype before the compiled call.",
    ),
    (
        "device mismatch",
        "Move every input to one device before the compiled call.",
    ),
    (
        "requires_grad mismatch",
        "Call the compiled function under one grad mode (always `torch.no_grad()` or never).",
    ),
    (
        "id_match",
        "An object's identity is guarded: create it once outside the loop instead of per call.",
    ),
    (
        "___check_obj_id",
        "An object's identity is guarded: create it once outside the loop instead of per call.",
    ),
)


def input_name(guarded: str) -> str:
    """``input_ids`` for Dynamo's ``kwargs['input_ids']``, ``x`` for ``L['x']``; the guarded
    source as it is where it has no such subscript (an attribute, say)."""
    m = _NAME.search(guarded)
    return m.group("name") if m else guarded


def _fix_for(guard: str) -> str:
    size = _SIZE.search(guard)
    if size:
        name, dim = input_name(size.group("input")), size.group("dim")
        call = f"torch._dynamo.mark_dynamic({name}, {dim})" if name.isidentifier() else None
        how = f" (`{call}`)" if call else ""
        return (
            f"Mark dim {dim} of `{name}` dynamic before the first call{how} or compile with "
            "`dynamic=True`; to keep static kernels, pad inputs to a few fixed sizes (kiln "
            "serve's bucketing does this)."
        )
    lowered = guard.lower()
    for needle, fix in _GUARD_FIXES:
        if needle.lower() in lowered:
            return fix
    return "Keep the guarded value constant across calls, or pass it as a tensor so it is traced."


def _split_guard(guard: str) -> tuple[str | None, str]:
    """("0/1", "tensor 'x' size mismatch ...") from one of Dynamo's guard failure strings."""
    first = guard.split("\n", 1)[0]
    m = _GUARD.match(first)
    return (m.group("cid"), m.group("text").strip()) if m else (None, first.strip())


def summarize(
    source: str, steps: list[dict[str, Any]], limit_warnings: list[str], limit: int
) -> dict[str, Any]:
    """Turn the per-input guard failures into recompilation records plus a limit warning."""
    recompilations = []
    for step in steps:
        # Dynamo computes the guard failure before it checks the limit: on the step that hit
        # the limit, a failure with no new graph is a call that fell back to eager.
        refused = bool(step.get("limit_hit")) and step.get("graphs_compiled", 0) == 0
        for failure in step["guard_failures"]:
            parsed = [_split_guard(g) for g in failure["guards"]]
            reasons = [text for _, text in parsed]
            recompilations.append(
                {
                    "trigger": step["label"],
                    "function": failure["function"],
                    "file": failure["file"],
                    "line": failure["line"],
                    "compile_id": parsed[0][0] if parsed else None,
                    "reason": reasons[0] if reasons else "",
                    "reasons": reasons,
                    "fell_back_to_eager": refused,
                    "fix": _fix_for(" ".join(reasons)),
                }
            )
    limit_hits = []
    for msg in dict.fromkeys(limit_warnings):
        lm, fm = _LIMIT.search(msg), _FUNCTION.search(msg)
        limit_hits.append(
            {
                "limit_name": lm.group("name") if lm else "recompile_limit",
                "limit": int(lm.group("value")) if lm else limit,
                "function": fm.group("func") if fm else None,
                "location": fm.group("loc") if fm else None,
                "message": msg.split("\n", 1)[0],
            }
        )
    warning = None
    by_guard = guards_summary(recompilations)
    if limit_hits:
        where = ", ".join(sorted({h["function"] or "?" for h in limit_hits}))
        first = next((s["label"] for s in steps if s.get("limit_hit")), None)
        when = f" at {first}" if first else ""
        warning = (
            f"Dynamo hit its recompile limit ({limit_hits[0]['limit']}) for {where}{when}: from "
            "then on those calls run in eager, silently. Mark the varying dimension dynamic or "
            "bucket the shapes."
        )
    return {
        "source": source,
        "steps": steps,
        "count": sum(not r["fell_back_to_eager"] for r in recompilations),
        "fallbacks": sum(r["fell_back_to_eager"] for r in recompilations),
        "recompilations": recompilations,
        "by_guard": by_guard,
        "limit": limit,
        "limit_hit": bool(limit_hits),
        "limit_hits": limit_hits,
        "warning": warning,
    }


def guards_summary(recompilations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The recompilations grouped by the guard that failed, its sizes left out (one entry for
    every "size mismatch at index 1"): ``function``, ``guard``, the ``input`` (its name in the
    user's call: ``input_ids`` for ``kwargs['input_ids']``) and ``dim`` of a size guard (else
    null), ``count`` and the ``fell_back_to_eager`` among them. Most first."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for r in recompilations:
        guard = _VALUES.sub("", r["reason"]).strip()
        m = _SIZE.search(r["reason"])
        g = groups.setdefault(
            (r["function"], guard),
            {
                "function": r["function"],
                "guard": guard,
                "input": input_name(m.group("input")) if m else None,
                "dim": int(m.group("dim")) if m else None,
                "count": 0,
                "fell_back_to_eager": 0,
            },
        )
        g["count"] += 1
        g["fell_back_to_eager"] += int(r["fell_back_to_eager"])
    return sorted(groups.values(), key=lambda g: -g["count"])


# "skipping cudagraphs due to <reason>": reason keyword -> (kind, fix).
_CUDAGRAPH_KINDS = (
    ("cpu device", "cpu-tensors", "Move every input and buffer to the GPU before the call."),
    ("non gpu", "cpu-tensors", "Move every input and buffer to the GPU before the call."),
    (
        "mutated inputs",
        "mutated-inputs",
        "Do not mutate graph inputs in place (return the new value instead), or copy them first.",
    ),
    (
        "mutation",
        "mutated-inputs",
        "Do not mutate graph inputs in place (return the new value instead), or copy them first.",
    ),
    (
        "dynamic shape",
        "dynamic-shapes",
        "Compile with static shapes (`dynamic=False`) and bucket the input sizes.",
    ),
    (
        "incompatible op",
        "incompatible-op",
        "The named op cannot be captured in a CUDA graph; move it out of the compiled region.",
    ),
    ("cpu", "cpu-tensors", "Move every input and buffer to the GPU before the call."),
)


def classify_cudagraph_skip(message: str) -> dict[str, str]:
    text = message.split("skipping cudagraphs due to", 1)[-1].strip()
    first = text.split("\n", 1)[0]
    for needle, kind, fix in _CUDAGRAPH_KINDS:
        if needle in first.lower():
            return {"kind": kind, "reason": text, "fix": fix}
    return {
        "kind": "other",
        "reason": text,
        "fix": "See the reason; CUDA graphs need static "
        "shapes, GPU-only tensors and no input mutation.",
    }
