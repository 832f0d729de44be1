"""The terminal view of an explain report: source lines shown, fixes highlighted."""

from __future__ import annotations

import os
import re
from typing import Any

from rich.console import Console
from rich.markup import escape

from torchkiln.console import make_console

_RESUME = re.compile(r"^torch_dynamo_resume_in_(?P<fn>.+)_at_(?P<line>\d+)$")


def _where(path: str | None, line: int | None) -> str:
    if not path:
        return "?"
    try:
        rel = os.path.relpath(path)
        path = rel if not rel.startswith("..") else path
    except ValueError:
        pass  # a different drive on Windows: the absolute path is the honest answer
    return f"{path}:{line}" if line else path


def _function(name: str, line: int | None) -> str:
    """Dynamo names the code after a break `torch_dynamo_resume_in_forward_at_16`."""
    m = _RESUME.match(name)
    return f"{m.group('fn')} (resumed after line {m.group('line')})" if m else name


def _pct(share: float | None) -> str:
    return "n/a" if share is None else f"{100 * share:.0f}%"


def _render_graphs(con: Console, report: dict[str, Any]) -> None:
    graphs = report.get("graphs")
    if not graphs:
        return
    breaks = report.get("breaks", [])
    con.print(
        f"[bold]{graphs['count']}[/] graph(s), [bold]{len(breaks)}[/] graph break(s); "
        f"[bold]{_pct(graphs['captured_share'])}[/] of the model's ops captured "
        f"[dim]({graphs['captured_aten_ops']} aten ops ran in graphs; eager runs "
        f"{graphs['eager_aten_ops']})[/]"
    )
    per = graphs.get("per_graph", [])
    if per:
        ops = ", ".join(str(g["ops"]) for g in per)
        con.print(f"  ops per graph (FX nodes): {ops}")


def _render_breaks(con: Console, breaks: list[dict[str, Any]]) -> None:
    if not breaks:
        con.print("[green]No graph breaks: Dynamo captures the whole forward in one graph.[/]")
        return
    con.print()
    con.print(f"[bold]Graph breaks ({len(breaks)})[/]")
    for i, b in enumerate(breaks, 1):
        ident = " ".join(filter(None, [b.get("gb_id"), b.get("doc_url")]))
        times = f" x{b['count']}" if b.get("count", 1) > 1 else ""
        con.print(
            f"[bold]{i}.[/] [cyan]{escape(_where(b['file'], b['line']))}[/] in "
            f"{escape(b['function'])}{times}  [magenta]\\[{escape(b['category_title'])}][/]"
        )
        if b.get("source"):
            con.print(f"     [dim]{b['line']:>4} │[/] {escape(b['source'])}")
        con.print(
            f"     reason: {escape(b['gb_type'])}" + (f"  [dim]{escape(ident)}[/]" if ident else "")
        )
        con.print(f"     [bold green]fix:[/] [green]{escape(b['fix'])}[/]")


def _render_recompiles(con: Console, rec: dict[str, Any] | None) -> None:
    if not rec:
        return
    con.print()
    fell = f", {rec['fallbacks']} fell back to eager" if rec.get("fallbacks") else ""
    con.print(f"[bold]Recompilations over {escape(rec['source'])}: {rec['count']}{fell}[/]")
    if rec.get("note"):
        con.print(f"  [yellow]{escape(rec['note'])}[/]")
    for g in rec.get("by_guard") or []:
        what = f"{g['input']} dim {g['dim']}" if g.get("dim") is not None else g["guard"]
        eager = f", {g['fell_back_to_eager']} ran in eager" if g.get("fell_back_to_eager") else ""
        con.print(f"  {escape(g['function'])}: {escape(what)} changed {g['count']}x{eager}")
    if rec["recompilations"]:
        for r in rec["recompilations"]:
            reason = r["reason"] if len(r["reason"]) <= 160 else r["reason"][:157] + "..."
            con.print(
                f"  {escape(r['trigger'])}: {escape(_function(r['function'], r['line']))} "
                f"[dim]({escape(_where(r['file'], r['line']))})[/]"
            )
            con.print(f"     guard failed: [yellow]{escape(reason)}[/]")
            if r.get("fell_back_to_eager"):
                con.print("     [bold red]not recompiled: recompile limit reached, ran in eager[/]")
        fixes = list(dict.fromkeys(r["fix"] for r in rec["recompilations"]))
        for fix in fixes:
            con.print(f"  [bold green]fix:[/] [green]{escape(fix)}[/]")
    if rec.get("warning"):
        con.print(f"[bold red]warning:[/] {escape(rec['warning'])}")
    cost = rec.get("stream_cost") or {}
    if cost.get("compile_share") is not None:
        con.print(
            f"  Dynamo's tracing took {cost['compile_share']:.0%} of the replay "
            "(a lower bound: Inductor's code generation, not run by explain, comes on top)"
        )
    for v in cost.get("verdicts") or []:
        con.print(f"[bold red]verdict:[/] {escape(v)}")


def _render_cudagraphs(con: Console, cg: dict[str, Any] | None) -> None:
    if not cg:
        return
    con.print()
    label = escape(str(cg.get("mode") or "cudagraphs backend"))
    con.print(f"[bold]CUDA graphs ({label}): {cg['status']}[/]")
    if cg.get("note"):
        con.print(f"  {escape(cg['note'])}")
    for s in cg.get("skips", []):
        con.print(f"  [yellow]{escape(s['kind'])}[/]: {escape(s['reason'].splitlines()[0])}")
        con.print(f"    [bold green]fix:[/] [green]{escape(s['fix'])}[/]")


def _render_trace(con: Console, trace: dict[str, Any] | None) -> None:
    if not trace:
        return
    con.print()
    logs = trace.get("log_files") or []
    con.print(f"[bold]Trace[/]: {escape(trace['dir'])} ({len(logs)} TORCH_TRACE log file(s))")
    tl = trace.get("tlparse", {})
    if tl.get("status") == "ok":
        con.print(f"  tlparse report: {escape(tl['index'])}")
    else:
        detail = tl.get("remedy") or tl.get("error") or ""
        con.print(f"  tlparse: {escape(tl.get('status', '?'))}  {escape(detail)}")


def render(
    report: dict[str, Any], *, fullgraph_check: bool = False, console: Console | None = None
) -> None:
    con = console or make_console(highlight=False)
    req = report.get("request", {})
    env = report.get("environment", {})
    wl = report.get("workload", {})
    con.print(
        f"[bold]kiln explain[/] {escape(str(req.get('workload', '?')))}  "
        f"[dim]torch {escape(str(env.get('torch', '?')))}"
        f" · {escape(str(wl.get('device', '?')))}"
        f" · variant {escape(str(req.get('variant', '?')))}"
        f" · inputs {escape(str(wl.get('input_shapes', '?')))}[/]"
    )
    _render_graphs(con, report)
    if "graphs" in report:  # without the capture phase there is no break count to claim
        _render_breaks(con, report.get("breaks", []))
    _render_recompiles(con, report.get("recompiles"))
    _render_cudagraphs(con, report.get("cudagraphs"))
    _render_trace(con, report.get("trace"))
    for name, phase in report.get("phases", {}).items():
        if phase.get("status") == "error":
            con.print(f"[bold red]{escape(name)} phase failed:[/] {escape(phase['error'])}")
    if report.get("status") in ("timeout", "crashed"):
        con.print(f"[bold red]{report['status']}:[/] {escape(report.get('error', ''))}")
    if fullgraph_check:
        n = len(report.get("breaks", []))
        if report.get("status") != "ok":
            con.print("[bold red]fullgraph check: FAIL[/] (the explanation did not complete)")
        elif n:
            con.print(f"[bold red]fullgraph check: FAIL[/] ({n} graph break(s))")
        else:
            con.print("[bold green]fullgraph check: PASS[/] (no graph breaks)")
