"""`kiln doctor`: can this environment compile and measure? Each check: ok / info / warn / fail,
the evidence, and a one-sentence remedy. Exit code 1 when any check fails.

The two slow checks (a real Triton kernel, a real Inductor compile) run in fresh processes, in
parallel with the rest, so the whole doctor stays within a minute on a 2-core CPU machine
(Inductor's cold C++ compile alone is ~15-25 s there).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from torchkiln.cli_args import positive_float
from torchkiln.diagnose._subproc import run_module
from torchkiln.diagnose.doctor_checks import (
    EXTRAS,
    STATUSES,
    Check,
    check_cache_dirs,
    check_cxx,
    check_extra,
    check_gpu,
    check_python,
    check_torch,
    check_triton,
)

SCHEMA = "kiln.doctor/1"
DEFAULT_PROBE_TIMEOUT_S = 50.0
PROBES = "torchkiln.diagnose.probes"


def _probe(name: str, probe: str, env: dict[str, str | None], timeout: float) -> Check:
    """Run one probe process and turn its JSON line, exit code or timeout into a Check."""
    proc = run_module(PROBES, [probe], timeout=timeout, env=env)
    if proc.timed_out:
        return Check(
            name,
            "warn",
            f"did not finish within {timeout:.0f} s (a loaded machine, or a hang)",
            f"Rerun `kiln doctor --timeout {2 * timeout:.0f}`; if it still hangs, run "
            f"`python -m {PROBES} {probe}` to see where.",
        )
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        return Check(
            name,
            "fail",
            f"the probe process exited with code {proc.returncode} without a result:\n"
            f"{proc.tail(8)}",
            f"Run `python -m {PROBES} {probe}` to see the crash and report it.",
        )
    if result["ok"]:
        return Check(name, "ok", result["evidence"])
    return Check(name, "fail", result["error"] or result["evidence"], _REMEDIES[name])


_REMEDIES = {
    "triton-kernel": "Install the Triton version torch requires and make sure the CUDA "
    "toolchain (ptxas) it bundles can run; see the evidence for the failing step.",
    "inductor": "Fix the compiler error in the evidence (on CPU: a C++ compiler with OpenMP; on "
    "GPU: a Triton that matches torch); until then use the eager variant.",
}


def _triton_probe(has_gpu: bool, triton_ok: bool, timeout: float) -> Check:
    if not triton_ok:
        return Check(
            "triton-kernel",
            "warn",
            "skipped: triton is not importable",
            "Fix the `triton` check first.",
        )
    # No GPU: Triton's interpreter runs the same kernel on CPU tensors, which still proves the
    # language front end and kiln's kernels work here; a GPU build is checked for real.
    env: dict[str, str | None] = {"TRITON_INTERPRET": None if has_gpu else "1"}
    return _probe("triton-kernel", "triton", env, timeout)


def _inductor_probe(timeout: float) -> Check:
    # A fresh cache directory, so the compiler really runs instead of a cache hit answering.
    with tempfile.TemporaryDirectory(prefix="kiln-doctor-inductor-") as cache:
        env: dict[str, str | None] = {"TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": None}
        return _probe("inductor", "inductor", env, timeout)


def _guarded(name: str, fn: Callable[[], Check]) -> Check:
    """A check whose own code raised is reported as failed with the exception, not a traceback."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001  (any failure becomes this check's status)
        return Check(
            name,
            "fail",
            f"the check itself raised {type(exc).__name__}: {exc}",
            "Report this to kiln with the evidence; the environment may be unusual.",
        )


def run_doctor(probe_timeout: float = DEFAULT_PROBE_TIMEOUT_S) -> dict[str, Any]:
    """Run every check; returns the JSON-able report (``checks`` in a fixed order)."""
    start = time.perf_counter()
    checks: dict[str, Check] = {}
    checks["python"] = _guarded("python", check_python)
    checks["torch"] = _guarded("torch", check_torch)
    torch_ok = checks["torch"].status != "fail"
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures: dict[str, Future[Check]] = {}
        if torch_ok:
            futures["inductor"] = pool.submit(
                _guarded, "inductor", lambda: _inductor_probe(probe_timeout)
            )
            checks["gpu"] = _guarded("gpu", check_gpu)
            has_gpu = checks["gpu"].details.get("count", 0) > 0
            checks["triton"] = _guarded("triton", lambda: check_triton(has_gpu))
            triton_ok = bool(checks["triton"].details.get("importable"))
            futures["triton-kernel"] = pool.submit(
                _guarded, "triton-kernel", lambda: _triton_probe(has_gpu, triton_ok, probe_timeout)
            )
            checks["cxx-compiler"] = _guarded("cxx-compiler", lambda: check_cxx(has_gpu))
        else:
            for name in ("gpu", "triton", "triton-kernel", "cxx-compiler", "inductor"):
                checks[name] = Check(name, "fail", "skipped: torch is not importable", "Fix torch.")
        checks["cache-dir"] = _guarded("cache-dir", check_cache_dirs)
        for extra in EXTRAS:
            checks[f"extra:{extra}"] = _guarded(f"extra:{extra}", lambda e=extra: check_extra(e))
        for name, fut in futures.items():
            checks[name] = fut.result()
    order = [
        "python", "torch", "gpu", "triton", "triton-kernel", "cxx-compiler", "inductor",
        "cache-dir", *(f"extra:{e}" for e in EXTRAS),
    ]  # fmt: skip
    ordered = [checks[n].to_json() for n in order if n in checks]
    counts = {s: sum(c["status"] == s for c in ordered) for s in STATUSES}
    return {
        "schema": SCHEMA,
        "status": "fail" if counts["fail"] else ("warn" if counts["warn"] else "ok"),
        "counts": counts,
        "elapsed_s": round(time.perf_counter() - start, 2),
        "checks": ordered,
    }


_STYLE = {"ok": "green", "info": "blue", "warn": "yellow", "fail": "bold red"}


def render(report: dict[str, Any], console: Any = None) -> None:
    from rich.markup import escape
    from rich.table import Table

    from torchkiln.console import make_console

    con = console or make_console(highlight=False)
    table = Table(title="kiln doctor", show_lines=True, title_justify="left")
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("evidence / remedy")
    for c in report["checks"]:
        style = _STYLE[c["status"]]
        cell = escape(c["evidence"])
        if c["status"] != "ok" and c["remedy"]:
            cell += f"\n[bold]→ {escape(c['remedy'])}[/]"
        table.add_row(c["name"], f"[{style}]{c['status']}[/]", cell)
    con.print(table)
    n = report["counts"]
    con.print(
        f"{n['ok']} ok, {n['info']} info, {n['warn']} warn, {n['fail']} fail "
        f"in {report['elapsed_s']:.1f} s"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", metavar="PATH", help="also write the report as JSON ('-': stdout only)"
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=DEFAULT_PROBE_TIMEOUT_S,
        help="seconds for each compile probe (default %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    from torchkiln.cli_args import check_inputs

    check_inputs(args, files=("json",))
    report = run_doctor(probe_timeout=args.timeout)
    if args.json == "-":
        print(json.dumps(report, indent=2))
    else:
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(report, indent=2))
        render(report)
    return 1 if report["counts"]["fail"] else 0
