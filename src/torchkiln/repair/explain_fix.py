"""`kiln explain --fix`: the diff a tune would ship for the breaks, without tuning."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from torchkiln.repair.plan import build_plan


def print_fix(workload: str, report: dict[str, Any], code: int) -> int:
    """The code:all patch on stdout; the rest on stderr. Returns explain's exit code."""
    breaks = report.get("breaks") or []
    err = sys.stderr
    if report.get("status") != "ok":
        print(f"kiln: explain did not complete ({report.get('status')}): no fix", file=err)
        return code
    if not breaks:
        print("no graph break: nothing to fix", file=err)
        return code
    with tempfile.TemporaryDirectory(prefix="kiln-fix-") as tmp:
        plan = build_plan(workload, breaks, Path(tmp), "code")
    copy = plan["code"].get("all")
    if copy:
        sys.stdout.write(copy["patch"])
        for a in copy["applied"]:
            print(f"{a['file']}:{a['line']} [{a['rewrite']}] {a['behaviour']}", file=err)
    for s in plan["skipped"]:
        print(f"left alone {s['file']}:{s['line']} ({s['category']}): {s['reason']}", file=err)
    if plan["source_note"]:
        print(plan["source_note"], file=err)
    for name, c in plan["config"].items():
        lines = "; ".join(c["lines"])
        print(f"configuration remedy {name} (no code change): {lines}", file=err)
    return code
