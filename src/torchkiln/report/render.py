"""report.md (for a pull request) and report.html (one self-contained file) from a tune's
results.json; `kiln report DIR` re-renders them from the JSON alone."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from torchkiln.repair import report as repair_report
from torchkiln.report import evidence, svg, time_spent, trend
from torchkiln.report.table import fmt_accuracy, fmt_memory, fmt_ms, fmt_speedup, fmt_tflops
from torchkiln.tune.select import step_s
from torchkiln.variants.base import report_sections

GIB = 1024**3


def _md(text: Any) -> str:
    """Text from user code or PyTorch inside a Markdown table cell (code spans kept as code)."""
    return evidence.md_inline(text, table=True)


def trial_rows(doc: dict[str, Any]) -> list[dict[str, str]]:
    be = (doc.get("selection") or {}).get("break_even_steps") or {}
    rows = []
    for r in doc["trials"]:
        # A trial stopped after its timing (runner.launch.trial_process) shows what it measured
        # beside why.
        shown = r["status"] in ("ok", "accuracy_fail") or bool(r.get("measured_before_failure"))
        b = be.get(r["variant"])
        failed = r["status"] not in ("ok", "accuracy_fail")
        rows.append(
            {
                "variant": r["variant"],
                "status": f"{r['status']}: {r.get('reason') or ''}" if failed else r["status"],
                "step ms [95% CI]": fmt_ms(r.get("steady_ms")) if shown else "",
                "speedup [95% CI]": fmt_speedup(r.get("speedup")) if shown else "",
                "first call s": f"{r['first_call_s']:.1f}" if shown else "",
                "break-even steps": (
                    ("never" if b is None else f"{b:.0f}") if shown and not failed else ""
                ),
                "peak GiB": fmt_memory(r.get("memory")) if shown else "",
                "kernels/step": f"{r['kernels_per_step']:.0f}"
                if shown and r.get("kernels_per_step") is not None
                else "-",
                "TFLOP/s": fmt_tflops(r) if shown else "",
                "accuracy": fmt_accuracy(r) if shown else "",
            }
        )
    return rows


def environment_line(doc: dict[str, Any]) -> str:
    """Where and with what the tune ran, and its budget: the head of both reports."""
    env = doc.get("environment") or {}
    gpu = (env.get("gpu") or {}).get("name") or env.get("cpu")
    return (
        f"{gpu} · torch {env.get('torch')} · triton {env.get('triton')} · kiln "
        f"{env.get('kiln_git_sha', '?')} · budget {doc['budget_s']:.0f} s, used "
        f"{doc['wall_s']:.0f} s"
    )


def pick_notes(doc: dict[str, Any]) -> list[str]:
    """The lines under the pick: what it tied with, and the best numerics-changing variant."""
    sel = doc.get("selection") or {}
    out = []
    if sel.get("tied"):
        how = (
            "no significant difference head to head"
            if sel.get("head_to_head")
            else ("overlapping intervals")
        )
        out.append(f"Tied ({how}): {', '.join(evidence.code(t) for t in sel['tied'])}")
    opp = sel.get("best_numerics_changing")
    # When the pick is that variant, its own bullet above already gives its error.
    if opp and opp["variant"] != sel.get("best"):
        allowed = ", ".join(doc.get("allow_precision") or []) or "none"
        out.append(
            f"Opportunity: the best numerics-changing variant, {evidence.code(opp['variant'])}, "
            f"gave {opp['speedup']:.2f}x with its error at "
            f"{opp['worst_error_over_threshold'] or 0:.2f} of the allowed limit "
            f"({'passed' if opp['passed'] else 'failed'} the check; allowed precisions: "
            f"{allowed})."
        )
    return out


def markdown(doc: dict[str, Any]) -> str:
    sel = doc.get("selection") or {}
    rec = doc.get("recommendation")
    out = [
        f"# kiln tune: {_md(doc['workload'])} ({doc['step']}, {doc['device']})",
        "",
        evidence.md_inline(environment_line(doc)),
        "",
    ]
    if rec:
        out += [
            f"**Pick: `{rec['variant']}`** — {evidence.md_inline(sel.get('reason', ''))}",
            "",
        ]
        out += [f"- {evidence.md_inline(w)}" for w in rec["why"]]
        out += ["", "```python", rec["code"], "```", ""]
    else:
        out += ["**No variant passed.**", ""]
    out += repair_report.markdown(doc)  # the pick's remedies as code, each break's cost
    out += [line for note in pick_notes(doc) for line in (evidence.md_inline(note), "")]
    rows = trial_rows(doc)
    if rows:
        heads = list(rows[0])
        out += ["| " + " | ".join(heads) + " |", "|" + "--|" * len(heads)]
        out += ["| " + " | ".join(_md(r[h]) for h in heads) + " |" for r in rows]
        out.append("")
    for title, versus in report_sections(doc) + time_spent.sections(doc):
        heads = list(versus[0])
        out += [f"## {title}", ""]
        out += ["| " + " | ".join(heads) + " |", "|" + "--|" * len(heads)]
        out += ["| " + " | ".join(_md(r[h]) for h in heads) + " |" for r in versus]
        out.append("")
    out += ["## Evidence", "", *evidence.render_md(evidence.evidence_lines(doc))]
    from torchkiln.ship.report import markdown_section

    out += markdown_section(doc.get("ship"))  # `kiln ship RUN_DIR` adds it
    return "\n".join(out) + "\n"


CSS = """body{font:14px system-ui,sans-serif;margin:24px;max-width:1100px}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 6px;font-size:12px}
pre{background:#f4f4f4;padding:10px;overflow-x:auto}.env{color:#555}.note{color:#a60}
ul.ev code{background:#f4f4f4;padding:0 2px}.chart{margin:12px 0}
svg text{font:11px sans-serif}.t{font-weight:bold}
.b{fill:#4a7ab7}.w{stroke:#111;stroke-width:2}.a{stroke:#555}.p{fill:#c0392b}
.l0{stroke:#4a7ab7}.l1{stroke:#c0392b}.l2{stroke:#27ae60}.l3{stroke:#8e44ad}.l4{stroke:#d35400}
.l5{stroke:#7f8c8d}polyline{stroke-width:2}"""


def chart_engine() -> tuple[Any, str | None]:
    """matplotlib's charts (report/charts.py) when it is installed, else the hand-drawn ones
    (report/svg.py) and a note naming the extra that gives the others."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:
        from torchkiln.report import charts

        return charts, None
    return svg, (
        "Charts drawn without matplotlib (no tick marks, labels may crowd): "
        "pip install 'torchkiln[report]' for the full charts."
    )


def html(doc: dict[str, Any], history: str | Path | bool | None = False) -> str:
    """The HTML report; with ``history`` (a store, None for the default), its trend charts."""
    ok = [r for r in doc["trials"] if r["status"] in ("ok", "accuracy_fail")]
    sel = doc.get("selection") or {}
    rec = doc.get("recommendation")
    draw, note = chart_engine()
    charts = [
        draw.hbars(
            "Step time per variant (median, 95% interval)",
            [(r["variant"], r["steady_ms"]["median"], tuple(r["steady_ms"]["ci95"])) for r in ok],
            "ms",
        ),
        draw.scatter(
            "Compile time against speedup",
            [(r["variant"], r["first_call_s"], r["speedup"]["median"]) for r in ok],
            "first call (compile) s",
            "speedup over eager",
        ),
    ]
    horizon = _horizon(doc, ok)
    eager = next((r for r in ok if r["variant"] == "eager"), None)
    if eager is not None:
        # Step times on the eager trial's clock, from each paired speedup (see select.step_s).
        charts.append(
            draw.lines(
                "Cumulative time against steps (break-even where lines cross)",
                [
                    (
                        r["variant"],
                        [
                            (0, r["first_call_s"]),
                            (horizon, r["first_call_s"] + horizon * step_s(r, eager)),
                        ],
                    )
                    for r in ok
                    if r["status"] == "ok"
                ],
                "steps",
                "seconds",
            )
        )
    mem = [
        (
            r["variant"],
            (r.get("memory") or {}).get("peak_reserved_bytes")
            or (r.get("memory") or {}).get("peak_rss_bytes")
            or 0,
        )
        for r in ok
    ]
    charts.append(
        draw.hbars(
            "Peak memory (reserved on CUDA, RSS on CPU)",
            [(v, b / GIB, None) for v, b in mem],
            "GiB",
        )
    )
    kern = [
        (r["variant"], r["kernels_per_step"], None)
        for r in ok
        if r.get("kernels_per_step") is not None
    ]
    if kern:
        charts.append(draw.hbars("Kernels per step", kern, ""))
    charts.append(trend.section(doc, history))
    rows = trial_rows(doc)
    table = ""
    if rows:
        table = _html_table(rows, list(rows[0]))
    for title, versus in report_sections(doc) + time_spent.sections(doc):
        table += f"<h2>{escape(title)}</h2>" + _html_table(versus, list(versus[0]))
    pick = (
        (
            (
                f"<p><b>Pick: <code>{escape(rec['variant'])}</code></b> — "
                f"{escape(sel.get('reason', ''))}</p><ul>"
                + "".join(f"<li>{escape(w)}</li>" for w in rec["why"])
                + f"</ul><pre>{escape(rec['code'])}</pre>"
            )
            if rec
            else "<p>No variant passed.</p>"
        )
        + repair_report.html(doc)
        + "".join(f"<p>{evidence.html_inline(n)}</p>" for n in pick_notes(doc))
    )
    found = evidence.render_html(evidence.evidence_lines(doc))
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>kiln tune {escape(doc['workload'])}</title><style>{CSS}</style></head><body>"
        f"<h1>kiln tune: {escape(doc['workload'])} ({escape(doc['step'])}, "
        f"{escape(doc['device'])})</h1><p class='env'>{escape(environment_line(doc))}</p>"
        f"{pick}{table}"
        + (f"<p class='note'>{escape(note)}</p>" if note else "")
        + "".join(f"<div class='chart'>{c}</div>" for c in charts if c)
        + f"<h2>Evidence</h2>{found}</body></html>"
    )


def _html_table(rows: list[dict[str, str]], heads: list[str]) -> str:
    return (
        "<table><tr>"
        + "".join(f"<th>{escape(h)}</th>" for h in heads)
        + "</tr>"
        + "".join(
            "<tr>" + "".join(f"<td>{escape(str(r[h]))}</td>" for h in heads) + "</tr>" for r in rows
        )
        + "</table>"
    )


def _horizon(doc: dict[str, Any], ok: list[dict[str, Any]]) -> int:
    """Steps to draw: the job length if given, else past the largest finite break-even."""
    if doc.get("steps"):
        return int(doc["steps"])
    be = [b for b in ((doc.get("selection") or {}).get("break_even_steps") or {}).values() if b]
    return int(max(be) * 2) if be else 1000


def write_reports(
    doc: dict[str, Any], out: str | Path, history: str | Path | bool | None = None
) -> None:
    out = Path(out)
    (out / "report.md").write_text(markdown(doc))
    (out / "report.html").write_text(html(doc, history))


def rerender(run_dir: str | Path) -> Path:
    """`kiln report DIR`: rebuild both reports from DIR/results.json."""
    from torchkiln.report.load import BadResultFile, load_result

    path = Path(run_dir) / "results.json"
    if not path.exists():
        raise BadResultFile(f"{str(path)!r} does not exist: run `kiln tune --out DIR` first")
    doc = load_result(path)
    if doc.get("stream"):  # a tune on a stream has its own, shorter report
        from torchkiln.tune.stream_search import write_stream_reports

        write_stream_reports(doc, run_dir)
        return Path(run_dir)
    try:
        md, page = markdown(doc), html(doc)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        # A field the checks in report.load do not cover: still one line naming the file.
        raise BadResultFile(
            f"{str(path)!r}: not a readable kiln tune result ({type(exc).__name__}: {exc})"
        ) from exc
    (Path(run_dir) / "report.md").write_text(md)
    (Path(run_dir) / "report.html").write_text(page)
    return Path(run_dir)
