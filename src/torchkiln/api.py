"""The public Python API."""

from __future__ import annotations

import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from torchkiln import __version__, defaults
from torchkiln.backends.distributed.config import check_dist
from torchkiln.backends.distributed.launch import run_dist_trial
from torchkiln.errors import KilnUserError
from torchkiln.report.drift import baseline_drift
from torchkiln.runner.launch import warm
from torchkiln.runner.launch.executors import (
    LocalExecutor,
    PoolExecutor,
    RayExecutor,
    TrialExecutor,
)
from torchkiln.runner.launch.trial_process import preflight, run_trial
from torchkiln.runner.protocol.trial import TrialSpec
from torchkiln.runner.store.rundir import RunDir
from torchkiln.variants import parse_variant

BENCH_SCHEMA = "torchkiln.bench/1"

DEFAULT_VARIANTS = {
    "cuda": [
        "eager",
        "inductor",
        "inductor:mode=reduce-overhead",
        "inductor:mode=max-autotune-no-cudagraphs",
    ],
    "cpu": ["eager", "inductor"],
}


def default_variants(device: str) -> list[str]:
    return list(DEFAULT_VARIANTS["cuda" if device.startswith("cuda") else "cpu"])


def resolve_preset(preset: str, device: str) -> str:
    """`auto` is `full` on a GPU and `tiny` on the CPU (torchkiln.defaults)."""
    return defaults.preset(preset, device)


class TrialEvents:
    """Progress hooks; the CLI draws a progress bar from these."""

    def preflight(self, timeout_s: float) -> None: ...
    def trial_started(self, index: int, total: int, spec: TrialSpec) -> None: ...
    def trial_phase(self, spec: TrialSpec, phase: str) -> None: ...
    def trial_finished(self, spec: TrialSpec, result: dict[str, Any], resumed: bool) -> None: ...


def placed(executor: TrialExecutor, device: str, dist: dict[str, Any] | None) -> TrialExecutor:
    """Check that trials fit where the executor puts them: a pinned trial sees its GPU as
    `cuda`, and a trial of N ranks needs N GPUs to itself."""
    nproc = dist["nproc"] if dist else 1
    if isinstance(executor, PoolExecutor) and any(s is not None for s in executor.slots):
        if device != "cuda":
            raise KilnUserError(
                f"--executor pool pins each trial to one GPU: use --device cuda, not {device!r}"
            )
        if nproc > 1:
            raise KilnUserError(
                "--executor pool gives each trial one GPU; --nproc > 1 needs "
                "--executor local (or ray)"
            )
    if isinstance(executor, RayExecutor) and executor.gpus_per_trial and nproc > 1:
        executor = replace(executor, gpus_per_trial=nproc)
    return executor


@warm.scoped()  # its trials fork from one process that imported torch
def bench(
    workload: str,
    variants: Sequence[str] | None = None,
    *,
    step: str = "infer",
    device: str = "cpu",
    preset: str = defaults.PRESET,
    baseline: str = "eager",
    batch_size: int | None = None,
    out: str | Path | None = None,
    resume: str | Path | None = None,
    timeout_s: float = defaults.TRIAL_TIMEOUT_S,
    cache_dir: str | None = None,
    events: TrialEvents | None = None,
    spec_overrides: dict[str, Any] | None = None,
    executor: TrialExecutor | None = None,
    nproc: int | None = None,
    dist: str | None = None,
    history: str | Path | bool | None = None,
) -> dict[str, Any]:
    """Measure each variant against the baseline on one workload; each trial in its own process.

    Returns the bench document (schema ``torchkiln.bench/1``) also written to the run directory.
    ``executor`` decides where trials run (default: here, one after another). ``dist``
    (``ddp`` or ``fsdp``) with ``nproc`` runs each training trial through torchrun on ``nproc``
    ranks (see docs/scale.md). The result is also appended to the history store ``history``
    (None: the default store, False: none; see docs/history.md); the returned document's
    ``history`` says where, or why it could not be.

    Raises KilnUserError for bad input (unknown names, a missing spec file, no GPU)."""
    events = events or TrialEvents()
    dist_opts = check_dist(dist, nproc, step)
    executor = placed(executor or LocalExecutor(), device, dist_opts)
    preset = resolve_preset(preset, device)
    variants = list(variants or default_variants(device))
    canonical = [parse_variant(v).spec for v in variants]  # raises on a bad spec, before work
    baseline = parse_variant(baseline).spec
    if resume:
        run = RunDir(resume)
        if run.manifest() is None:
            raise KilnUserError(f"--resume {str(resume)!r}: no manifest.json there")
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run = RunDir(out or Path("kiln-runs") / f"{stamp}-{Path(workload).stem}-{step}")
    created = not run.path.exists()
    base_spec = TrialSpec(
        workload=workload,
        variant="eager",
        baseline=baseline,
        step=step,
        device=device,
        preset=preset,
        batch_size=batch_size,
        **(spec_overrides or {}),
    )
    specs = [replace(base_spec, variant=v, index=i) for i, v in enumerate(canonical)]
    ids = [s.id for s in specs]
    info = {
        "kiln_version": __version__,
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "workload": workload,
        "step": step,
        "device": device,
        "preset": preset,
        "baseline": baseline,
        "variants": canonical,
        "executor": executor.describe(),
        **({"dist": dist_opts} if dist_opts else {}),
    }
    # Written before the workload is loaded, so that a run stopped there can be resumed.
    run.write_manifest(info, ids)
    if hasattr(events, "preflight"):  # events written before this hook have none
        events.preflight(timeout_s)
    check = preflight(base_spec, run.path / "preflight", timeout_s)
    if not check.get("ok"):
        if created:  # a refused workload leaves no run directory behind
            shutil.rmtree(run.path, ignore_errors=True)
        raise KilnUserError(check.get("message", "the workload could not be loaded"))
    by_id: dict[str, dict[str, Any]] = {}
    todo, stale = [], {}
    for spec in specs:
        done, why = run.reusable(spec)
        if done is not None:
            events.trial_finished(spec, done, resumed=True)
            by_id[spec.id] = done
        else:
            todo.append(spec)
            if why:
                stale[spec.id] = why
    order = {s.id: i for i, s in enumerate(specs)}

    def started(spec: TrialSpec) -> None:
        events.trial_started(order[spec.id], len(specs), spec)

    def finished(spec: TrialSpec, result: dict[str, Any]) -> None:
        if spec.id in stale:
            result.setdefault("notes", []).append(stale[spec.id])
        run.save_result(spec.id, result, spec)  # as each ends: a lost run keeps what finished
        run.write_manifest(info, ids)
        events.trial_finished(spec, result, resumed=False)
        by_id[spec.id] = result

    on_phase = events.trial_phase if isinstance(executor, LocalExecutor) else None
    run_one = partial(
        _bench_trial,
        run_path=str(run.path.resolve()),
        timeout_s=timeout_s,
        cache_dir=cache_dir,
        on_phase=on_phase,
        dist=dist_opts,
    )
    executor.run(todo, run_one, on_start=started, on_result=finished)
    results = [by_id[s.id] for s in specs]
    env = next((r["environment"] for r in results if r.get("environment")), None)
    doc = {
        "schema": BENCH_SCHEMA,
        **info,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "run_dir": str(run.path),
        "environment": env,
        "trials": results,
        "baseline_drift": baseline_drift(results),
    }
    from torchkiln.runner.protocol.worker import write_json

    write_json(run.path / "bench.json", doc)
    from torchkiln.history import record

    doc["history"] = record(doc, "bench", history)  # after the file: it never costs the result
    return doc


def _bench_trial(
    spec: TrialSpec,
    gpu: int | None,
    host_lock: str | None = None,
    *,
    run_path: str,
    timeout_s: float,
    cache_dir: str | None,
    on_phase: Callable[[TrialSpec, str], None] | None,
    dist: dict[str, Any] | None,
) -> dict[str, Any]:
    """One bench trial, as an executor runs it (module level, so Ray can ship it)."""
    trial_dir = RunDir(run_path).trial_dir(spec.id)
    try:
        trial_dir.mkdir(parents=True, exist_ok=True)
    except OSError:
        # A Ray node that does not share the run directory's disk: the result still travels
        # back to the driver, which writes it into the run directory.
        trial_dir = Path(tempfile.mkdtemp(prefix=f"kiln-{spec.id}-"))
    phase = None if on_phase is None else partial(on_phase, spec)
    if dist:
        return run_dist_trial(
            spec, trial_dir, timeout_s=timeout_s, cache_dir=cache_dir, gpu=gpu, **dist
        )
    return run_trial(
        spec, trial_dir, timeout_s=timeout_s, cache_dir=cache_dir, on_phase=phase, gpu=gpu,
        host_lock=host_lock,
    )  # fmt: skip


@warm.scoped()  # its trials fork from one process that imported torch
def run_trials(
    specs: Sequence[TrialSpec],
    out: str | Path,
    *,
    timeout_s: float = 900.0,
    on_result: Callable[[TrialSpec, dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run arbitrary trials (several workloads, say) each in its own process, in order."""
    run = RunDir(out)
    results = []
    for spec in specs:
        result = run_trial(spec, run.trial_dir(spec.id), timeout_s=timeout_s)
        run.save_result(spec.id, result, spec)
        if on_result:
            on_result(spec, result)
        results.append(result)
    return results
