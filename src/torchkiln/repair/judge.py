"""What the measured remedies did: a remedy that removes no break is marked as such (and so is
never picked), each break gets its measured cost, and a pick with remedies ships its
configuration lines and its patch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchkiln.repair import config as cfg
from torchkiln.repair.plan import resolve

NO_EFFECT = "no_effect"
PATCH_FILE = "fixes.patch"
# A frame Dynamo gave up on runs in eager: no graph at all counts as more pieces than any split.
_EAGER_FALLBACK = 10**6


def fixes_of(spec: str) -> tuple[str, ...]:
    from torchkiln.variants import parse_variant

    return parse_variant(spec).fixes


def without_fixes(spec: str) -> str:
    return "+".join(p for p in spec.split("+") if not p.startswith("fix="))


def pieces(dynamo: dict[str, Any] | None) -> int | None:
    """Counted breaks plus graphs, from the trial's Dynamo counters: fewer is better."""
    if not dynamo:
        return None
    graphs = int(dynamo.get("graphs") or 0)
    return int(dynamo.get("graph_breaks") or 0) + (graphs if graphs else _EAGER_FALLBACK)


def mark(r: dict[str, Any], results: list[dict[str, Any]], explain_breaks: int | None) -> None:
    """Record the breaks after the remedy; a remedy trial that leaves as many pieces as the
    same variant without it (or, unmeasured, any break at all) becomes `no_effect`."""
    if r.get("status") != "ok" or not fixes_of(r["variant"]) or "repair" in r:
        return
    after = r.get("dynamo") or {}
    plain = without_fixes(r["variant"])
    twin = next((t for t in results if t["variant"] == plain and t.get("dynamo")), None)
    record = {
        "graph_breaks_after": after.get("graph_breaks"),
        "graphs_after": after.get("graphs"),
        "compared_with": plain if twin else "kiln explain's break count",
        "graph_breaks_before": (twin or {}).get("dynamo", {}).get("graph_breaks", explain_breaks),
        "graphs_before": (twin or {}).get("dynamo", {}).get("graphs"),
    }
    r["repair"] = record
    now, before = pieces(after), pieces((twin or {}).get("dynamo"))
    if before is not None and now is not None:
        effective = now < before
    else:
        effective = (after.get("graph_breaks") or 0) < (explain_breaks or 0) or (
            after.get("graph_breaks") == 0 and after.get("graphs") == 1
        )
    if not effective:
        r["status"] = NO_EFFECT
        r["reason"] = (
            f"removes no graph break ({record['graph_breaks_after']} breaks, "
            f"{record['graphs_after']} graphs after it; {record['graph_breaks_before']} breaks, "
            f"{record['graphs_before']} graphs before)"
        )
        r["measured_before_failure"] = True


def _step_ms(r: dict[str, Any], eager: dict[str, Any]) -> float | None:
    from torchkiln.tune.select import step_s

    if r.get("status") not in ("ok", NO_EFFECT) or not r.get("speedup"):
        return None
    return 1e3 * step_s(r, eager)


def break_costs(
    plan: dict[str, Any], results: list[dict[str, Any]], eager: dict[str, Any]
) -> list[dict[str, Any]]:
    """Per break: the single remedies measured for it, step time with and without each (on
    the eager trial's clock, select.step_s), and the time the break costs."""
    by_spec = {r["variant"]: r for r in results}
    out = []
    seen: set[tuple[Any, ...]] = set()
    for i, brk in enumerate(plan.get("breaks", [])):
        key = (brk.get("file"), brk.get("line"), brk.get("category"))
        if key in seen:
            continue  # two records of one break (Dynamo logs some twice, by two types)
        seen.add(key)
        rows = []
        for r in results:
            toks = fixes_of(r["variant"])
            # One rewrite kind (or one config remedy): its combination is the single remedy.
            single_code = len(plan["code"]) == 1 and toks == ("code:all",)
            if len(toks) != 1 or (toks[0] in ("all", "code:all", "config:all") and not single_code):
                continue
            if not _answers(plan, toks[0], i):
                continue
            plain = by_spec.get(without_fixes(r["variant"]))
            with_ms = _step_ms(r, eager)
            without_ms = _step_ms(plain, eager) if plain else None
            rows.append(
                {
                    "remedy": toks[0],
                    "variant": r["variant"],
                    "status": r.get("status"),
                    "with_ms": with_ms,
                    "without_ms": without_ms,
                    "cost_ms": None
                    if with_ms is None or without_ms is None
                    else without_ms - with_ms,
                }
            )
        out.append({k: brk.get(k) for k in ("file", "line", "category", "source")} | {"by": rows})
    return out


def _answers(plan: dict[str, Any], token: str, index: int) -> bool:
    kind, _, name = token.partition(":")
    brk = plan["breaks"][index]
    if kind == "config":
        return index in (plan["config"].get(name) or {}).get("breaks", [])
    copy = plan["code"].get(name) or (plan["code"].get("all") if len(plan["code"]) == 1 else None)
    if not copy:
        return False
    return any(
        a["line"] == brk.get("line") and Path(brk.get("file") or "").as_posix().endswith(a["file"])
        for a in copy["applied"]
        if a["rewrite"] == name or len(plan["code"]) == 1
    )


def shipped(plan: dict[str, Any], spec: str, out: Path) -> dict[str, Any] | None:
    """The remedies of the pick as code: configuration lines and the patch (written to
    fixes.patch), and which part changes what."""
    toks = fixes_of(spec)
    if not toks:
        return None
    code, names = resolve(plan, toks)
    helpers = [h["function"] for h in plan.get("helpers", [])]
    lines = cfg.code_lines(names, helpers)
    copy = plan["code"].get(code) if code else None
    patch = copy["patch"] if copy else ""
    if patch:
        (out / PATCH_FILE).write_text(patch, encoding="utf-8")
    return {
        "fixes": list(toks),
        "config": {
            "remedies": names,
            "helpers": helpers if "disable" in names else [],
            "lines": lines,
            "changes": "configuration only: the model's code is unchanged" if names else None,
        },
        "code": None
        if not copy
        else {
            "patch_file": PATCH_FILE,
            "patch": patch,
            "applied": copy["applied"],
            "changes": "the model's source: apply with `git apply fixes.patch` or "
            "`patch -p1 < fixes.patch` in " + str((plan.get("source") or {}).get("diff_root")),
        },
        "left_alone": plan.get("skipped", []),
        "source_note": plan.get("source_note"),
    }
