"""The profile worker: runs a few steps of one arm under torch.profiler in this throwaway process,
exports the Chrome trace, and writes the metrics and the verdict as JSON.

    python -m torchkiln.diagnose.profile_worker REQUEST.json RESULT.json

The result file is rewritten after every phase, so a crash (a CUDA error, the OOM killer, a
compiler fault) still says which phase it happened in; the parent turns that into a status.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from torchkiln.diagnose.profile import TIMED_PHASES
from torchkiln.measure import host_load
from torchkiln.runner.launch.host_lock import WAIT_SHOWN_S, HostLock
from torchkiln.runner.launch.orphan import exit_with_launcher

SCHEMA = "kiln.profile/1"
DATA_WAIT = "kiln:data_wait"  # the name trace_metrics looks for
LOAD_BATCH = "kiln:load_batch"
# CUDA-graph trees record on the 2nd-3rd call and Inductor may autotune on the first ones: the
# profiled steps must come after both (measure_trial warms up the same way).
WARMUP_STEPS = 5
WARMUP_S = 0.5


class WorkloadError(Exception):
    """The request cannot run as asked (no input stream for --with-loader, a stream batch whose
    shapes differ from the example inputs): the user's to fix, reported as such."""


def _write(path: Path, result: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str))
    os.replace(tmp, path)  # atomic: the parent never reads half a file


class Batches:
    """The workload's input stream, restarted when it runs out (a finite loader's epoch ends)."""

    def __init__(self, stream: Callable[[], Iterator[Any]]) -> None:
        self.stream = stream
        self.it = iter(stream())

    def __next__(self) -> Any:
        try:
            return next(self.it)
        except StopIteration:
            self.it = iter(self.stream())
            try:
                return next(self.it)
            except StopIteration:
                raise WorkloadError("the workload's input_stream yields no batches") from None


def make_step(arm: Any, batches: Batches | None) -> Callable[[], Any]:
    """One step as a user's loop runs it: fetch the next batch (timed as data wait), copy it
    into the arm's input tensors, run the step."""
    from torch.profiler import record_function

    if batches is None:
        return arm.step

    def step() -> Any:
        with record_function(DATA_WAIT):
            batch = next(batches)
        with record_function(LOAD_BATCH):
            try:
                arm.load_batch(batch)
            except ValueError as exc:
                raise WorkloadError(
                    f"--with-loader: {exc}; profile needs stream batches shaped like the "
                    "example inputs"
                ) from exc
        return arm.step()

    return step


def warm_up(step: Callable[[], Any], device: str) -> dict[str, Any]:
    from torchkiln.measure.timer import StepTimer

    timer = StepTimer(device)
    first_s, _ = timer.time_once_s(step)  # compilation, autotuning, lazy init: kept apart
    t0 = time.perf_counter()
    n = 1
    while n < WARMUP_STEPS or time.perf_counter() - t0 < WARMUP_S:
        timer.time(step, 1)
        n += 1
    return {"first_call_s": first_s, "steps": n}


def profile_steps(step: Callable[[], Any], steps: int, device: str, trace_path: Path) -> None:
    """``steps`` back-to-back steps under the profiler (no synchronisation between them, as a
    training loop runs), after one profiler warm-up step; the queue is drained before the first
    profiled step and inside the last, so the window holds exactly their device work."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    exported: list[Path] = []

    def ready(prof: Any) -> None:
        prof.export_chrome_trace(str(trace_path))
        exported.append(trace_path)

    with profile(
        activities=activities,
        schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
        on_trace_ready=ready,
    ) as prof:
        for i in range(steps + 1):
            step()
            if cuda and i in (0, steps):
                torch.cuda.synchronize(device)
            prof.step()
    if not exported:
        raise RuntimeError("torch.profiler finished without exporting a trace")


def count_flops(arm: Any, spec: Any, variant: Any) -> int:
    """FLOPs of one step counted on eager at the variant's precision (FlopCounterMode sees aten
    ops, which a compiled graph hides); the same math as the variant's. An eager arm is
    counted as is; a compiled one is rebuilt in eager."""
    from torchkiln.measure.flops import count_flops as count
    from torchkiln.runner.protocol.executable import build_arm
    from torchkiln.runner.protocol.references import reference_variant

    if variant.backend.name != "eager":
        arm = build_arm(spec, reference_variant(variant))
        arm.step()  # lazy initialisation outside the counter
    return count(arm.step)


def take_turn(lock: HostLock | None, name: str, result: dict[str, Any]) -> None:
    """The turn phase ``name`` needs (exclusive when timed), its wait recorded as
    ``host_wait``; this phase's queued GPU work is finished before the turn changes hands."""
    from torchkiln.runner.protocol.worker import device_idle

    if lock is None:
        return
    device_idle()
    wall = time.time()
    # As a trial's phases: a timed one waits out compiles without holding the turnstile.
    waited = lock.enter("measure" if name in TIMED_PHASES else "busy")
    phase_s = result.setdefault("phase_s", {})
    phase_s["host_wait"] = round(phase_s.get("host_wait", 0.0) + waited, 3)
    if waited >= WAIT_SHOWN_S:
        result.setdefault("phase_at", []).append(["host_wait", round(wall, 3), _now()])


def _now() -> float:
    return round(time.time(), 3)


def _phase(
    result: dict[str, Any],
    name: str,
    out: Path,
    fn: Callable[[], None],
    lock: HostLock | None = None,
) -> bool:
    from torchkiln.runner.protocol.worker import classify_error, device_idle

    take_turn(lock, name, result)
    start, wall = time.perf_counter(), _now()
    result["phase"] = name
    _write(out, result)
    try:
        fn()
        ok = True
    except WorkloadError as exc:
        result.update(status="workload-error", error=str(exc))
        ok = False
    except Exception as exc:  # noqa: BLE001  (user code may raise anything: it becomes a status)
        result["status"] = classify_error(exc, name)
        result["error"] = f"{type(exc).__name__} during {name}: {exc}"[:4000]
        result["traceback"] = "".join(traceback.format_exception(exc)[-8:])
        ok = False
    if lock is not None:
        device_idle()  # the phase ends when its GPU work has
    result.setdefault("phase_s", {})[name] = round(time.perf_counter() - start, 3)
    # [phase, start, end], wall-clock seconds: a tune checks its turns against these.
    result.setdefault("phase_at", []).append([name, wall, _now()])
    _write(out, result)
    return ok


def run(req: dict[str, Any], out: Path, lock: HostLock | None = None) -> dict[str, Any]:
    import torch

    from torchkiln.diagnose.trace_metrics import analyze
    from torchkiln.diagnose.verdict import classify
    from torchkiln.errors import KilnUserError
    from torchkiln.measure.environment import collect
    from torchkiln.measure.flops import peak_tflops
    from torchkiln.measure.kernels import load_trace_events
    from torchkiln.runner.protocol.executable import build_arm
    from torchkiln.runner.protocol.trial import TrialSpec
    from torchkiln.variants import parse_variant

    device = req["device"]
    result: dict[str, Any] = {"schema": SCHEMA, "status": "running", "request": req}
    result["environment"] = collect(device)
    variant = parse_variant(req["variant"])
    spec = TrialSpec(
        workload=req["workload"],
        variant=variant.spec,
        step=req["step"],
        device=device,
        preset=req["preset"],
        batch_size=req.get("batch_size"),
        seed=req.get("seed", 0),
    )
    torch.backends.cudnn.benchmark = False  # the trial runner's setting: same kernels as bench
    trace_path = Path(req["trace_path"])
    state: dict[str, Any] = {}

    def build() -> None:
        try:
            arm = build_arm(spec, variant)
        except KilnUserError as exc:
            raise WorkloadError(str(exc)) from exc
        batches = None
        if req.get("with_loader"):
            if arm.workload.input_stream is None:
                raise WorkloadError(
                    f"--with-loader: workload {req['workload']!r} has no input_stream; give its "
                    "Workload an input_stream (a callable yielding batches) to time data loading"
                )
            batches = Batches(arm.workload.input_stream)
        state["arm"], state["step"] = arm, make_step(arm, batches)
        result["workload"] = {"name": arm.workload.name, "step": arm.workload.step}

    def warmup() -> None:
        from torchkiln.measure.timer import StepTimer

        state["load_before"] = host_load.snapshot()
        result["warmup"] = warm_up(state["step"], device)
        # The same loop timed without the profiler: its overhead on host-bound steps is real
        # (a few us per op), so the report shows both.
        result["unprofiled_ms_per_step"] = StepTimer(device).time(state["step"], req["steps"])

    def profile() -> None:
        profile_steps(state["step"], req["steps"], device, trace_path)
        result["trace_bytes"] = trace_path.stat().st_size
        # As bench and tune do: a busy host slows host-bound steps, profiled or not (a step read
        # 4.5x slower without the profiler than with it while the host was compiling).
        own = torch.get_num_threads() if device == "cpu" else 1
        result["host_load"], state["host_note"] = host_load.reading(
            state.pop("load_before", None), own
        )

    def analyse() -> None:
        metrics = analyze(load_trace_events(str(trace_path)))
        backend = variant.backend
        context = {
            "backend": backend.name,
            "precision": variant.precision,
            "cudagraphs": bool(backend.uses_cudagraphs),
        }
        result["metrics"] = metrics
        result["verdict"] = classify(metrics, context)
        if state.get("host_note"):
            result["verdict"]["notes"].append(state["host_note"])
        if device.startswith("cuda") and metrics["gpu"] is None:
            result["verdict"]["notes"].append(
                "the run was on CUDA but the trace holds no GPU activity: CUPTI may be "
                "unavailable to this process (permissions, a second profiler attached)"
            )

    def flops() -> None:
        arm = state.pop("arm")
        del state["step"]
        if variant.backend.name != "eager":
            del arm  # free the compiled arm's memory before the eager one is built
            arm = None
        per_step = count_flops(arm, spec, variant)
        # Against the unprofiled step time: the profiler's per-op cost is not the model's.
        step_ms = result["unprofiled_ms_per_step"]
        achieved = per_step / (step_ms * 1e-3) / 1e12 if per_step and step_ms else None
        gpu = result["environment"].get("gpu") or {}
        peak, source = peak_tflops(gpu.get("name"), variant.precision)
        pct = 100.0 * achieved / peak if achieved and peak else None
        result["flops"] = {
            "per_step": per_step,
            "step_ms": step_ms,
            "achieved_tflops": achieved,
            "peak_tflops": peak,
            "peak_source": source,
            "pct_of_peak": pct,
        }
        result["verdict"]["evidence"].update(achieved_tflops=achieved, pct_of_peak=pct)

    for name, fn in (("build", build), ("warmup", warmup), ("profile", profile)):
        if not _phase(result, name, out, fn, lock):
            return result
    if not _phase(result, "analyze", out, analyse, lock):
        return result
    if req.get("count_flops", True) and not _phase(result, "flops", out, flops, lock):
        # The verdict stands without FLOPs: report the failure, keep the profile.
        result["flops"] = {"error": result.pop("error", None)}
        result.pop("traceback", None)
    result["status"] = "ok"
    result["phase"] = "done"
    _write(out, result)
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    req = json.loads(Path(args[0]).read_text())
    out = Path(args[1])
    _write(out, {"schema": SCHEMA, "status": "running", "request": req, "phase": "start"})
    # Importing torch is busy work too: a shared turn from here (none without a lock file).
    lock = HostLock.from_env()
    if lock is not None:
        lock.enter("start")
    try:
        run(req, out, lock)
    finally:
        if lock is not None:
            lock.close()
    return 0


if __name__ == "__main__":
    exit_with_launcher()  # ends with the kiln that launched it (runner/launch/orphan.py)
    sys.exit(main())
