"""The report's "Where the time went" section, from a tune's ``time_spent`` (tune.time_spent)."""

from __future__ import annotations

from typing import Any

TITLE = "Where the time went"


def rows(spent: dict[str, Any]) -> list[dict[str, str]]:
    """One row per stage, then one per trial phase summed over the trials, each with its share
    of the tune's wall time."""
    wall = float(spent.get("wall_s") or 0.0)

    def share(s: float) -> str:
        return f"{100 * s / wall:.0f}%" if wall > 0 else "-"

    out = [
        {"what": f"stage: {k}", "seconds": f"{v:.1f}", "share of wall": share(v)}
        for k, v in spent.get("stages_s", {}).items()
    ]
    # Beside the main line (the diagnosis beside the search): inside the wall already.
    out += [
        {
            "what": f"stage: {k} (beside the search)",
            "seconds": f"{v:.1f}",
            "share of wall": share(v),
        }
        for k, v in (spent.get("beside_s") or {}).items()
    ]
    counted = f"{spent.get('trials', 0)} trials"
    out += [
        {"what": f"phase: {k} ({counted})", "seconds": f"{v:.1f}", "share of wall": share(v)}
        for k, v in sorted(spent.get("phases_s", {}).items(), key=lambda kv: -kv[1])
    ]
    if spent.get("outside_phases_s"):
        v = float(spent["outside_phases_s"])
        out.append(
            {
                "what": f"trial processes outside their phases ({counted})",
                "seconds": f"{v:.1f}",
                "share of wall": share(v),
            }
        )
    return out


def sections(doc: dict[str, Any]) -> list[tuple[str, list[dict[str, str]]]]:
    """The section as (title, rows), or none for a results.json written before time_spent."""
    spent = doc.get("time_spent")
    if not spent:
        return []
    found = rows(spent)
    return [(TITLE, found)] if found else []
