"""report.md (for a pull request) and report.html (one self-contained file) from a tune's
results.json; `kiln report DIR` re-renders them from the JSON alone."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from torchkiln.repair import report as repair_report
from torchkiln.report import compare_xla, svg
from torchkiln.report.table import fmt_accuracy, fmt_memory, fmt_ms, fmt_speedup, fmt_tflops
from torchkiln.tune.select import step_s

GIB = 1024**3


def _md(text: Any) -> str:
    """Text from user code or PyTorch inside a Markdown table cell."""
    return (
        str(text).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")
    )


def trial_rows(doc: dict[str, Any]) -> list[dict[str, str]]:
    be = (doc.get("selection") or {}).get("break_even_steps") or {}
    rows = []
    for r in doc["trials"]:
        # A trial stopped after its timing (runner.launch) shows what it measured beside why.
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


def markdown(doc: dict[str, Any]) -> str:
    sel = doc.get("selection") or {}
    rec = doc.get("recommendation")
    env = doc.get("environment") or {}
    gpu = (env.get("gpu") or {}).get("name") or env.get("cpu")
    out = [
        f"# kiln tune: {_md(doc['workload'])} ({doc['step']}, {doc['device']})",
        "",
        f"{_md(gpu)} · torch {env.get('torch')} · triton {env.get('triton')} · kiln "
        f"{env.get('kiln_git_sha', '?')} · budget {doc['budget_s']:.0f} s, used "
        f"{doc['wall_s']:.0f} s",
        "",
    ]
    if rec:
        out += [f"**Pick: `{rec['variant']}`** — {_md(sel.get('reason', ''))}", ""]
        out += [f"- {_md(w)}" for w in rec["why"]]
        out += ["", "```python", rec["code"], "```", ""]
    else:
        out += ["**No variant passed.**", ""]
    out += repair_report.markdown(doc)  # the pick's remedies as code, each break's cost
    if sel.get("tied"):
        how = (
            "no significant difference head to head"
            if sel.get("head_to_head")
            else ("overlapping intervals")
        )
        out += [f"Tied ({how}): {', '.join(f'`{t}`' for t in sel['tied'])}", ""]
    opp = sel.get("best_numerics_changing")
    # When the pick is that variant, its own bullet above already gives its error.
    if opp and opp["variant"] != sel.get("best"):
        allowed = ", ".join(doc.get("allow_precision") or []) or "none"
        out += [
            f"Opportunity: the best numerics-changing variant, `{opp['variant']}`, gave "
            f"{opp['speedup']:.2f}x with its error at {opp['worst_error_over_threshold'] or 0:.2f}"
            f" of the allowed limit ({'passed' if opp['passed'] else 'failed'} the check; "
            f"allowed precisions: {allowed}).",
            "",
        ]
    rows = trial_rows(doc)
    if rows:
        heads = list(rows[0])
        out += ["| " + " | ".join(heads) + " |", "|" + "--|" * len(heads)]
        out += ["| " + " | ".join(_md(r[h]) for h in heads) + " |" for r in rows]
        out.append("")
    versus = compare_xla.rows(doc)
    if versus:
        heads = list(versus[0])
        out += ["## Inductor vs XLA (measured in this run)", ""]
        out += ["| " + " | ".join(heads) + " |", "|" + "--|" * len(heads)]
        out += ["| " + " | ".join(_md(r[h]) for h in heads) + " |" for r in versus]
        out.append("")
    stages = doc.get("stages") or {}
    prof = stages.get("profile") or {}
    gb = stages.get("graph_breaks") or {}
    out += ["## Evidence", ""]
    out.append(f"- Profile verdict: {_md(prof.get('verdict') or prof.get('reason') or 'n/a')}")
    out.append(
        f"- Graph breaks: {gb.get('breaks')} (graphs: {gb.get('graphs')}, captured "
        f"share: {gb.get('captured_share')})"
    )
    for b in gb.get("first_breaks") or []:
        out.append(
            f"  - {_md(b.get('file'))}:{b.get('line')} {_md(b.get('category'))}: "
            f"{_md(b.get('fix'))}"
        )
    for r in (stages.get("search") or {}).get("refined") or []:
        out.append(f"- Refined the leader `{r['leader']}`: tried `{r['spec']}` ({_md(r['why'])})")
    skipped = (stages.get("search") or {}).get("skipped") or {}
    for spec, why in skipped.items():
        out.append(f"- Skipped `{spec}`: {_md(why)}")
    for spec, why in ((stages.get("search") or {}).get("deferred") or {}).items():
        if spec not in skipped:
            out.append(f"- Deferred `{spec}` at its first turn, run at its second: {_md(why)}")
    # Speedups from separate trials drift apart when eager is host-bound and a variant is not;
    # the head-to-head trials (challenger against leader in one process) do not.
    for v, h in (sel.get("head_to_head") or {}).items():
        lo, hi = h["ci95"]
        if not h["significant"]:
            verdict = "no significant difference"
        else:
            verdict = "faster" if h["speedup_over_leader"] > 1 else "slower"
        out.append(
            f"- Head to head, one process: `{v}` against `{h['leader']}`: "
            f"{h['speedup_over_leader']:.2f}x [{lo:.2f}, {hi:.2f}], {verdict}"
        )
    h2h_stage = stages.get("head_to_head") or {}
    for v, why in (h2h_stage.get("skipped") or {}).items():
        out.append(f"- Head to head skipped for `{v}`: {_md(why)}")
    env_check = stages.get("environment") or {}
    for p in env_check.get("problems") or []:
        out.append(f"- Environment: {_md(p)}")
    drift = doc.get("baseline_drift") or {}
    if drift.get("warning"):
        out.append(f"- Warning: {_md(drift['warning'])}")
    waited = host_waits(doc)
    if waited:
        (longest, variant), total = max(waited), sum(w for w, _ in waited)
        out.append(
            f"- Trials waited {total:.0f} s in all for the host (side by side, trials take turns "
            f"so that no reps are timed while a neighbour compiles); the longest wait, "
            f"{longest:.0f} s, was `{variant}`'s"
        )
    # Each trial's notes (a busy host, a recompile during the timed reps, ...), once per text.
    noted: dict[str, list[str]] = {}
    for r in [*doc["trials"], *(doc.get("head_to_head_trials") or [])]:
        for note in r.get("notes") or []:
            noted.setdefault(note, [])
            if r["variant"] not in noted[note]:
                noted[note].append(r["variant"])
    for note, variants in noted.items():
        out.append(f"- Note ({', '.join(f'`{v}`' for v in variants)}): {_md(note)}")
    return "\n".join(out) + "\n"


def host_waits(doc: dict[str, Any]) -> list[tuple[float, str]]:
    """(seconds, variant) of every trial that waited for its turn on the host (the `host_wait`
    phase of trials run side by side, runner/host_lock.py), search and head-to-head alike."""
    trials = [*doc["trials"], *(doc.get("head_to_head_trials") or [])]
    waits = [((r.get("phase_s") or {}).get("host_wait") or 0.0, r["variant"]) for r in trials]
    return [(w, v) for w, v in waits if w >= 0.5]


CSS = """body{font:14px system-ui,sans-serif;margin:24px;max-width:1100px}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 6px;font-size:12px}
pre{background:#f4f4f4;padding:10px}svg text{font:11px sans-serif}.t{font-weight:bold}
.b{fill:#4a7ab7}.w{stroke:#111;stroke-width:2}.a{stroke:#555}.p{fill:#c0392b}
.l0{stroke:#4a7ab7}.l1{stroke:#c0392b}.l2{stroke:#27ae60}.l3{stroke:#8e44ad}.l4{stroke:#d35400}
.l5{stroke:#7f8c8d}polyline{stroke-width:2}"""


def html(doc: dict[str, Any]) -> str:
    ok = [r for r in doc["trials"] if r["status"] in ("ok", "accuracy_fail")]
    sel = doc.get("selection") or {}
    rec = doc.get("recommendation")
    charts = [
        svg.hbars(
            "Step time per variant (median, 95% interval)",
            [(r["variant"], r["steady_ms"]["median"], tuple(r["steady_ms"]["ci95"])) for r in ok],
            "ms",
        ),
        svg.scatter(
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
            svg.lines(
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
        svg.hbars(
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
        charts.append(svg.hbars("Kernels per step", kern, ""))
    rows = trial_rows(doc)
    table = ""
    if rows:
        table = _html_table(rows, list(rows[0]))
    versus = compare_xla.rows(doc)
    if versus:
        heads = list(versus[0])
        table += "<h2>Inductor vs XLA (measured in this run)</h2>" + _html_table(versus, heads)
    pick = (
        (
            f"<p><b>Pick: <code>{escape(rec['variant'])}</code></b> — "
            f"{escape(sel.get('reason', ''))}</p><ul>"
            + "".join(f"<li>{escape(w)}</li>" for w in rec["why"])
            + f"</ul><pre>{escape(rec['code'])}</pre>"
        )
        if rec
        else "<p>No variant passed.</p>"
    ) + repair_report.html(doc)
    evidence = escape(markdown(doc).split("## Evidence", 1)[-1])
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>kiln tune {escape(doc['workload'])}</title><style>{CSS}</style></head><body>"
        f"<h1>kiln tune: {escape(doc['workload'])} ({escape(doc['step'])}, "
        f"{escape(doc['device'])})</h1>{pick}{table}"
        + "".join(f"<div>{c}</div>" for c in charts if c)
        + f"<h2>Evidence</h2><pre>{evidence}</pre></body></html>"
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


def write_reports(doc: dict[str, Any], out: str | Path) -> None:
    out = Path(out)
    (out / "report.md").write_text(markdown(doc))
    (out / "report.html").write_text(html(doc))


def rerender(run_dir: str | Path) -> Path:
    """`kiln report DIR`: rebuild both reports from DIR/results.json."""
    path = Path(run_dir) / "results.json"
    if not path.exists():
        from torchkiln.errors import KilnUserError

        raise KilnUserError(f"{str(path)!r} does not exist: run `kiln tune --out DIR` first")
    write_reports(json.loads(path.read_text()), run_dir)
    return Path(run_dir)
