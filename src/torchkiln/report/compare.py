"""`kiln compare OLD NEW`: did any variant get slower? For CI: exit 1 on a regression beyond
the threshold whose intervals do not overlap (noise never fails a build). The speedup is old ms
over new ms, as every other "x" in kiln: above 1 the new run is faster."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchkiln.errors import KilnUserError
from torchkiln.report.load import load_result


def _load(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        p = p / "results.json" if (p / "results.json").exists() else p / "bench.json"
    return load_result(p, need_workload=False)


@dataclass
class Comparison:
    rows: list[dict[str, Any]]
    only_old: list[str] = field(default_factory=list)  # measured in OLD alone
    only_new: list[str] = field(default_factory=list)  # measured in NEW alone


def _measured(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["variant"]: t for t in doc["trials"] if t.get("steady_ms")}


def compare_docs(old: dict[str, Any], new: dict[str, Any], threshold: float = 0.05) -> Comparison:
    """One row per variant measured in both files; the variants measured in one alone."""
    before, after = _measured(old), _measured(new)
    rows = []
    for variant, t in after.items():
        o = before.get(variant)
        if o is None:
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
                "variant": variant,
                "old_ms": om["median"],
                "old_ci95": om["ci95"],
                "new_ms": nm["median"],
                "new_ci95": nm["ci95"],
                "speedup": om["median"] / nm["median"],  # old over new: > 1 is faster
                "verdict": verdict,
            }
        )
    return Comparison(
        rows,
        only_old=[v for v in before if v not in after],
        only_new=[v for v in after if v not in before],
    )


def compare(old: dict[str, Any], new: dict[str, Any], threshold: float = 0.05) -> list[dict]:
    """The rows of ``compare_docs``."""
    return compare_docs(old, new, threshold).rows


def lines(c: Comparison) -> list[str]:
    """What `kiln compare` prints: a header saying which way the speedup reads, a row per
    variant, and the variants that could not be compared."""
    out = [
        f"{'variant':50s} {'old ms':>9s}    {'new ms':>9s}  speedup (old/new, >1 = faster)  verdict"
    ]
    for r in c.rows:
        out.append(
            f"{r['variant']:50s} {r['old_ms']:9.3f} -> {r['new_ms']:9.3f}  "
            f"{r['speedup']:.3f}x{'':25s} {r['verdict']}"
        )
    if c.only_old:
        out.append(f"only in OLD (not compared): {', '.join(c.only_old)}")
    if c.only_new:
        out.append(f"only in NEW (not compared): {', '.join(c.only_new)}")
    return out


def run_compare(old_path: str, new_path: str, threshold: float) -> tuple[int, Comparison]:
    c = compare_docs(_load(old_path), _load(new_path), threshold)
    if not c.rows:
        raise KilnUserError(
            "the two files share no measured variant"
            + (f" (OLD has {', '.join(c.only_old)};" if c.only_old else " (OLD has none;")
            + (f" NEW has {', '.join(c.only_new)})" if c.only_new else " NEW has none)")
        )
    return (1 if any(r["verdict"] == "regression" for r in c.rows) else 0), c
