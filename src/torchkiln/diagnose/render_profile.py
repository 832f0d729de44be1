"""The terminal view of a profile: the verdict and its next step first, then the layers."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from torchkiln.console import make_console


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g} ms"


def _us(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g} us"


def _header(con: Console, doc: dict[str, Any]) -> None:
    req = doc.get("request", {})
    con.print(
        f"[bold]kiln profile[/] {escape(str(req.get('workload')))} "
        f"[dim]({escape(str(req.get('variant')))}, {req.get('step')}, {req.get('device')}, "
        f"{req.get('steps')} steps{', with loader' if req.get('with_loader') else ''})[/]"
    )


def _gpu(con: Console, m: dict[str, Any]) -> None:
    gpu = m["gpu"]
    idle = gpu["idle"]
    con.print(
        f"GPU      busy {_ms(gpu['busy_ms_per_step'])} per step ({_pct(gpu['busy_share'])}); "
        f"idle {_pct(gpu['idle_share'])}: waiting for the host {_pct(idle['host'])}, "
        f"between kernels {_pct(idle['between_kernels'])}, for data {_pct(idle['data_wait'])}"
        + (f", unattributed {_pct(idle['unattributed'])}" if idle["unattributed"] else "")
    )
    small = gpu["small_kernels"]
    con.print(
        f"kernels  {gpu['kernels_per_step']:.0f} per step, mean {_us(gpu['mean_kernel_us'])}; "
        f"{_pct(small['count_share'])} shorter than {small['threshold_us']:.0f} us, taking "
        f"{_pct(small['time_share'])} of kernel time; mix: math "
        f"{_pct(gpu['kernel_mix']['math'])}, memory {_pct(gpu['kernel_mix']['memory'])}"
    )
    launch = gpu["launch"]
    ratio = launch["api_to_kernel_time"]
    parts = []
    if launch["calls_per_step"]:
        parts.append(
            f"{launch['calls_per_step']:.0f} kernel launches per step, "
            f"{_us(launch['mean_api_us'])} each on the host; host launch time / kernel time "
            f"{'n/a' if ratio is None else format(ratio, '.2f')}; kernels start "
            f"{_us(launch['mean_queue_us'])} after their launch"
        )
    if launch["graph_launches_per_step"]:
        parts.append(
            f"{launch['graph_launches_per_step']:.0f} CUDA-graph replays per step running "
            f"{launch['graph_kernels_per_step']:.0f} kernels"
        )
    con.print("launch   " + ("; ".join(parts) or "no launch calls in the trace"))
    table = Table("top kernels", "class", "ms/step", "share", "calls", box=None)
    table.columns[0].no_wrap = True
    table.columns[0].overflow = "ellipsis"
    table.columns[0].max_width = 64
    for k in gpu["top_kernels"][:8]:
        table.add_row(
            escape(k["name"]),
            k["class"],
            f"{k['ms_per_step']:.3f}",
            _pct(k["share_of_device_time"]),
            f"{k['calls_per_step']:.0f}",
        )
    con.print(table)


def render(doc: dict[str, Any], console: Console | None = None) -> None:
    con = console or make_console()
    _header(con, doc)
    if doc.get("status") != "ok":
        con.print(f"[red]profile {doc.get('status')}[/]: {escape(str(doc.get('error', '')))}")
        return
    v = doc["verdict"]
    m = doc["metrics"]
    con.print(f"verdict  [bold]{v['kind']}[/] [dim](confidence {v['confidence']})[/]")
    con.print(f"         {escape(v['explanation'])}")
    con.print(f"next     [green]{escape(v['next_step'])}[/]")
    unprofiled = doc.get("unprofiled_ms_per_step")
    con.print(
        f"step     {_ms(m['wall_ms_per_step'])} under the profiler"
        + (f", {_ms(unprofiled)} without" if unprofiled else "")
        + f"; waiting for data {_pct(m['data_wait']['share'])}; host in aten ops "
        f"{_pct(m['host']['in_ops_share'])}, blocked in device syncs "
        f"{_pct(m['host']['sync_share'])}"
    )
    if m["gpu"] is not None:
        _gpu(con, m)
    table = Table("top host ops (self time)", "ms/step", "share", "calls", box=None)
    table.columns[0].no_wrap = True
    table.columns[0].overflow = "ellipsis"
    table.columns[0].max_width = 64
    for op in m["host"]["top_ops"][:8]:
        table.add_row(
            escape(op["name"]),
            f"{op['self_ms_per_step']:.3f}",
            _pct(op["share_of_step"]),
            f"{op['calls_per_step']:.0f}",
        )
    con.print(table)
    flops = doc.get("flops") or {}
    if flops.get("achieved_tflops"):
        peak = (
            f", {flops['pct_of_peak']:.1f}% of the {flops['peak_tflops']:.0f} TFLOP/s peak"
            if flops.get("pct_of_peak")
            else ""
        )
        con.print(f"FLOP/s   {flops['achieved_tflops']:.3g} TFLOP/s achieved{peak}")
    for note in v.get("notes", []):
        con.print(f"[yellow]note[/]     {escape(note)}")
    if doc.get("trace"):
        con.print(f"trace    {escape(doc['trace'])} [dim](open in https://ui.perfetto.dev)[/]")
