"""The trial process:
``python -m torchkiln.runner.protocol.worker MODE SPEC.json RESULT.json PHASE``.

MODE is `trial` (measure one variant against its baseline) or `preflight` (check the workload
loads and one eager forward runs, so bad input is reported before any trial starts). The
result is written atomically; the parent treats a missing result as a crash."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from torchkiln.runner.launch.host_lock import WAIT_SHOWN_S, WAITING_SUFFIX, HostLock
from torchkiln.runner.launch.orphan import exit_with_launcher
from torchkiln.runner.protocol import cpu_quiet
from torchkiln.runner.protocol.trial import TrialSpec, base_result

# The longest a compile pauses for its neighbours' timed turns at one point (Phases.pause): the
# pause ends sooner once they all hold the turnstile or a compile that cannot pause starts, so
# this only bounds the wait for a second pausable compile to reach a pause point of its own (on
# an H200 a round of resnet50's max-autotune benchmarks took up to 16 s, kiln 388cb3a).
PAUSE_MAX_S = 30.0
# The longest a compile waits at a pause point for its own workers to finish their builds.
QUIET_MAX_S = 10.0
# The wall-clock time the launcher started this process (trial_process.py): start_s counts from it.
LAUNCHED_ENV = "KILN_LAUNCHED_AT"


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


def partial_path(result_path: str | Path) -> Path:
    """Where a trial keeps what it has measured before its last phases (see Phases.save_partial)."""
    p = Path(result_path)
    return p.with_name(p.name.replace("-result.json", "-partial.json"))


def device_idle() -> None:
    """Wait for this process's queued GPU work, if it has started CUDA (never starts it)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class Phases:
    """Writes the current phase to a file the parent polls (for progress and for saying where a
    timeout or crash happened), and, with `partial`, what the trial measured before its
    correctness check, so a trial stopped there keeps its step times."""

    def __init__(
        self, path: str | None, partial: str | Path | None = None, lock: HostLock | None = None
    ) -> None:
        self.path = path
        self.partial = partial
        self.lock = lock  # a pooled trial's turn on the host (host_lock.py)
        self.current = "start"
        self.started = time.perf_counter()
        self.started_at = time.time()
        self.seconds: dict[str, float] = {}
        # [phase, start, end] in wall-clock seconds (time.time), in order, a wait for the host
        # as its own "host_wait" entry: what a tune's record of its turns is checked against.
        self.at: list[list[Any]] = []
        # Seconds a compile paused for neighbours' timed turns (pause), and whether Inductor
        # calls pause between its rounds of benchmarks (compile_pause.install).
        self.paused_s = 0.0
        self.pause_points = False

    def __call__(self, name: str) -> None:
        if self.lock is not None:
            if self.path:
                Path(self.path).write_text(f"{name}{WAITING_SUFFIX}")
            # Trials sharing one GPU: a phase's kernels may still be queued when its turn ends,
            # and would run beside a neighbour's timed reps. The phase ends when they have.
            device_idle()
        now, wall = time.perf_counter(), time.time()
        self.seconds[self.current] = self.seconds.get(self.current, 0.0) + now - self.started
        self.at.append([self.current, round(self.started_at, 3), round(wall, 3)])
        if self.lock is not None:
            waited = self.lock.enter(name)
            self.seconds["host_wait"] = self.seconds.get("host_wait", 0.0) + waited
            if waited >= WAIT_SHOWN_S:
                self.at.append(["host_wait", round(wall, 3), round(time.time(), 3)])
            now, wall = time.perf_counter(), time.time()
        self.current, self.started, self.started_at = name, now, wall
        if self.path:
            Path(self.path).write_text(name)

    def pause(self) -> None:
        """Inside a compile, at a point where it runs nothing: let trials waiting for their
        timed turn take it (HostLock.pause_compile). The pause is host_wait, not the phase's
        time; ``paused_s`` keeps the sum, which a first call's timing leaves out."""
        if self.lock is None:
            return
        self.lock.mark_pausable()
        if not self.lock.may_pause():
            return
        # Builds of other kernel choices may still run in the compile's workers: not beside a
        # neighbour's reps. Not quiet within the limit: no pause at this point.
        if not cpu_quiet.wait_quiet(QUIET_MAX_S):
            return
        if self.path:
            Path(self.path).write_text(f"{self.current}{WAITING_SUFFIX}")
        device_idle()
        now, wall = time.perf_counter(), time.time()
        waited = self.lock.pause_compile(PAUSE_MAX_S)
        if waited > 0.0:
            self.seconds[self.current] = self.seconds.get(self.current, 0.0) + now - self.started
            self.at.append([self.current, round(self.started_at, 3), round(wall, 3)])
            self.seconds["host_wait"] = self.seconds.get("host_wait", 0.0) + waited
            self.at.append(["host_wait", round(wall, 3), round(time.time(), 3)])
            self.paused_s += time.perf_counter() - now
            self.started, self.started_at = time.perf_counter(), time.time()
        if self.path:
            Path(self.path).write_text(self.current)

    def save_partial(self, result: dict[str, Any]) -> None:
        # H200, 51e19d0: bert-base's plain default+bf16 run had its step times measured, then ran
        # past its 120 s in the correctness check's second compile, and reported nothing.
        if self.partial:
            write_json(self.partial, {**result, "phase_s": dict(self.seconds)})


# What a refused allocation says: CUDA's OutOfMemoryError, and on the CPU c10's allocator
# ("DefaultCPUAllocator: can't allocate memory: you tried to allocate ... bytes") or the
# compiled code's own check ("not enough memory"), which reach the caller as a RuntimeError,
# wrapped by Dynamo or Inductor inside a compiled forward.
OOM_MESSAGES = (
    "out of memory",
    "can't allocate memory",
    "not enough memory",
    "cannot allocate memory",
)


def _out_of_memory(exc: BaseException) -> bool:
    import torch

    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:  # the exception and what it wraps
        seen.add(id(cur))
        if isinstance(cur, (torch.OutOfMemoryError, MemoryError)):
            return True
        if any(m in str(cur).lower() for m in OOM_MESSAGES):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def classify_error(exc: BaseException, phase: str) -> str:

    from torchkiln.errors import UnsupportedVariant

    if isinstance(exc, UnsupportedVariant):
        return "unsupported"
    if _out_of_memory(exc):
        return "oom"
    module = type(exc).__module__ or ""
    if module.startswith(("torch._dynamo", "torch._inductor", "triton")):
        return "compile_error"
    if phase in ("first_call", "correctness_compile") and "BackendCompilerFailed" in repr(exc):
        return "compile_error"
    return "runtime_error"


def preflight(spec: TrialSpec) -> dict[str, Any]:
    """Load the workload and run one eager forward on the device: user errors surface here."""
    from torchkiln.errors import KilnUserError

    try:
        import torch

        if spec.device.startswith("cuda") and not torch.cuda.is_available():
            return {"ok": False, "kind": "device", "message": "--device cuda but no CUDA GPU"}
        from torchkiln.runner.protocol.executable import build_arm
        from torchkiln.variants import parse_variant

        spec.step = "infer"  # a forward is enough to tell whether the inputs fit the model
        arm = build_arm(spec, parse_variant("eager"))
        arm.step()
    except KilnUserError as exc:
        return {"ok": False, "kind": "spec", "message": str(exc)}
    except Exception as exc:  # noqa: BLE001  (every failure becomes a reported status)
        return {
            "ok": False,
            "kind": "input",
            "message": f"the example inputs do not run through the model: "
            f"{type(exc).__name__}: {exc}",
        }
    return {"ok": True}


def main(argv: list[str]) -> int:
    mode, spec_path, result_path, phase_path = argv
    lock = HostLock.from_env() if mode == "trial" else None
    # Importing torch is work another trial's timed reps must not see: shared lock from here.
    # The parent reads the phase file, so it knows the trial's clock is not running meanwhile.
    start_wait = 0.0
    if lock is not None:
        Path(phase_path).write_text(f"start{WAITING_SUFFIX}")
        start_wait = lock.enter("start")
        Path(phase_path).write_text("start")
    spec = TrialSpec.from_dict(json.loads(Path(spec_path).read_text()))
    if spec.threads:
        import torch

        torch.set_num_threads(spec.threads)
    from torchkiln.runner.protocol import workload_copies

    workload_copies.activate()
    if mode == "preflight":
        # A copy of the warm-start server's build, where it made one (warm.prebuild_request).
        write_json(result_path, {**preflight(spec), "builds": workload_copies.record()})
        return 0
    from torchkiln.runner.protocol.measure_trial import measure_trial
    from torchkiln.runner.store.fixed import fixed_dir_for

    # From the launch to here (the interpreter and kiln's imports), less the wait for the host;
    # the trial's "start" phase (torch's import) is added below.
    launched = os.environ.get(LAUNCHED_ENV)
    before_s = max(0.0, time.time() - float(launched) - start_wait) if launched else None
    phases = Phases(phase_path, partial_path(result_path), lock)
    if lock is not None:
        phases.seconds["host_wait"] = start_wait
    t0 = time.perf_counter()
    result: dict[str, Any] = base_result(spec)
    try:
        measure_trial(spec, result, phases, fixed_dir_for(Path(result_path).parent))
    except Exception as exc:  # noqa: BLE001  (every failure becomes a reported status)
        result["failed_phase"] = phases.current
        result["status"] = classify_error(exc, phases.current)
        result["reason"] = f"{type(exc).__name__} during {phases.current}: {exc}"[:4000]
        result["traceback"] = traceback.format_exc()[-8000:]
    phases("done")  # releases the host lock, if any
    result["builds"] = workload_copies.record()
    result["phase"] = result.pop("failed_phase", "done")
    result["phase_s"] = phases.seconds
    result["phase_at"] = phases.at
    if before_s is not None:
        # Start and setup: what a warm start (warm.py) forks ready and a cold one imports.
        result["start_s"] = before_s + phases.seconds.get("start", 0.0)
    result["wall_s"] = time.perf_counter() - t0
    write_json(result_path, result)
    return 0


if __name__ == "__main__":
    exit_with_launcher()  # a trial must not outlive the kiln that launched it
    sys.exit(main(sys.argv[1:]))
