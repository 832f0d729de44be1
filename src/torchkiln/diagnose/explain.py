"""`kiln explain WORKLOAD`: graph breaks (located, categorized, with a fix), graphs and captured
share, recompilations over several shapes, CUDA-graph skips; runs Dynamo in its own process."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from torchkiln.cli_args import positive_float, positive_int
from torchkiln.defaults import PRESET, PRESETS
from torchkiln.diagnose._subproc import run_json_worker
from torchkiln.diagnose.render_explain import render
from torchkiln.errors import KilnUserError

WORKER = "torchkiln.diagnose.explain_worker"
DEFAULT_TIMEOUT_S = 600.0
TLPARSE_TIMEOUT_S = 120.0


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ints") from exc
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give positive batch sizes, e.g. 2,3,4")
    return values


def _variant_request(spec: str) -> dict[str, Any]:
    """What explain takes from a variant: its dynamic setting and whether it uses CUDA graphs."""
    from torchkiln.variants import parse_variant

    variant = parse_variant(spec)  # VariantSpecError is a KilnUserError: exit 2 with the choices
    backend = variant.backend
    dynamic = {"auto": None, "true": True, "false": False}.get(getattr(backend, "dynamic", "auto"))
    req: dict[str, Any] = {"variant": variant.spec, "dynamic": dynamic, "cudagraphs": False}
    if backend.uses_cudagraphs:
        req.update(cudagraphs=True, compile_kwargs=backend.compile_kwargs)
    return req


def _run_tlparse(trace_dir: Path) -> dict[str, Any]:
    logs = sorted(trace_dir.glob("*.log"), key=lambda p: p.stat().st_mtime)
    info: dict[str, Any] = {"dir": str(trace_dir), "log_files": [str(p) for p in logs]}
    exe = shutil.which("tlparse")
    if not logs:
        info["tlparse"] = {"status": "no-log", "error": "the worker wrote no TORCH_TRACE log"}
    elif exe is None:
        info["tlparse"] = {
            "status": "not-installed",
            "remedy": "pip install tlparse, then rerun with --trace for the HTML report",
        }
    else:
        out_dir = trace_dir / "tlparse"
        cmd = [exe, str(logs[-1]), "-o", str(out_dir), "--overwrite", "--no-browser"]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=TLPARSE_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            info["tlparse"] = {"status": "timeout", "error": f"over {TLPARSE_TIMEOUT_S:.0f} s"}
            return info
        if proc.returncode == 0:
            info["tlparse"] = {"status": "ok", "index": str(out_dir / "index.html")}
        else:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            info["tlparse"] = {"status": "error", "error": "\n".join(tail)}
    return info


def explain(
    workload: str,
    *,
    preset: str = PRESET,
    variant: str = "inductor",
    batch_sizes: list[int] | None = None,
    recompiles: bool = True,
    recompile_limit: int | None = None,
    device: str | None = None,
    trace_dir: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    stream: str | None = None,
    stream_len: int | None = None,
) -> dict[str, Any]:
    """Explain how Dynamo captures ``workload``; returns the JSON-able report.

    ``stream`` (a JSONL trace of sizes) or ``stream_len`` (items of the workload's default
    stream) replays that stream for the recompilation report instead of batch sizes; a bad
    trace raises KilnUserError naming its line before the worker starts.

    ``status`` is ``ok``, ``phase-error`` (a phase raised; the others still report), ``timeout``
    or ``crashed``. A spec that names no workload raises KilnUserError. ``device`` and
    ``preset`` default as every command's do (torchkiln.defaults)."""
    from torchkiln import defaults

    device = defaults.device(device)
    preset = defaults.preset(preset, device)
    if stream is not None or stream_len is not None:
        from torchkiln.tune.stream_search import load_stream

        load_stream(workload, preset, None, stream, stream_len)  # checked here: one line, exit 2
        stream = None if stream is None else str(Path(stream).resolve())
    req: dict[str, Any] = {
        "workload": workload,
        "preset": preset,
        "batch_sizes": batch_sizes,
        "recompiles": recompiles,
        "recompile_limit": recompile_limit,
        "stream": stream,
        "stream_len": stream_len,
        "device": device,
        **_variant_request(variant),
    }
    env: dict[str, str | None] = {}
    trace_path = None
    if trace_dir:
        trace_path = Path(trace_dir).resolve()
        trace_path.mkdir(parents=True, exist_ok=True)
        env["TORCH_TRACE"] = str(trace_path)
    with tempfile.TemporaryDirectory(prefix="kiln-explain-") as tmp:
        proc, report = run_json_worker(WORKER, req, tmp, timeout=timeout, env=env)
        if report is None:
            report = {"schema": "kiln.explain/1", "request": req, "phases": {}}
    report["worker"] = {"elapsed_s": round(proc.elapsed_s, 3), "returncode": proc.returncode}
    if proc.timed_out:
        report["status"] = "timeout"
        running = [n for n, p in report.get("phases", {}).items() if p.get("status") == "running"]
        where = f" during the {running[0]} phase" if running else ""
        report["error"] = f"the explain worker did not finish within {timeout:.0f} s{where}"
    elif proc.returncode != 0 or report.get("status") in (None, "running"):
        report["status"] = "crashed"
        report["error"] = (
            f"the explain worker exited with code {proc.returncode}:\n{proc.tail()}".rstrip()
        )
    if report.get("status") == "workload-error":
        raise KilnUserError(report.get("error", "the workload could not be loaded"))
    if trace_path is not None:
        report["trace"] = _run_tlparse(trace_path)
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "workload", help="a registered name, path/to/file.py:factory or pkg.module:factory"
    )
    parser.add_argument(
        "--preset",
        choices=PRESETS,
        default=PRESET,
        help="workload size: auto = full on a GPU, tiny on the CPU (default %(default)s)",
    )
    parser.add_argument(
        "--variant",
        default="inductor",
        help="variant spec; its dynamic= setting is used, and mode=reduce-overhead (or the "
        "cudagraphs backend) adds the reasons CUDA graphs were skipped (default inductor)",
    )
    parser.add_argument(
        "--batch-sizes",
        type=_int_list,
        metavar="B1,B2,...",
        help="batch sizes to run for the recompilation report "
        "(default: the workload's input stream if it has one, else 2,3,4)",
    )
    parser.add_argument(
        "--no-recompiles", action="store_true", help="skip the recompilation report"
    )
    parser.add_argument(
        "--recompile-limit",
        type=positive_int,
        metavar="N",
        help="set Dynamo's recompile limit for the recompilation run (default: torch's)",
    )
    parser.add_argument(
        "--stream",
        metavar="FILE.jsonl",
        help="replay this trace of sizes (docs/streams.md) for the recompilation report: which "
        "guard and dim each recompile changed, how often, and whether the limit was hit",
    )
    parser.add_argument(
        "--stream-len",
        type=int,
        default=None,
        help="items of the stream (default: the whole trace, or 200 of the workload's default)",
    )
    parser.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if present)")
    parser.add_argument(
        "--trace",
        metavar="DIR",
        help="also write the TORCH_TRACE structured log to DIR, and tlparse's HTML report "
        "to DIR/tlparse where tlparse is installed",
    )
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON ('-': stdout)")
    parser.add_argument(
        "--fullgraph-check",
        action="store_true",
        help="exit 1 when the workload has any graph break (for CI)",
    )
    parser.add_argument(
        "--fix",
        action="store_true",
        help="print the source rewrites for the breaks as a unified diff on stdout (for "
        "`git apply` or `patch -p1` in the project root) instead of the report; what is left "
        "alone, and the configuration remedies, go to stderr. Nothing is modified",
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds before the worker is stopped (default {DEFAULT_TIMEOUT_S:.0f})",
    )


def exit_code(report: dict[str, Any], fullgraph_check: bool) -> int:
    """1 when the explanation did not complete, or (with --fullgraph-check) any break exists."""
    if report.get("status") != "ok":
        return 1
    if fullgraph_check and report.get("breaks"):
        return 1
    return 0


def run(args: argparse.Namespace) -> int:
    from torchkiln import defaults
    from torchkiln.cli_args import check_inputs

    check_inputs(args, dirs=("trace",), files=("json",))
    args.device = defaults.device(args.device)
    report = explain(
        args.workload,
        preset=defaults.preset(args.preset, args.device),
        variant=args.variant,
        batch_sizes=args.batch_sizes,
        recompiles=not args.no_recompiles,
        recompile_limit=args.recompile_limit,
        device=args.device,
        trace_dir=args.trace,
        timeout=args.timeout,
        stream=args.stream,
        stream_len=args.stream_len,
    )
    code = exit_code(report, args.fullgraph_check)
    report["fullgraph_check"] = (
        None if not args.fullgraph_check else ("pass" if code == 0 else "fail")
    )
    if args.json and args.json != "-":
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    if getattr(args, "fix", False):
        from torchkiln.repair.explain_fix import print_fix

        return print_fix(args.workload, report, code)
    if args.json == "-":
        print(json.dumps(report, indent=2, default=str))
    else:
        render(report, fullgraph_check=args.fullgraph_check)
    return code
