"""`kiln profile WORKLOAD`: what limits a step, layer by layer, and what to do about it.

A few steps run under torch.profiler in their own process; the verdict (input-bound,
host/launch-bound, GPU compute- or memory-bound, balanced) comes with the numbers behind it and
the next step, and the profiler's Chrome trace is kept for Perfetto on request."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from torchkiln.cli_args import positive_float, positive_int
from torchkiln.diagnose._subproc import run_json_worker
from torchkiln.errors import KilnUserError
from torchkiln.runner.launch.compile_cache import prepare as prepare_cache

WORKER = "torchkiln.diagnose.profile_worker"
# The worker's phases whose step times are the result (its warm-up times the unprofiled steps
# too): with a lock file (a tune profiling beside its trials) they run on an exclusive turn,
# the rest on a shared one, as a trial's timed reps and other phases do (host_lock.py).
TIMED_PHASES = ("warmup", "profile")
DEFAULT_STEPS = 5
DEFAULT_TIMEOUT_S = 600.0
MAX_STEPS = 200  # a trace of 200 eager resnet50 steps is ~300 MB: more says nothing new


def _check_request(variant: str, device: str, steps: int) -> str:
    """Bad input is the user's to fix (exit 2) before any process starts; returns the
    variant's canonical spec."""
    from torchkiln.variants import parse_variant

    if not 1 <= steps <= MAX_STEPS:
        raise KilnUserError(f"--steps {steps}; give 1 to {MAX_STEPS}")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise KilnUserError("--device cuda was asked for, but no CUDA GPU is visible")
    elif device != "cpu":
        raise KilnUserError(f"--device {device!r}; choose from ['cpu', 'cuda', 'cuda:N']")
    parsed = parse_variant(variant)  # VariantSpecError is a KilnUserError listing the choices
    reason = parsed.backend.unsupported_reason(device)
    if reason:
        raise KilnUserError(f"variant {parsed.spec!r}: {reason}")
    return parsed.spec


def run_profile(
    workload: str,
    *,
    variant: str = "eager",
    step: str = "infer",
    device: str | None = None,
    preset: str = "auto",
    batch_size: int | None = None,
    steps: int = DEFAULT_STEPS,
    with_loader: bool = False,
    trace_path: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    count_flops: bool = True,
    cache_dir: str | None = None,
    host_lock: str | None = None,
) -> dict[str, Any]:
    """Profile ``steps`` steps of ``workload`` run as ``variant``; returns the JSON document.

    ``status`` is ``ok`` or why there is no verdict (``runtime_error``, ``compile_error``,
    ``oom``, ``timeout``, ``crashed``); ``verdict`` is ``{"kind", "evidence", "next_step",
    "explanation", "confidence", "notes"}`` with ``kind`` one of
    ``torchkiln.diagnose.verdict.KINDS``, or None when status is not ok. ``trace`` is where
    the Chrome trace was kept (None unless ``trace_path`` is given). Bad input (unknown
    workload or variant, no GPU for cuda, --with-loader without an input stream) raises
    KilnUserError. The compile cache is fresh per call unless ``cache_dir`` is given.
    ``host_lock`` (else KILN_HOST_TURNS's file, if set): the worker takes turns on it, its timed
    steps exclusive (host_lock.py), so they never overlap a neighbour's compile."""
    from torchkiln import defaults
    from torchkiln.runner.launch.host_lock import host_turns

    device = defaults.device(device)
    preset = defaults.preset(preset, device)
    spec = _check_request(variant, device, steps)
    req: dict[str, Any] = {
        "workload": workload,
        "variant": spec,
        "step": step,
        "device": device,
        "preset": preset,
        "batch_size": batch_size,
        "steps": steps,
        "with_loader": with_loader,
        "count_flops": count_flops,
    }
    with tempfile.TemporaryDirectory(prefix="kiln-profile-") as tmp:
        kept = Path(trace_path).resolve() if trace_path else None
        if kept is not None:
            kept.parent.mkdir(parents=True, exist_ok=True)
        req["trace_path"] = str(kept or Path(tmp) / "trace.json")
        cache = prepare_cache(Path(tmp), cache_dir)  # a plain path the C++ compiler takes
        env = {
            "TORCHINDUCTOR_CACHE_DIR": str(cache.given / "inductor"),
            "TRITON_CACHE_DIR": str(cache.given / "triton"),
            "PYTHONUNBUFFERED": "1",
        }
        try:
            proc, doc = run_json_worker(
                WORKER, req, tmp, timeout=timeout_s, env=env, own_turns=host_lock or host_turns()
            )
        finally:
            cache.remove()
        if doc is None:
            doc = {"schema": "kiln.profile/1", "request": req, "phase": "start"}
    doc["request"] = {**req, "trace_path": str(kept) if kept else None}
    doc["trace"] = str(kept) if kept is not None and kept.exists() else None
    doc["compile_cache"] = cache_dir or "fresh per call"
    doc["worker"] = {"elapsed_s": round(proc.elapsed_s, 3), "returncode": proc.returncode}
    phase = doc.get("phase", "start")
    if proc.timed_out:
        doc["status"] = "timeout"
        doc["error"] = f"the profile worker did not finish within {timeout_s:.0f} s (in {phase})"
    elif proc.returncode != 0 or doc.get("status") in (None, "running"):
        doc["status"] = "crashed"
        doc["error"] = (
            f"the profile worker exited with code {proc.returncode} during {phase}:\n{proc.tail()}"
        ).rstrip()
    if doc["status"] == "workload-error":
        raise KilnUserError(doc.get("error", "the workload could not be loaded"))
    doc.setdefault("verdict", None)
    if doc["status"] != "ok":
        doc["verdict"] = None
        doc["stderr_tail"] = proc.tail(30)
    return doc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "workload", help="a registered name, path/to/file.py:factory or pkg.module:factory"
    )
    parser.add_argument(
        "--variant",
        default="eager",
        help="variant spec, e.g. eager+bf16 or inductor:mode=reduce-overhead+bf16 (default eager)",
    )
    parser.add_argument("--step", choices=("infer", "train"), default="infer")
    parser.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if present)")
    parser.add_argument(
        "--preset",
        choices=("auto", "full", "tiny"),
        default="auto",
        help="workload size; auto = full on a GPU, tiny on the CPU",
    )
    parser.add_argument("--batch-size", type=positive_int, default=None)
    parser.add_argument(
        "--steps",
        type=positive_int,
        default=DEFAULT_STEPS,
        help=f"profiled steps, after warm-up (default {DEFAULT_STEPS})",
    )
    parser.add_argument(
        "--with-loader",
        action="store_true",
        help="feed each step from the workload's input_stream and time the wait for data",
    )
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON ('-': stdout)")
    parser.add_argument(
        "--trace", metavar="PATH", help="keep the Chrome trace here (open it in ui.perfetto.dev)"
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds before the worker is stopped (default {DEFAULT_TIMEOUT_S:.0f})",
    )
    parser.add_argument(
        "--no-flops", action="store_true", help="skip counting FLOPs (an extra eager step)"
    )


def run(args: argparse.Namespace) -> int:
    """0 with a verdict, 1 when the profile failed (its status and reason are printed)."""
    from torchkiln import defaults
    from torchkiln.cli_args import check_inputs
    from torchkiln.diagnose.render_profile import render

    check_inputs(args, files=("json", "trace"))
    device = defaults.device(args.device)
    resolve_preset = defaults.preset
    doc = run_profile(
        args.workload,
        variant=args.variant,
        step=args.step,
        device=device,
        preset=resolve_preset(args.preset, device),
        batch_size=args.batch_size,
        steps=args.steps,
        with_loader=args.with_loader,
        trace_path=args.trace,
        timeout_s=args.timeout,
        count_flops=not args.no_flops,
    )
    if args.json and args.json != "-":
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=2, default=str))
    if args.json == "-":
        print(json.dumps(doc, indent=2, default=str))
    else:
        render(doc)
    return 0 if doc["status"] == "ok" else 1
