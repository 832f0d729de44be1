"""Reading a results file (a tune's results.json, a bench's JSON) for `kiln report` and
`kiln compare`: a file that is not one ends in one line naming the file and what is wrong,
not in a traceback from deep inside the renderer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torchkiln.errors import KilnUserError


class BadResultFile(KilnUserError):
    """A results file kiln cannot read; the message names the file and what is wrong."""


def _kind(x: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(x), "null" if x is None else "a number"
    )


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_trial(i: int, t: Any) -> str | None:
    if not isinstance(t, dict):
        return f"trials[{i}] is {_kind(t)}, not an object"
    if not isinstance(t.get("variant"), str):
        return f"trials[{i}] has no variant name"
    ms = t.get("steady_ms")
    if ms is not None:
        ci = ms.get("ci95") if isinstance(ms, dict) else None
        if not (
            isinstance(ms, dict)
            and _number(ms.get("median"))
            and isinstance(ci, list)
            and len(ci) == 2
            and all(_number(c) for c in ci)
        ):
            return f"trials[{i}] ({t['variant']}): steady_ms is not {{median, ci95: [lo, hi]}}"
    return None


# What rendering a tune's report reads at the top level, with the type it needs.
TUNE_KEYS = {"workload": str, "step": str, "device": str, "budget_s": float, "wall_s": float}


def problem(doc: Any, need_workload: bool) -> str | None:
    """What makes ``doc`` unreadable as a kiln result, or None."""
    if not isinstance(doc, dict):
        return f"holds {_kind(doc)}, not a kiln result object"
    trials = doc.get("trials")
    if trials is None:
        return "has no trials: not a kiln bench or tune result"
    if not isinstance(trials, list):
        return f"its trials are {_kind(trials)}, not a list"
    for i, t in enumerate(trials):
        why = _check_trial(i, t)
        if why:
            return why
    if need_workload:
        for key, want in TUNE_KEYS.items():
            value = doc.get(key)
            ok = _number(value) if want is float else isinstance(value, want)
            if not ok:
                got = "missing" if key not in doc else f"{_kind(value)}"
                return f"{key} is {got}: not a kiln tune result"
        for i, t in enumerate(trials):
            if not isinstance(t.get("status"), str):
                return f"trials[{i}] ({t['variant']}) has no status"
    return None


def load_result(path: str | Path, need_workload: bool = True) -> dict[str, Any]:
    """The parsed file, or BadResultFile naming it and what is wrong. ``need_workload``: a
    tune's result (the report needs its workload, step, device and budget)."""
    p = Path(path)
    if not p.exists():
        raise BadResultFile(f"{str(p)!r} does not exist")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadResultFile(f"{str(p)!r}: cannot be read: {exc}") from exc
    try:
        doc = json.loads(text)
    except ValueError as exc:
        what = "empty" if not text.strip() else f"not JSON (truncated?): {exc}"
        raise BadResultFile(f"{str(p)!r}: {what}") from exc
    why = problem(doc, need_workload)
    if why:
        raise BadResultFile(f"{str(p)!r}: {why}")
    return doc
