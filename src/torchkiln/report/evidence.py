"""The tune's evidence as lines of text, written once and rendered twice: as Markdown for
report.md and as HTML for report.html. A line marks code with backticks; text from users' code
and from PyTorch is escaped for the format it lands in, outside code spans only (inside one,
Markdown shows `&gt;` literally)."""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape
from typing import Any


@dataclass
class Line:
    text: str  # `code` spans in backticks
    sub: list[str] = field(default_factory=list)


def code(text: Any) -> str:
    """``text`` as one code span (a backtick inside it would end the span: shown as ')."""
    return "`" + str(text).replace("`", "'").replace("\n", " ") + "`"


def md_inline(text: Any, table: bool = False) -> str:
    """Markdown for text with code spans: outside them < and > escaped (user text must not
    become HTML); in a table cell, | escaped everywhere (GFM's rule, inside spans too)."""
    parts = str(text).replace("\n", " ").split("`")
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 0 or i == len(parts) - 1:  # outside a span (an unclosed one is text)
            part = part.replace("<", "&lt;").replace(">", "&gt;")
        if table:
            part = part.replace("|", "\\|")
        out.append(part)
    return "`".join(out)


def html_inline(text: Any) -> str:
    """HTML for text with code spans: every piece escaped, the spans as <code>."""
    parts = str(text).replace("\n", " ").split("`")
    if len(parts) % 2 == 0:  # an unclosed span: its backtick is text
        parts[-2:] = [parts[-2] + "`" + parts[-1]]
    return "".join(f"<code>{escape(p)}</code>" if i % 2 else escape(p) for i, p in enumerate(parts))


def share(x: Any) -> str:
    """A fraction as a percentage with 3 significant digits (0.8888888888888888 -> 88.9%)."""
    if not isinstance(x, (int, float)):
        return str(x)
    return f"{x * 100:.3g}%"


def not_measured(stage: dict[str, Any] | None) -> str:
    """Why an evidence stage has no figures: its status and reason, or that it did not run."""
    stage = stage or {}
    why = stage.get("reason") or (
        f"status {stage['status']}" if stage.get("status") not in (None, "ok") else None
    )
    return f"not measured ({why or 'the stage did not run'})"


def distinct_breaks(breaks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Breaks at the same place for the same reason once, with how often they were found (a
    loop body breaks once per iteration: the same line listed twice said nothing more)."""
    seen: dict[tuple, dict[str, Any]] = {}
    for b in breaks:
        key = (b.get("file"), b.get("line"), b.get("category"))
        if key in seen:
            seen[key]["count"] = seen[key].get("count", 1) + b.get("count", 1)
        else:
            seen[key] = {**b, "count": b.get("count", 1)}
    return list(seen.values())


def graph_break_line(gb: dict[str, Any] | None) -> Line:
    gb = gb or {}
    if gb.get("breaks") is None:
        return Line(f"Graph breaks: {not_measured(gb)}")
    graphs = gb.get("graphs")
    cap = gb.get("captured_share")
    head = (
        f"Graph breaks: {gb['breaks']} (graphs: "
        f"{graphs if graphs is not None else 'not measured'}, captured share: "
        f"{share(cap) if cap is not None else 'not measured'})"
    )
    sub = []
    for b in distinct_breaks(gb.get("first_breaks") or []):
        times = f" (found {b['count']} times)" if b["count"] > 1 else ""
        sub.append(
            f"{b.get('file')}:{b.get('line')} {b.get('category')}{times}: {b.get('fix') or ''}"
        )
    return Line(head, sub)


def profile_line(prof: dict[str, Any] | None) -> Line:
    prof = prof or {}
    verdict = prof.get("verdict")
    return Line(f"Profile verdict: {verdict if verdict else not_measured(prof)}")


def render_md(lines: list[Line]) -> list[str]:
    out = []
    for line in lines:
        out.append(f"- {md_inline(line.text)}")
        out += [f"  - {md_inline(s)}" for s in line.sub]
    return out


def render_html(lines: list[Line]) -> str:
    items = []
    for line in lines:
        sub = "".join(f"<li>{html_inline(s)}</li>" for s in line.sub)
        items.append(f"<li>{html_inline(line.text)}" + (f"<ul>{sub}</ul>" if sub else "") + "</li>")
    return "<ul class='ev'>" + "".join(items) + "</ul>"


def host_waits(doc: dict[str, Any]) -> list[tuple[float, str]]:
    """(seconds, variant) of every trial that waited for its turn on the host (the `host_wait`
    phase of trials run side by side, runner/launch/host_lock.py), search and head-to-head alike."""
    trials = [*doc["trials"], *(doc.get("head_to_head_trials") or [])]
    waits = [((r.get("phase_s") or {}).get("host_wait") or 0.0, r["variant"]) for r in trials]
    return [(w, v) for w, v in waits if w >= 0.5]


def evidence_lines(doc: dict[str, Any]) -> list[Line]:
    """What the tune found besides the trials' figures, one line per finding."""
    stages = doc.get("stages") or {}
    search = stages.get("search") or {}
    sel = doc.get("selection") or {}
    out = [profile_line(stages.get("profile")), graph_break_line(stages.get("graph_breaks"))]
    for r in search.get("refined") or []:
        out.append(
            Line(f"Refined the leader {code(r['leader'])}: tried {code(r['spec'])} ({r['why']})")
        )
    skipped = search.get("skipped") or {}
    for spec, why in skipped.items():
        out.append(Line(f"Skipped {code(spec)}: {why}"))
    for spec, why in (search.get("ruled_out") or {}).items():
        out.append(Line(f"Ruled out {code(spec)}, never run: {why}"))
    for spec, why in (search.get("deferred") or {}).items():
        if spec not in skipped:
            out.append(Line(f"Deferred {code(spec)} at its first turn, run at its second: {why}"))
    # Speedups from separate trials drift apart when eager is host-bound and a variant is not;
    # the head-to-head trials (challenger against leader in one process) do not.
    for v, h in (sel.get("head_to_head") or {}).items():
        lo, hi = h["ci95"]
        if not h["significant"]:
            verdict = "no significant difference"
        else:
            verdict = "faster" if h["speedup_over_leader"] > 1 else "slower"
        out.append(
            Line(
                f"Head to head, one process: {code(v)} against {code(h['leader'])}: "
                f"{h['speedup_over_leader']:.2f}x [{lo:.2f}, {hi:.2f}], {verdict}"
            )
        )
    for v, why in ((stages.get("head_to_head") or {}).get("skipped") or {}).items():
        out.append(Line(f"Head to head skipped for {code(v)}: {why}"))
    for p in (stages.get("environment") or {}).get("problems") or []:
        out.append(Line(f"Environment: {p}"))
    drift = doc.get("baseline_drift") or {}
    if drift.get("warning"):
        out.append(Line(f"Warning: {drift['warning']}"))
    waited = host_waits(doc)
    if waited:
        (longest, variant), total = max(waited), sum(w for w, _ in waited)
        out.append(
            Line(
                f"Trials waited {total:.0f} s in all for the host (side by side, trials take "
                f"turns so that no reps are timed while a neighbour compiles); the longest wait, "
                f"{longest:.0f} s, was {code(variant)}'s"
            )
        )
    # Each trial's notes (a busy host, a recompile during the timed reps, ...), once per text.
    noted: dict[str, list[str]] = {}
    for r in [*doc["trials"], *(doc.get("head_to_head_trials") or [])]:
        for note in r.get("notes") or []:
            noted.setdefault(note, [])
            if r["variant"] not in noted[note]:
                noted[note].append(r["variant"])
    for note, variants in noted.items():
        out.append(Line(f"Note ({', '.join(code(v) for v in variants)}): {note}"))
    return out
