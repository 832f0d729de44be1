"""`kiln tune`: environment check, eager baseline, profile verdict, graph breaks, a search over
variants within a time budget, selection, report. Reads like the diagram in DESIGN.md."""

from __future__ import annotations

import importlib
import importlib.util
import shutil
import time
from collections.abc import Collection
from dataclasses import replace
from pathlib import Path
from typing import Any

from torchkiln import __version__
from torchkiln.errors import KilnUserError
from torchkiln.measure.environment import collect as collect_environment
from torchkiln.report.drift import baseline_drift
from torchkiln.runner.executors import LocalExecutor, stream
from torchkiln.runner.launch import preflight, run_trial
from torchkiln.runner.rundir import RunDir
from torchkiln.runner.trial import TrialSpec, base_result
from torchkiln.runner.worker import write_json
from torchkiln.tune import recommend
from torchkiln.tune.queue import SearchQueue
from torchkiln.tune.search import (
    Candidate,
    Evidence,
    candidates,
    estimate_trial_s,
    refinements,
)
from torchkiln.tune.select import finalists, select
from torchkiln.tune.select import leader as current_leader

TUNE_SCHEMA = "torchkiln.tune/1"


class TuneEvents:
    """Progress hooks (the CLI draws a live display from these)."""

    def stage(self, name: str, detail: str, seconds_left: float) -> None: ...
    def trial_phase(self, spec: str, phase: str, seconds_left: float) -> None: ...
    def trial_done(self, result: dict[str, Any], seconds_left: float) -> None: ...
    def skipped(self, spec: str, why: str) -> None: ...
    def deferred(self, spec: str, why: str) -> None: ...


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


# A search trial may run this many times its estimate (at least TRIAL_CAP_MIN_S) before it is
# stopped as a timeout: on an H200 a max-autotune compile ran 10-33x the default mode's (resnet50
# fp32 past 600 s, `benchmarks/results/zoo-h200`), and one such compile must not spend the
# budget that every remaining candidate needs.
TRIAL_CAP_FACTOR = 3.0
TRIAL_CAP_MIN_S = 120.0
CAP_NOTE = (
    f"stopped at {TRIAL_CAP_FACTOR:.0f}x its estimated time so that one compile cannot spend "
    "the budget the other candidates need"
)

BUDGET_CAP_NOTE = (
    "stopped where the search's share of the budget ended (the rest is kept for the "
    "head-to-head comparison and the report)"
)


def trial_cap_s(estimate_s: float) -> float:
    return max(TRIAL_CAP_MIN_S, TRIAL_CAP_FACTOR * estimate_s)


# A search trial stopped where the search's share of the budget ends is given that share less
# this: stopping it and collecting its result take seconds, which would otherwise come out of
# the time kept for the head-to-head. Session 7's resnet50 and bert-base training tunes each
# skipped their head-to-head for about 1 s after such a trial (estimated 144 s with 143 left
# after the final reserve; 103 with 103).
TRIAL_STOP_S = 10.0


def search_room(search_left_s: float) -> float:
    """Seconds a search trial may still run: the search's share of the budget less the time
    stopping a trial takes (TRIAL_STOP_S). A candidate whose estimate exceeds it is skipped."""
    return search_left_s - TRIAL_STOP_S


def search_limits(estimate_s: float, search_left_s: float) -> tuple[float, float]:
    """A search trial's two limits: its own cap (trial_cap_s; its waits for a turn on the host
    do not count) and the wall time the search has room for (search_room), which they do."""
    return trial_cap_s(estimate_s), max(1.0, search_room(search_left_s))


def stop_note(stopped_by: str | None, own_s: float, wall_s: float, limit_s: float) -> str:
    """Why a stopped trial was stopped where it was: its cap (CAP_NOTE), the search's share of
    the budget (BUDGET_CAP_NOTE, when that is shorter than the whole budget left), or nothing
    to add (the whole budget, which the report states)."""
    if stopped_by == "own" and own_s < limit_s:
        return CAP_NOTE
    if stopped_by == "wall" and wall_s < limit_s:
        return BUDGET_CAP_NOTE
    return ""


# Seconds kept after the last trial: a trial stopped at its limit may take 5 s to end politely
# (launch._kill_group), then selection and the reports. Session 5's tunes ended at 600.3 and
# 601.2 s of a 600 s budget, their last trials given whatever was left.
FINAL_RESERVE_S = 10.0
# The search leaves time for the head-to-head stage: two compiles in one process for each
# challenger, estimated from the search's own trials, at most this share of the budget. In
# session 5 bert-base's search spent the whole budget and the tie it left was settled by
# compile cost: the pick was 2.4% slower than the runner-up when they were timed together.
H2H_RESERVE_SHARE = 0.25


# Phases a head-to-head trial does not repeat: its arms' search trials checked correctness
# and counted kernels, and waited for the host while a neighbour on the other GPU held it; the
# head-to-head runs after the search, alone. Counting that wait cost session 11's bert-base
# train tune on two H200s its head-to-head: 199 s estimated (42.8 s of it the leader's wait),
# 160 s left, and 170 s of the budget went unused.
NOT_IN_H2H = ("correctness_compile", "correctness", "kernels", "host_wait")


def _h2h_arm_s(r: dict[str, Any]) -> float:
    """Seconds one arm adds to a head-to-head process: its search trial's process time less
    what the head-to-head does not repeat."""
    phases = r.get("phase_s") or {}
    spared = sum(float(phases.get(k) or 0.0) for k in NOT_IN_H2H)
    return max(1.0, float(r.get("process_wall_s") or 0.0) - spared)


# A trial process's start-up: interpreter and imports (process time not in the worker's wall
# time), then the phases before the first build.
START_PHASES = ("start", "environment", "setup")


def _start_s(r: dict[str, Any]) -> float:
    phases = r.get("phase_s") or {}
    before = 0.0
    if r.get("wall_s") is not None and r.get("process_wall_s") is not None:
        before = max(0.0, float(r["process_wall_s"]) - float(r["wall_s"]))
    return before + sum(float(phases.get(k) or 0.0) for k in START_PHASES)


# What a head-to-head trial took over head_to_head_cost's sum of its arms, in every one the
# H200 tunes under benchmarks/results/tune-h200 ran (sessions 6-13): 0.56-0.84 (72.8 of 94.6
# s, 47.0 / 76.4, 100.2 / 119.7, 51.6 / 91.9, 66.2 / 103.7, 107.2 / 143.8, 105.6 / 159.5). The
# estimate is scaled by the largest: at 1.0, session 20's 2-minute `simple` tune on an H200
# kept 34 s for its head-to-head and skipped it with 33 s left.
H2H_COST_FACTOR = 0.85


def head_to_head_cost(leader: dict[str, Any], challenger: dict[str, Any]) -> float:
    """Seconds a head-to-head trial of two measured variants should take: both arms in one
    process, which starts once, scaled by H2H_COST_FACTOR. Session 6's bert-base tune: arms of
    66 and 44 s (99 and 55 s with their correctness checks and kernel counts), starts of 15 and
    16 s: 95 s before the scaling, where the trial took 73 s."""
    start = min(_start_s(leader), _start_s(challenger))
    return H2H_COST_FACTOR * (_h2h_arm_s(leader) + _h2h_arm_s(challenger) - start)


def head_to_head_reserve(
    results: list[dict[str, Any]],
    budget_s: float,
    eager: dict[str, Any] | None = None,
    allow_precision: set[str] | frozenset[str] = frozenset(),
    more_to_come: bool = True,
) -> float:
    """Seconds to keep for the head-to-head stage as the search stands: the current leader
    against each challenger (select.finalists), at most H2H_RESERVE_SHARE of the budget.
    Before two variants are measured, twice the one measured (or four eager processes).
    Session 6's bert-base tune kept the two slowest search trials' times (149 + 99 s, capped
    at 150) where its head-to-head took 73 s, and skipped reduce-overhead+bf16, the eventual
    best plain mode, for want of 13 s. With `more_to_come` False (the search's deferred
    candidates' second turn, SearchQueue) only the finalists already measured count."""
    final = finalists(results, eager, set(allow_precision)) if eager else []
    if final:
        need = sum(head_to_head_cost(final[0], c) for c in final[1:])
    elif not more_to_come:
        need = 0.0
    else:
        measured = [
            _h2h_arm_s(r)
            for r in results
            if r.get("status") == "ok" and r.get("variant") != "eager"
        ]
        if measured:
            need = 2 * max(measured)
        else:
            base = eager or next((r for r in results if r.get("variant") == "eager"), {})
            need = 4 * float(base.get("process_wall_s") or 30.0)
    return min(need, H2H_RESERVE_SHARE * budget_s)


class Estimator:
    """Seconds a candidate's trial should take, learned from the trials already run."""

    def __init__(self, overhead_s: float, default_compile_s: float = 20.0) -> None:
        self.overhead_s = overhead_s
        self.default_compile_s = default_compile_s

    def __call__(self, cand: Any) -> float:
        return estimate_trial_s(cand, self.overhead_s, self.default_compile_s)

    def learn(self, cand: Any, result: dict[str, Any]) -> None:
        if result.get("status") == "ok" and cand.compile_factor > 0:
            self.default_compile_s = max(1.0, result["first_call_s"] / cand.compile_factor)


def visible_gpus(device: str) -> list[int | None]:
    """One slot per visible GPU when `--device cuda` names no index and several are visible
    (independent trials then run at once, one per GPU); otherwise one unpinned slot."""
    if device != "cuda":
        return [None]
    from torchkiln.runner.executors import visible_gpus as gpus

    found = gpus()
    return list(found) if len(found) > 1 else [None]


def run_in_process(spec: TrialSpec) -> dict[str, Any]:
    """A trial in this process (the fallback when the model cannot reach a trial process)."""
    from torchkiln.runner.measure_trial import measure_trial
    from torchkiln.runner.worker import Phases, classify_error

    result = base_result(spec)
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


# Index of head-to-head trials in the run directory: apart from the search's (1, 2, ...).
H2H_INDEX = 100


def _head_to_head_stage(
    results: list[dict[str, Any]],
    eager: dict[str, Any],
    allow_precision: set[str],
    base: TrialSpec,
    run_one: Any,
    slots: list[int | None],
    left: Any,
    events: TuneEvents,
    stages: dict[str, Any],
) -> list[dict[str, Any]]:
    """Each challenger timed against the leader in one process (see select.finalists): the
    comparison that drift between trials cannot fake. Correctness was checked in the search."""
    final = finalists(results, eager, allow_precision)
    stages["head_to_head"] = {"leader": None, "challengers": [], "skipped": {}}
    if not final:
        return []
    leader, challengers = final[0], final[1:]
    stage = stages["head_to_head"]
    stage["leader"] = leader["variant"]
    specs = []
    for k, c in enumerate(challengers):
        need = head_to_head_cost(leader, c)
        room = left() - FINAL_RESERVE_S
        if need > room:
            why = (
                f"would not fit the budget (estimated {need:.0f} s, {room:.0f} s left after the "
                "time kept for the report)"
            )
            stage["skipped"][c["variant"]] = why
            events.skipped(f"{c['variant']} vs {leader['variant']}", why)
            continue
        stage["challengers"].append(c["variant"])
        specs.append(
            replace(
                base,
                variant=c["variant"],
                baseline=leader["variant"],
                index=H2H_INDEX + k,
                check_accuracy=False,
                count_kernels=False,
                extra={
                    **base.extra,
                    "unchecked_because": "a head-to-head trial: its search trial checked it",
                },
            )
        )
    if not specs:
        return []
    names = ", ".join(s.variant for s in specs)
    events.stage("head to head", f"{names} against {leader['variant']}", left())
    # One at a time: this comparison decides the pick, and its reps then wait on nothing.
    return LocalExecutor(slots[0]).run(specs, run_one)


def refine(
    results: list[dict[str, Any]],
    eager: dict[str, Any],
    evidence: Evidence,
    pending: list[tuple[int, Any]],
    search: dict[str, Any],
    next_index: int,
    running: Collection[str] = (),
) -> int:
    """Put the current leader's next untried refinement (search.refinements, cheapest first) at
    the front of the plan: one at a time, so that once a refinement takes the lead the old
    leader's other refinements are not run on top of it. One already planned moves up; one
    already measured, skipped or `running` (started on another GPU, no result yet) is not
    repeated: two H200s in session 11 ran resnet50's whole-step refinement twice, queued
    again while its first trial ran, and reported a tie of the variant with itself. Nothing
    is refined while a primary candidate (default or reduce-overhead at the lead precision)
    waits: refining the first mode measured delayed session 5's resnet50 reduce-overhead+bf16,
    the eventual pick, by two trials.
    Returns the next free trial index."""
    if any(c.primary for _, c in pending):
        return next_index
    lead = current_leader(results, eager, evidence.allow_precision)
    if lead is None:
        return next_index
    done = {r["variant"] for r in results} | set(search["skipped"]) | set(running)
    todo = [c for c in refinements(lead["variant"], evidence) if c.spec not in done]
    if not todo:
        return next_index
    cand = todo[0]
    planned = [p for p in pending if p[1].spec == cand.spec]
    if planned:
        pending.remove(planned[0])
        item = planned[0]
    else:
        item, next_index = (next_index, cand), next_index + 1
    pending.insert(0, item)
    if all(r["spec"] != cand.spec for r in search["refined"]):
        search["refined"].append({"leader": lead["variant"], "spec": cand.spec, "why": cand.why})
    return next_index


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

    caps: dict[str, tuple[float, float]] = {}  # trial id -> search_limits; search trials only

    def run_one(
        spec: TrialSpec,
        gpu: int | None = None,
        host_lock: str | None = None,
    ) -> dict[str, Any]:
        done, stale = run.reusable(spec)
        if done is not None:
            # Finished in an earlier run into this directory, measured the same way (reuse.py).
            done["reused"] = True
        elif in_process:
            done = run_in_process(spec)
        else:
            # Every later stage checks that its trials fit what is left; the eager baseline
            # runs whatever the budget (nothing can be tuned without it).
            limit = left() - FINAL_RESERVE_S
            limit = max(30.0, limit) if spec.index == 0 else max(1.0, limit)
            own, room = caps.get(spec.id, (limit, limit))
            wall = min(limit, room)
            done = run_trial(
                spec,
                run.trial_dir(spec.id),
                timeout_s=own,
                wall_s=wall,
                gpu=gpu,
                host_lock=host_lock,
                on_phase=lambda ph: events.trial_phase(spec.variant, ph, left()),
            )
            note = stop_note(done.get("stopped_by"), own, wall, limit)
            if done.get("status") == "timeout" and note:
                done["reason"] = f"{done['reason']}; {note}"
            if stale:
                done.setdefault("notes", []).append(stale)
            run.save_result(spec.id, done, spec)
        events.trial_done(done, left())
        return done

    eager = run_one(replace(base, index=0))
    results.append(eager)
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
        xla_available=all(importlib.util.find_spec(m) for m in ("jax", "torchax")),
    )
    plan = candidates(evidence)
    stages["search"] = {
        "evidence": evidence.__dict__ | {"allow_precision": sorted(allow_precision)},
        "planned": [c.spec for c in plan],
        "skipped": {},
    }

    # Estimates are updated from what each trial really took.
    estimate = Estimator(float(eager.get("process_wall_s") or 30.0))
    slots = visible_gpus(device) if not in_process else [None]
    queue = SearchQueue(plan)
    stages["search"]["refined"] = []
    stages["search"]["deferred"] = queue.deferred_why
    next_index = len(plan) + 1
    running: set[str] = set()  # started, no result yet

    def search_left(more_to_come: bool = True) -> float:
        kept = FINAL_RESERVE_S
        if steps is None:  # the head-to-head stage runs only then
            kept += head_to_head_reserve(
                results, budget_s, eager, set(allow_precision), more_to_come
            )
        return left() - kept

    def fits(cand: Candidate, second_turn: bool) -> str | None:
        need, room = estimate(cand), search_room(search_left(not second_turn))
        if need <= room:
            return None
        return (
            f"would not fit the budget (estimated {need:.0f} s, {room:.0f} s left after "
            "the time kept for the final comparison and report)"
        )

    def skip(cand: Candidate, why: str) -> None:
        stages["search"]["skipped"][cand.spec] = why
        events.skipped(cand.spec, why)

    def defer(cand: Candidate, why: str) -> None:
        events.deferred(cand.spec, f"{why}; tried again when the queue is empty")

    def next_trial() -> tuple[Candidate, TrialSpec] | None:
        # The next candidate that fits what is left, when a GPU frees (executors.stream).
        taken = queue.take(fits, bool(running), skip, defer)
        if taken is None:
            return None
        i, cand = taken
        spec = replace(base, variant=cand.spec, index=i)
        second_turn = cand.spec in queue.deferred_why
        caps[spec.id] = search_limits(estimate(cand), search_left(not second_turn))
        running.add(cand.spec)
        events.stage("search", f"{cand.spec} (of {len(plan)})", left())
        return cand, spec

    def trial_done(cand: Candidate, r: dict[str, Any]) -> None:
        nonlocal next_index
        results.append(r)
        running.discard(cand.spec)
        estimate.learn(cand, r)
        next_index = refine(
            results, eager, evidence, queue.pending, stages["search"], next_index,
            running | queue.waiting(),
        )  # fmt: skip

    # Several GPUs: a trial starts whenever one frees, taking turns on the host (host_lock.py).
    stream(slots, next_trial, run_one, trial_done)
    # In plan order, as one GPU would have run them (they finish in any order side by side).
    results[1:] = sorted(results[1:], key=lambda r: int(r["id"].split("-", 1)[0]))
    h2h = []
    if steps is None:
        h2h = _head_to_head_stage(
            results, eager, set(allow_precision), base, run_one, slots, left, events, stages
        )
    events.stage("select", "", left())
    selection = select(
        results,
        baseline=eager,
        allow_precision=set(allow_precision),
        steps=steps,
        head_to_head={t["variant"]: t for t in h2h},
    )
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
        "head_to_head_trials": h2h,
        "baseline_drift": baseline_drift(results),
    }
    write_json(out / "results.json", doc)
    from torchkiln.report.render import write_reports

    write_reports(doc, out)
    doc["wall_s"] = time.monotonic() - t0
    write_json(out / "results.json", doc)
    return doc
