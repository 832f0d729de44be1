"""`kiln tune`: environment check, eager baseline, profile verdict, graph breaks, a search over
variants within a time budget, selection, report. Reads like the diagram in DESIGN.md."""

from __future__ import annotations

import importlib
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from torchkiln import __version__
from torchkiln.errors import KilnUserError
from torchkiln.measure.environment import collect as collect_environment
from torchkiln.runner.launch import preflight, run_trial
from torchkiln.runner.rundir import RunDir
from torchkiln.runner.trial import TrialSpec
from torchkiln.runner.worker import write_json
from torchkiln.tune import recommend
from torchkiln.tune.search import Evidence, candidates, estimate_trial_s
from torchkiln.tune.select import select

TUNE_SCHEMA = "torchkiln.tune/1"


class TuneEvents:
    """Progress hooks (the CLI draws a live display from these)."""

    def stage(self, name: str, detail: str, seconds_left: float) -> None: ...
    def trial_phase(self, spec: str, phase: str, seconds_left: float) -> None: ...
    def trial_done(self, result: dict[str, Any], seconds_left: float) -> None: ...
    def skipped(self, spec: str, why: str) -> None: ...


def environment_check(device: str) -> dict[str, Any]:
    """A quick check (the full one is `kiln doctor`): can this machine compile at all?"""
    import torch

    problems = []
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise KilnUserError("--device cuda was asked for, but no CUDA GPU is visible")
        if importlib.util.find_spec("triton") is None:
            problems.append("triton is not installed: Inductor cannot generate GPU kernels")
    elif shutil.which("g++") is None and shutil.which("c++") is None:
        problems.append("no C++ compiler on PATH: Inductor cannot compile for the CPU")
    return {"ok": not problems, "problems": problems, "torch": torch.__version__}


def _profile_verdict(spec: TrialSpec, timeout_s: float) -> dict[str, Any]:
    try:
        profile = importlib.import_module("torchkiln.diagnose.profile")
    except ImportError as exc:
        return {"status": "skipped", "reason": f"kiln profile is not available ({exc})"}
    doc = profile.run_profile(
        spec.workload,
        variant="eager",
        step=spec.step,
        device=spec.device,
        preset=spec.preset,
        batch_size=spec.batch_size,
        timeout_s=timeout_s,
    )
    verdict = doc.get("verdict") or {}
    return {"status": doc.get("status", "ok"), "verdict": verdict.get("kind"), "detail": verdict}


def _graph_breaks(spec: TrialSpec, timeout_s: float) -> dict[str, Any]:
    from torchkiln.diagnose.explain import explain

    report = explain(
        spec.workload,
        preset=spec.preset,
        variant="inductor",
        recompiles=False,
        device=spec.device,
        timeout=timeout_s,
    )
    if report.get("status") not in ("ok", "phase-error"):
        return {"status": report.get("status"), "breaks": None}
    breaks = report.get("breaks") or []
    return {
        "status": report.get("status"),
        "breaks": len(breaks),
        "graphs": (report.get("graphs") or {}).get("count"),
        "captured_share": (report.get("graphs") or {}).get("captured_share"),
        "first_breaks": [
            {k: b.get(k) for k in ("file", "line", "source", "category", "fix")} for b in breaks[:5]
        ],
    }


def run_in_process(spec: TrialSpec) -> dict[str, Any]:
    """A trial in this process (the fallback when the model cannot reach a trial process)."""
    from torchkiln.runner.launch import _failure
    from torchkiln.runner.measure_trial import measure_trial
    from torchkiln.runner.worker import Phases, classify_error

    result = _failure(spec, "ok", "")
    result.update(status=None, reason=None)
    phases = Phases(None)
    try:
        measure_trial(spec, result, phases)
    except Exception as exc:  # noqa: BLE001  (every failure becomes a reported status)
        result["status"] = classify_error(exc, phases.current)
        result["reason"] = f"{type(exc).__name__} during {phases.current}: {exc}"[:4000]
    result["notes"].append("ran in the calling process: no crash isolation, shared caches")
    return result


def _stage(fn: Any, spec: TrialSpec, timeout_s: float) -> dict[str, Any]:
    """An evidence stage that fails is reported and the search goes on without its evidence."""
    try:
        return fn(spec, timeout_s)
    except KilnUserError:
        raise
    except Exception as exc:  # noqa: BLE001  (every failure becomes a reported status)
        return {"status": "error", "reason": f"{type(exc).__name__}: {exc}"[:2000]}


def _model_facts(spec: TrialSpec) -> tuple[bool, bool]:
    """(has convolutions, has repeated blocks for scope=regions)."""
    import torch.nn as nn

    from torchkiln.variants.regions import NoRepeatedBlocks, repeated_blocks
    from torchkiln.workloads import load_workload

    w = load_workload(spec.workload, preset=spec.preset, batch_size=spec.batch_size)
    conv = w.convolutional or any(isinstance(m, nn.Conv2d) for m in w.model.modules())
    try:
        repeated_blocks(w.model)
    except NoRepeatedBlocks:
        return conv, False
    return conv, True


def tune(
    workload: str = "simple",
    *,
    step: str = "infer",
    device: str = "cpu",
    preset: str = "full",
    batch_size: int | None = None,
    budget_s: float = 900.0,
    steps: int | None = None,
    allow_precision: set[str] | frozenset[str] = frozenset(),
    out: str | Path = "kiln-tune",
    events: TuneEvents | None = None,
    spec_overrides: dict[str, Any] | None = None,
    in_process: bool = False,
) -> dict[str, Any]:
    """Run the pipeline and write results.json, report.md and report.html into ``out``."""
    events = events or TuneEvents()
    t0 = time.monotonic()
    left = lambda: budget_s - (time.monotonic() - t0)  # noqa: E731
    out = Path(out)
    run = RunDir(out)
    stages: dict[str, Any] = {}
    base = TrialSpec(
        workload=workload,
        variant="eager",
        step=step,
        device=device,
        preset=preset,
        batch_size=batch_size,
        **(spec_overrides or {}),
    )

    events.stage("environment", "quick check", left())
    stages["environment"] = environment_check(device)
    check = (
        {"ok": True}
        if in_process
        else preflight(base, out / "preflight", min(300.0, max(30.0, left())))
    )
    if not check.get("ok"):
        raise KilnUserError(check.get("message", "the workload could not be loaded"))

    events.stage("baseline", "eager", left())
    results: list[dict[str, Any]] = []
    trial_ids: list[str] = []

    def run_one(spec: TrialSpec) -> dict[str, Any]:
        trial_ids.append(spec.id)
        done = run.load_result(spec.id)
        if done is None and in_process:
            done = run_in_process(spec)
        elif done is None:
            done = run_trial(
                spec,
                run.trial_dir(spec.id),
                timeout_s=max(30.0, left()),
                on_phase=lambda ph: events.trial_phase(spec.variant, ph, left()),
            )
            run.save_result(spec.id, done)
        results.append(done)
        events.trial_done(done, left())
        return done

    eager = run_one(replace(base, index=0))
    if eager["status"] != "ok":
        raise KilnUserError(f"the eager baseline failed ({eager['status']}): {eager['reason']}")

    if in_process:
        why = "an in-process model cannot be handed to the profiling and explain processes"
        stages["profile"] = {"status": "skipped", "reason": why}
        stages["graph_breaks"] = {"status": "skipped", "reason": why, "breaks": None}
    else:
        events.stage("profile", "where the eager step spends its time", left())
        stages["profile"] = _stage(_profile_verdict, base, min(300.0, left() / 4))
        events.stage("graph breaks", "kiln explain", left())
        stages["graph_breaks"] = _stage(_graph_breaks, base, min(300.0, left() / 4))
    conv, repeated = _model_facts(base)
    evidence = Evidence(
        device=device,
        step=step,
        convolutional=conv,
        has_repeated_blocks=repeated,
        graph_breaks=stages["graph_breaks"].get("breaks"),
        verdict=stages["profile"].get("verdict"),
        allow_precision=set(allow_precision),
    )
    plan = candidates(evidence)
    stages["search"] = {
        "evidence": evidence.__dict__ | {"allow_precision": sorted(allow_precision)},
        "planned": [c.spec for c in plan],
        "skipped": {},
    }

    # Estimates are updated from what each trial really took.
    overhead_s = float(eager.get("process_wall_s") or 30.0)
    default_compile_s = 20.0
    for i, cand in enumerate(plan, start=1):
        estimate = estimate_trial_s(cand, overhead_s, default_compile_s)
        if estimate > left():
            why = f"would not fit the budget (estimated {estimate:.0f} s, {left():.0f} s left)"
            stages["search"]["skipped"][cand.spec] = why
            events.skipped(cand.spec, why)
            continue
        events.stage("search", f"{cand.spec} ({i}/{len(plan)})", left())
        r = run_one(replace(base, variant=cand.spec, index=i))
        if r.get("status") == "ok" and r.get("first_call_s") is not None:
            default_compile_s = (
                max(1.0, r["first_call_s"] / cand.compile_factor)
                if (cand.compile_factor > 0)
                else default_compile_s
            )
    events.stage("select", "", left())
    selection = select(results, baseline=eager, allow_precision=set(allow_precision), steps=steps)
    best = selection.best
    doc = {
        "schema": TUNE_SCHEMA,
        "kiln_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "workload": workload,
        "step": step,
        "device": device,
        "preset": preset,
        "budget_s": budget_s,
        "steps": steps,
        "allow_precision": sorted(allow_precision),
        "wall_s": time.monotonic() - t0,
        "environment": eager.get("environment") or collect_environment(device),
        "stages": stages,
        "selection": selection.to_dict(),
        "recommendation": None
        if best is None
        else {
            "variant": best["variant"],
            "code": recommend.code(best["variant"], step, device),
            "why": recommend.reasons(best, eager),
        },
        "trials": results,
    }
    write_json(out / "results.json", doc)
    from torchkiln.report.render import write_reports

    write_reports(doc, out)
    doc["wall_s"] = time.monotonic() - t0
    write_json(out / "results.json", doc)
    return doc
