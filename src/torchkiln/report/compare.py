"""`kiln compare OLD NEW`: did any variant get slower? For CI: exit 1 on a regression beyond
the threshold whose intervals do not overlap (noise never fails a build)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torchkiln.errors import KilnUserError


def _load(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        p = p / "results.json" if (p / "results.json").exists() else p / "bench.json"
    if not p.exists():
        raise KilnUserError(f"{str(p)!r} does not exist")
    try:
        doc = json.loads(p.read_text())
    except ValueError as exc:
        raise KilnUserError(f"{str(p)!r} is not JSON: {exc}") from exc
    if "trials" not in doc:
        raise KilnUserError(f"{str(p)!r} has no trials: not a kiln bench or tune result")
    return doc


def compare(old: dict[str, Any], new: dict[str, Any], threshold: float = 0.05) -> list[dict]:
    """One row per variant present and measured in both files."""
    before = {t["variant"]: t for t in old["trials"] if t.get("steady_ms")}
    rows = []
    for t in new["trials"]:
        o = before.get(t["variant"])
        if o is None or not t.get("steady_ms"):
            continue
        om, nm = o["steady_ms"], t["steady_ms"]
        ratio = nm["median"] / om["median"]
        if ratio > 1 + threshold and nm["ci95"][0] > om["ci95"][1]:
            verdict = "regression"
        elif ratio < 1 - threshold and nm["ci95"][1] < om["ci95"][0]:
            verdict = "improvement"
        else:
            verdict = "no significant change"
        rows.append(
            {
                "variant": t["variant"],
                "old_ms": om["median"],
                "old_ci95": om["ci95"],
                "new_ms": nm["median"],
                "new_ci95": nm["ci95"],
                "ratio": ratio,
                "verdict": verdict,
            }
        )
    return rows


def run_compare(old_path: str, new_path: str, threshold: float) -> tuple[int, list[dict]]:
    rows = compare(_load(old_path), _load(new_path), threshold)
    if not rows:
        raise KilnUserError("the two files share no measured variant")
    return (1 if any(r["verdict"] == "regression" for r in rows) else 0), rows
