"""The Inductor-vs-XLA section of a report: the best Inductor variant and the xla variant of the
same run side by side, measured (step time, compile, memory, recompiles, coverage)."""

from __future__ import annotations

from typing import Any

GIB = 1024**3


def _memory(r: dict[str, Any]) -> str:
    mem = r.get("memory") or {}
    if mem.get("jax_peak_bytes_in_use"):
        return f"{mem['jax_peak_bytes_in_use'] / GIB:.2f} GiB (JAX peak)"
    if mem.get("peak_reserved_bytes"):
        return f"{mem['peak_reserved_bytes'] / GIB:.2f} GiB (torch reserved)"
    if mem.get("peak_rss_bytes"):
        return f"{mem['peak_rss_bytes'] / GIB:.2f} GiB (process RSS)"
    return "-"


def _recompiles(r: dict[str, Any]) -> str:
    if "xla" in r or r["variant"].startswith("xla"):
        shapes = (r.get("xla") or {}).get("shape_recompiles")
        if not shapes:
            return "not measured: the workload has one input shape"
        done = [s for s in shapes if s.get("recompiled")]
        return f"{len(done)} of {len(shapes)} new shapes recompiled"
    dyn = r.get("dynamo_after_measure") or r.get("dynamo") or {}
    if dyn:
        return f"{dyn.get('recompiles', 0)} Dynamo recompiles, {dyn.get('graph_breaks', 0)} breaks"
    return "-"


def rows(doc: dict[str, Any]) -> list[dict[str, str]]:
    """Empty unless the run holds both an xla trial and an Inductor trial."""
    xla = [t for t in doc["trials"] if t["variant"].split("+")[0].split(":")[0] == "xla"]
    ind = [t for t in doc["trials"] if t["variant"].startswith("inductor")]
    if not xla or not ind:
        return []
    ok_ind = [t for t in ind if t["status"] == "ok"]
    best_ind = max(ok_ind, key=lambda t: t["speedup"]["median"]) if ok_ind else ind[0]
    out = []
    for t in (best_ind, *xla):
        ok = t["status"] in ("ok", "accuracy_fail")
        out.append(
            {
                "variant": t["variant"],
                "status": t["status"] if ok else f"{t['status']}: {t.get('reason') or ''}",
                "step ms": f"{t['steady_ms']['median']:.3f}" if ok else "-",
                "speedup vs eager": f"{t['speedup']['median']:.2f}x" if ok else "-",
                "first call (compile) s": f"{t['first_call_s']:.1f}" if ok else "-",
                "memory": _memory(t) if ok else "-",
                "recompilation": _recompiles(t) if ok else "-",
            }
        )
    return out
