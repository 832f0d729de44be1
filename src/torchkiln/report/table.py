"""The terminal table of a bench: variant, step time, paired speedup, compile time, memory,
kernels per step, achieved TFLOP/s and accuracy."""

from __future__ import annotations

from typing import Any

GIB = 1024**3


def fmt_ms(summary: dict | None) -> str:
    if not summary:
        return "-"
    lo, hi = summary["ci95"]
    return f"{summary['median']:.3f} [{lo:.3f}, {hi:.3f}]"


def fmt_speedup(speedup: dict | None) -> str:
    if not speedup:
        return "-"
    lo, hi = speedup["ci95"]
    text = f"{speedup['median']:.2f}x [{lo:.2f}, {hi:.2f}]"
    if not speedup["significant"]:
        text += " no significant difference"
    return text


def fmt_memory(mem: dict | None) -> str:
    if not mem:
        return "-"
    if mem.get("peak_reserved_bytes") is not None:
        return f"{mem['peak_allocated_bytes'] / GIB:.2f} / {mem['peak_reserved_bytes'] / GIB:.2f}"
    if mem.get("peak_rss_bytes") is not None:
        return f"{mem['peak_rss_bytes'] / GIB:.2f} RSS"
    return "-"


def fmt_tflops(r: dict) -> str:
    if r.get("achieved_tflops") is None:
        return "-"
    text = f"{r['achieved_tflops']:.1f}"
    if r.get("pct_of_peak") is not None:
        text += f" ({r['pct_of_peak']:.0f}%)"
    return text


def fmt_accuracy(r: dict) -> str:
    c = r.get("correctness")
    if not c and r.get("measured_before_failure"):
        return "not checked (stopped before)"
    if not c:
        return "-" if r.get("status") == "ok" else ""
    worst = c.get("worst_error_over_threshold")
    tag = "pass" if c["passed"] else "FAIL"
    return f"{tag} ({worst:.2f} of limit)" if worst is not None else tag


def rows(doc: dict[str, Any]) -> list[list[str]]:
    out = []
    for r in doc["trials"]:
        # A trial stopped after its timing keeps its step times (runner.launch.trial_process).
        if r["status"] not in ("ok", "accuracy_fail") and not r.get("measured_before_failure"):
            out.append([r["variant"], r["status"], r.get("reason") or "", "", "", "", "", "", ""])
            continue
        kernels = r.get("kernels_per_step")
        out.append(
            [
                r["variant"],
                r["status"],
                fmt_ms(r.get("steady_ms")),
                fmt_speedup(r.get("speedup")),
                f"{r['first_call_s']:.1f}" if r.get("first_call_s") is not None else "-",
                fmt_memory(r.get("memory")),
                f"{kernels:.0f}" if kernels is not None else "-",
                fmt_tflops(r),
                fmt_accuracy(r),
            ]
        )
    return out


HEADERS = [
    "variant",
    "status",
    "step ms [95% CI]",
    "speedup vs baseline [95% CI]",
    "first call s",
    "peak GiB (alloc / reserved)",
    "kernels/step",
    "TFLOP/s (% peak)",
    "accuracy",
]


def render(doc: dict[str, Any], console: Any = None) -> None:
    from rich.markup import escape
    from rich.table import Table

    if console is None:
        from torchkiln.console import make_console

        console = make_console()  # piped or captured: the table at its natural width
    title = (
        f"{doc['workload']} · {doc['step']} · {doc['device']} · preset {doc['preset']} · "
        f"baseline {doc['baseline']}"
    )
    table = Table(title=title, show_lines=False)
    for h in HEADERS:
        table.add_column(h, overflow="fold")
    for row in rows(doc):
        table.add_row(*row)
    console.print(table)
    from torchkiln.variants.base import report_sections

    for title, versus in report_sections(doc):
        side = Table(title=title)
        for h in versus[0]:
            side.add_column(h, overflow="fold")
        for r in versus:
            side.add_row(*r.values())
        console.print(side)
    for r in doc["trials"]:
        for note in r.get("notes") or []:
            console.print(f"[dim]{escape(r['variant'])}: {escape(note)}[/dim]", highlight=False)
    drift = doc.get("baseline_drift") or {}
    if drift.get("warning"):
        console.print(f"[yellow]warning: {escape(drift['warning'])}[/yellow]", highlight=False)
    env = doc.get("environment") or {}
    gpu = (env.get("gpu") or {}).get("name") or env.get("cpu") or "?"
    console.print(
        f"[dim]{gpu} · torch {env.get('torch')} · triton {env.get('triton')} · "
        f"kiln {env.get('kiln_git_sha', '?')[:12]} · run dir {doc['run_dir']}[/dim]"
    )
