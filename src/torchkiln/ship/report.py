"""The ship directory's measured routes as a small summary and a Markdown section of the
tune's report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

LABELS = {
    "cold": "cold compile",
    "cache": "compile cache",
    "precompiled": "precompiled forward",
    "aoti": "AOTInductor package",
}


def summary(manifest: dict[str, Any], ship_dir: str | Path) -> dict[str, Any]:
    """What the tune's results.json keeps of a ship: where, the order, each route's numbers."""
    routes = {}
    for name, r in (manifest.get("routes") or {}).items():
        if not r.get("ok"):
            routes[name] = {"ok": False, "error": r.get("error")}
            continue
        routes[name] = {
            "ok": True,
            "load_s": r["load_s"],
            "first_call_s": r["first_call_s"],
            "first_fast_s": r["first_fast_s"],
            "steady_ms": r["steady_ms"]["median"],
            "matches_cold": r.get("matches_cold", True),
        }
        pair = r.get("paired") or {}
        if pair.get("route_over_cold") is not None:
            routes[name]["steady_over_cold"] = pair["route_over_cold"]
            routes[name]["steady_over_cold_ci95"] = pair["ci95"]
    return {
        "dir": str(ship_dir),
        "spec": manifest["spec"],
        "route_order": manifest.get("route_order"),
        "export": manifest.get("export"),
        "precompile": manifest.get("precompile"),
        "routes": routes,
    }


def markdown_section(ship: dict[str, Any] | None) -> list[str]:
    """`## Shipped` for report.md: each route's first fast output and steady step beside cold's,
    each measured in its own fresh process, and its steady step over cold's timed rep by rep."""
    if not ship:
        return []
    out = [
        "",
        "## Shipped",
        "",
        f"`{ship['dir']}` holds `{ship['spec']}`; `torchkiln.load(DIR, model)` takes "
        + (", then ".join(f"the {LABELS[r]}" for r in ship.get("route_order") or []) or "none")
        + " where they fit, else compiles cold. Each route measured in a fresh process with an "
        "empty compile cache:",
        "",
        "| route | load | first call | first fast output | steady step | vs cold (paired) "
        "| output |",
        "|--|--|--|--|--|--|--|",
    ]
    for name, r in (ship.get("routes") or {}).items():
        if not r.get("ok"):
            out.append(f"| {LABELS.get(name, name)} | failed: {r.get('error')} | | | | | |")
            continue
        same = "= cold" if r.get("matches_cold", True) else "**differs**"
        ratio = r.get("steady_over_cold")
        paired = "" if ratio is None else f"{(ratio - 1) * 100:+.1f}%"
        if ratio is not None and r.get("steady_over_cold_ci95"):
            lo, hi = r["steady_over_cold_ci95"]
            paired += f" [{(lo - 1) * 100:+.1f}, {(hi - 1) * 100:+.1f}]"
        out.append(
            f"| {LABELS.get(name, name)} | {r['load_s']:.2f} s | {r['first_call_s']:.2f} s | "
            f"{r['first_fast_s']:.2f} s | {r['steady_ms']:.3f} ms | {paired} | {same} |"
        )
    for key, what in (("export", "AOTInductor package"), ("precompile", "precompiled forward")):
        why = ship.get(key)
        if why:
            out += ["", f"No {what}: {why['reason']}. Remedy: {why['remedy']}."]
    return out
