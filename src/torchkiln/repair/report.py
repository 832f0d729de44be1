"""The remedies in words: `kiln variants`' list, the tune console's lines, and the sections of
report.md and report.html (the pick's configuration lines and patch, each break's cost)."""

from __future__ import annotations

from html import escape
from typing import Any


def remedy_lines() -> list[str]:
    """`kiln variants`: every remedy, whether this torch offers it, what it changes."""
    from torchkiln.repair.config import CONFIG_REMEDIES
    from torchkiln.repair.rewrites import REWRITES

    out = ["remedies for graph breaks (+fix=all, +fix=code:all, +fix=config:all, or one of):"]
    for r in REWRITES.values():
        out.append(f"  +fix=code:{r.name:34s} {r.title}: {r.behaviour}")
    for c in CONFIG_REMEDIES.values():
        where = "" if c.available() else " [not offered by this torch]"
        out.append(f"  +fix=config:{c.name:32s} {c.title}{where}")
    return out


def console_lines(doc: dict[str, Any], out: str) -> list[str]:
    """The pick's remedies (configuration lines, the patch), or why code was not rewritten."""
    stage = (doc.get("stages") or {}).get("repair") or {}
    fixes = (doc.get("recommendation") or {}).get("fixes")
    note = [f"remedies: {stage['source_note']}"] if stage.get("source_note") else []
    if not fixes:
        return note
    lines = note
    if fixes["config"]["lines"]:
        lines.append("configuration (the model's code unchanged), before the first call:")
        lines += [f"  {ln}" for ln in fixes["config"]["lines"]]
    if fixes["code"]:
        lines.append(
            f"source change: {out}/{fixes['code']['patch_file']} ({fixes['code']['changes']})"
        )
        for a in fixes["code"]["applied"]:
            lines.append(f"  {a['file']}:{a['line']} [{a['rewrite']}] {a['behaviour']}")
    return lines + [""]


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def markdown(doc: dict[str, Any]) -> list[str]:
    rec = doc.get("recommendation") or {}
    fixes = rec.get("fixes")
    stage = (doc.get("stages") or {}).get("repair") or {}
    out: list[str] = []
    if fixes:
        out += ["## Remedies in the pick", ""]
        if fixes["config"]["lines"]:
            out += ["Configuration (changes no code), before the first compiled call:", ""]
            out += ["```python", *fixes["config"]["lines"], "```", ""]
        if fixes["code"]:
            out += [f"Source change (`{fixes['code']['patch_file']}`): {fixes['code']['changes']}."]
            out += [""]
            for a in fixes["code"]["applied"]:
                out.append(f"- `{a['file']}:{a['line']}` ({a['rewrite']}): {a['behaviour']}")
            out += ["", "```diff", fixes["code"]["patch"].rstrip("\n"), "```", ""]
    if stage.get("source_note"):
        out += [f"Remedies: {stage['source_note']}.", ""]
    costs = stage.get("break_costs") or []
    if costs:
        out += ["## What each graph break costs", ""]
        out += ["| break | category | remedy | ms with | ms without | cost ms | status |"]
        out += ["|--|--|--|--|--|--|--|"]
        for c in costs:
            where = f"`{(c.get('file') or '?').rsplit('/', 1)[-1]}:{c.get('line')}`"
            for row in c["by"] or [{"remedy": "none measured"}]:
                out.append(
                    f"| {where} | {c.get('category')} | {row.get('remedy')} | "
                    f"{_ms(row.get('with_ms'))} | {_ms(row.get('without_ms'))} | "
                    f"{_ms(row.get('cost_ms'))} | {row.get('status', '-')} |"
                )
        out.append("")
    left = stage.get("left_alone") or []
    if left:
        out += ["Breaks left alone by the rewrites:", ""]
        out += [
            f"- `{s.get('file')}:{s.get('line')}` ({s['category']}): {s['reason']}" for s in left
        ]
        out.append("")
    return out


def html(doc: dict[str, Any]) -> str:
    lines = markdown(doc)
    if not lines:
        return ""
    return "<h2>Remedies</h2><pre>" + escape("\n".join(lines)) + "</pre>"
