"""`kiln tune`: environment check, eager baseline, profile verdict, graph breaks, a search over
variants within a time budget, selection, report. Reads like the diagram in DESIGN.md. With
several trials in flight the diagnosis (profile, graph breaks, repair plan: tune.diagnosis) runs
beside the search's first trials, the primaries, which need none of it."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import time
from collections.abc import Collection
from concurrent.futures import wait
from dataclasses import replace
from pathlib import Path
from typing import Any

from torchkiln.errors import KilnUserError
from torchkiln.repair import judge as repair_judge
from torchkiln.repair.arm import PLAN_KEY
from torchkiln.repair.plan import check_mode as check_fix_mode
from torchkiln.report.drift import baseline_drift
from torchkiln.runner.launch import compile_cache, executors, warm
from torchkiln.runner.launch.concurrency import search_slots
from torchkiln.runner.launch.host_lock import host_turns, remove_lock_files, set_compile_slots
from torchkiln.runner.launch.orphan import stop_trials, trials_may_run
from torchkiln.runner.launch.trial_process import preflight, run_trial
from torchkiln.runner.protocol.trial import PREPAY, TrialSpec, base_result
from torchkiln.runner.protocol.worker import write_json
from torchkiln.runner.store.rundir import RunDir
from torchkiln.tune import evidence as gather
from torchkiln.tune import recommend
from torchkiln.tune.bounds import ruled_out
from torchkiln.tune.diagnosis import Diagnosis, Findings
from torchkiln.tune.head_to_head import LEND_CACHES, head_to_head_stage
from torchkiln.tune.limits import (
    FINAL_RESERVE_S,
    Estimator,
    does_not_fit,
    head_to_head_reserve,
    search_limits,
    search_room,
    stop_note,
    trial_wall_s,
)
from torchkiln.tune.queue import DEAR_SHARE, SearchQueue
from torchkiln.tune.results_header import results_header
from torchkiln.tune.search import (
    EXACT_AFTER,
    Candidate,
    Evidence,
    after_diagnosis,
    candidates,
    early_plan,
    fixed_cost_pairs,
    given_plan,
    refinements,
    without_fullgraph,
)
from torchkiln.tune.select import leader as current_leader
from torchkiln.tune.select import select
from torchkiln.tune.time_spent import StageClock, beside_seconds, stage_seconds, time_spent


class TuneEvents:
    """Progress hooks (the CLI draws a live display from these)."""

    def stage(self, name: str, detail: str, seconds_left: float) -> None: ...
    def trial_phase(self, spec: str, phase: str, seconds_left: float) -> None: ...
    def trial_done(self, result: dict[str, Any], seconds_left: float) -> None: ...
    def skipped(self, spec: str, why: str) -> None: ...
    def deferred(self, spec: str, why: str) -> None: ...


def visible_gpus(device: str) -> list[int | None]:
    """One slot per visible GPU when `--device cuda` names no index and several are visible
    (independent trials then run at once, one per GPU); otherwise one unpinned slot."""
    if device != "cuda":
        return [None]
    from torchkiln.runner.launch.executors import visible_gpus as gpus

    found = gpus()
    return list(found) if len(found) > 1 else [None]


def run_in_process(spec: TrialSpec) -> dict[str, Any]:
    """A trial in this process (the fallback when the model cannot reach a trial process)."""
    from torchkiln.runner.protocol.measure_trial import measure_trial
    from torchkiln.runner.protocol.worker import Phases, classify_error

    result = base_result(spec)
    phases = Phases(None)
    try:
        measure_trial(spec, result, phases)
    except Exception as exc:  # noqa: BLE001  (every failure becomes a reported status)
        result["status"] = classify_error(exc, phases.current)
        result["reason"] = f"{type(exc).__name__} during {phases.current}: {exc}"[:4000]
    result["notes"].append("ran in the calling process: no crash isolation, shared caches")
    return result


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
    repeated: two H200s at commit c137b97 ran resnet50's whole-step refinement twice, queued
    again while its first trial ran, and reported a tie of the variant with itself. Nothing
    is refined while a primary candidate (default or reduce-overhead at the lead precision)
    waits: refining the first mode measured delayed resnet50's reduce-overhead+bf16 (H200, 50de622),
    the eventual pick, by two trials.
    Returns the next free trial index."""
    if any(c.primary for _, c in pending):
        return next_index
    lead = current_leader(results, eager, evidence.allow_precision)
    if lead is None:
        return next_index
    same = same_code(evidence)
    tried = {r["variant"] for r in results} | set(search["skipped"]) | set(running)
    tried |= set(search.get("ruled_out") or {})
    done = {same(s) for s in tried}
    todo = [c for c in refinements(lead["variant"], evidence) if same(c.spec) not in done]
    if not todo:
        return next_index
    cand = todo[0]
    planned = [p for p in pending if same(p[1].spec) == same(cand.spec)]
    if planned:
        pending.remove(planned[0])
        item = planned[0]
    else:
        item, next_index = (next_index, cand), next_index + 1
    pending.insert(0, item)
    spec = item[1].spec
    if all(r["spec"] != spec for r in search["refined"]):
        search["refined"].append({"leader": lead["variant"], "spec": spec, "why": cand.why})
    return next_index


def same_code(evidence: Evidence):
    """What identifies a candidate's compiled code for the search: its spec, less `fullgraph=true`
    when the model has no graph break (the flag then changes nothing it compiles to; it only
    turns a break into an error). A refinement whose twin is planned moves the twin up instead
    of being added: on an H200 a GPT-2 tune queued its leader autotuned (max-autotune, 82 s of
    compile) as a refinement while the same compile waited in the plan as `fullgraph=true`."""
    if evidence.graph_breaks != 0:
        return lambda spec: spec
    return lambda spec: without_fullgraph(spec) or spec


@warm.scoped()  # its trials fork from one process that imported torch
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
    history: str | Path | bool | None = None,
    fix: str = "code",
    compile_workers: int | None = None,
    stream: str | None = None,
    stream_len: int | None = None,
    variants: list[str] | None = None,
) -> dict[str, Any]:
    """Run the pipeline and write results.json, report.md and report.html into ``out``; the
    result is also appended to the history store ``history`` (None: the default, False: none),
    and the report draws the trend of earlier comparable runs found there.
    With ``stream`` or ``stream_len`` the search runs on the stream instead (tune.stream_search).
    ``variants`` replaces the plan: the search measures exactly those specs, in that order, with
    no diagnosis (it only plans) and no refinements (search.given_plan).
    """
    given = None if variants is None else given_plan(list(variants))
    if given is not None and not given:
        raise KilnUserError("variants= names no candidate besides eager (the baseline)")
    if given is not None and (stream is not None or stream_len is not None):
        raise KilnUserError("variants= takes a fixed-input tune; a stream tune plans its own")
    if stream is not None or stream_len is not None:
        from torchkiln.tune.stream_search import tune_stream

        if steps is not None:
            raise KilnUserError(
                "--steps does not apply to a tune on a stream: the pick is the fastest over the "
                "whole stream, compiles included"
            )

        return tune_stream(
            workload,
            device=device,
            preset=preset,
            batch_size=batch_size,
            budget_s=budget_s,
            allow_precision=set(allow_precision),
            out=Path(out),
            stream=stream,
            stream_len=stream_len,
            step=step,
            events=events,
        )
    events = clock = StageClock(events or TuneEvents())  # stage times for time_spent
    check_fix_mode(fix)
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
    stages["environment"] = gather.environment_check(device)
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
            lend = spec.extra.get(LEND_CACHES)
            done = run_trial(
                spec,
                run.trial_dir(spec.id),
                timeout_s=own,
                wall_s=wall,
                gpu=gpu,
                host_lock=host_lock,
                on_phase=lambda ph: events.trial_phase(spec.variant, ph, left()),
                # Kept for the head-to-head, which loads the compiled code of the variants it
                # times again instead of compiling them cold (head_to_head.py).
                keep_cache=True,
                lend_caches=None
                if not lend
                else {i: compile_cache.kept(run.trial_dir(i)) for i in lend},
            )
            note = stop_note(done.get("stopped_by"), own, wall, limit)
            if done.get("status") == "timeout" and note and not done.get("stopped_for_waiters"):
                done["reason"] = f"{done['reason']}; {note}"
            if stale:
                done.setdefault("notes", []).append(stale)
            run.save_result(spec.id, done, spec)
        events.trial_done(done, left())
        return done

    # The baseline also pays the fixed costs (references, FLOPs) of the precisions and layouts
    # the search measures at, once, before trials run side by side (references.prepay).
    pairs = fixed_cost_pairs(device, set(allow_precision), given)
    eager = run_one(replace(base, index=0, extra={**base.extra, PREPAY: pairs}))
    results.append(eager)
    if eager["status"] != "ok":
        raise KilnUserError(f"the eager baseline failed ({eager['status']}): {eager['reason']}")

    conv, repeated = gather.model_facts(base, eager)  # before anything runs beside this process
    evidence = Evidence(
        device=device,
        step=step,
        convolutional=conv,
        has_repeated_blocks=repeated,
        allow_precision=set(allow_precision),
        xla_available=all(importlib.util.find_spec(m) for m in ("jax", "torchax")),
    )
    compiles = None
    if in_process:
        slots, in_flight = [None], "1 at once: trials run in this process"
    else:
        gpus = [g for g in visible_gpus(device) if g is not None]
        slots, in_flight, compiles = search_slots(device, gpus, eager, compile_workers)
    # The diagnosis takes one of the places in flight: beside the search's first trials when
    # there are two or more (never on the CPU, where a compile beside another reads slower).
    beside = not in_process and len(slots) > 1
    host_lock = (host_turns() or executors.host_lock_file()) if beside else None
    if host_lock is not None and host_lock != host_turns() and compiles:
        set_compile_slots(host_lock, compiles)  # its own pool's file: the others' are theirs
    for key in ("profile", "graph_breaks", "repair"):  # in this order in results.json
        stages[key] = {"status": "running"}
    diagnosed: dict[str, Any] = {}  # the plan's document, once the diagnosis is in

    def absorb(found: Findings) -> list[Candidate]:
        """The diagnosis into the evidence; the plan it gives."""
        nonlocal base
        stages["profile"], stages["graph_breaks"] = found.profile, found.graph_breaks
        stages["repair"], plan_doc = found.repair, found.plan
        diagnosed["plan"] = plan_doc
        if plan_doc is not None and plan_doc["fixes"]:
            # The plan's digest too: a later tune into this directory reuses no remedied trial
            # of a plan that has since changed (an edited model file).
            digest = hashlib.sha256(Path(plan_doc["path"]).read_bytes()).hexdigest()
            extra = {**base.extra, PLAN_KEY: plan_doc["path"], "repair_plan_sha256": digest}
            base = replace(base, extra=extra)
        evidence.graph_breaks = found.graph_breaks.get("breaks")
        evidence.verdict = found.profile.get("verdict")
        evidence.fixes = list(plan_doc["fixes"]) if plan_doc else []
        return candidates(evidence)

    diagnosis = Diagnosis(base, fix, out, left, clock)
    pending_diagnosis = None
    if given is not None:
        # Nothing the diagnosis finds would change a given plan (no remedies, no fullgraph, no
        # order): it is not run, and says so.
        why = "the candidates were given (variants=): nothing to plan from a diagnosis"
        stages["profile"] = stages["repair"] = {"status": "skipped", "reason": why}
        stages["graph_breaks"] = {"status": "skipped", "reason": why, "breaks": None}
        plan = given
    elif in_process:
        why = "an in-process model cannot be handed to the profiling and explain processes"
        skipped = {"status": "skipped", "reason": why}
        graph = {**skipped, "breaks": None}
        repair, plan_doc = gather.repair_plan(base, graph, fix, out / "repair")
        plan = absorb(Findings(skipped, graph, repair, plan_doc))
    elif beside:
        # The primaries (the plain modes, which the diagnosis does not change) and the autotuned
        # modes at the lead precision start beside it (search.early_plan); the rest of the plan,
        # ordered by the verdict and holding the remedies, when it is in.
        plan = early_plan(evidence)
    else:
        plan = absorb(diagnosis.run())
    stages["search"] = {
        "evidence": evidence.__dict__ | {"allow_precision": sorted(allow_precision)},
        "planned": [c.spec for c in plan],
        "skipped": {},
    }
    if given is not None:
        stages["search"]["given"] = True
    elif beside:
        stages["search"]["before_diagnosis"] = {"planned": [c.spec for c in plan]}

    # Estimates are updated from what each trial really took.
    estimate = Estimator(trial_wall_s(eager))
    stages["search"]["in_flight"] = {"trials": len(slots), "why": in_flight}
    if compiles:
        stages["search"]["in_flight"]["compiles"] = compiles
    events.stage("search", f"trials in flight: {in_flight}", left())
    queue = SearchQueue(plan)
    stages["search"]["refined"] = []
    stages["search"]["ruled_out"] = {}
    stages["search"]["deferred"] = queue.deferred_why
    next_index = len(plan) + 1
    running: set[str] = set()  # started, no result yet
    idle_since: list[float] = []  # when the last trial ended

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
        return does_not_fit(need, room, "the final comparison and report")

    def dear(cand: Candidate) -> bool:
        # Never an exact (fp32) candidate of a 16-bit search: those wait for every candidate at
        # the lead precision (search.EXACT_AFTER).
        room = search_room(search_left())
        return cand.priority < EXACT_AFTER and estimate(cand) >= DEAR_SHARE * room

    def held(cand: Candidate) -> bool:
        # A dear candidate waits for a price while a compile in flight brings one (queue.py).
        return bool(running) and not estimate.priced(cand) and not cand.primary and dear(cand)

    def skip(cand: Candidate, why: str) -> None:
        stages["search"]["skipped"][cand.spec] = why
        events.skipped(cand.spec, why)

    def defer(cand: Candidate, why: str) -> None:
        events.deferred(cand.spec, f"{why}; tried again when the queue is empty")

    def diagnosis_in() -> bool:
        """Whether the diagnosis is in; the moment it is, the rest of the plan is queued."""
        nonlocal pending_diagnosis, next_index
        if pending_diagnosis is None:
            return True
        if not pending_diagnosis.done():
            return False
        found, pending_diagnosis = pending_diagnosis.result(), None  # raises what it raised
        search = stages["search"]
        early = search["before_diagnosis"]
        # What the overlap did not save: the search idle, its first trials done, the rest of
        # the plan waiting for the diagnosis.
        idle = time.monotonic() - idle_since[0] if not running and idle_since else 0.0
        early["waited_s"] = round(idle, 3)
        rest, early["stand_for"] = after_diagnosis(early["planned"], absorb(found), evidence)
        search["evidence"] = evidence.__dict__ | {"allow_precision": sorted(allow_precision)}
        search["planned"] += [c.spec for c in rest]
        queue.pending.extend(enumerate(rest, start=next_index))
        next_index += len(rest)
        next_index = refine(
            results, eager, evidence, queue.pending, stages["search"], next_index,
            running | queue.waiting(),
        )  # fmt: skip
        return True

    def rule_out() -> None:
        """Drop the queued candidates the device's peak rules out (bounds.py), with why."""
        for held in (queue.pending, queue.deferred):
            for item in list(held):
                why = ruled_out(item[1].spec, results, eager, set(allow_precision))
                if why is not None:
                    held.remove(item)
                    stages["search"]["ruled_out"][item[1].spec] = why
                    events.skipped(item[1].spec, why)

    def next_trial() -> tuple[Candidate, TrialSpec] | None:
        # The next candidate that fits what is left, when a GPU frees (executors.stream).
        diagnosed_now = diagnosis_in()
        if given is None:
            rule_out()
        if not diagnosed_now and len(running) >= len(slots) - 1:
            return None  # the diagnosis holds one place in flight
        # Before the diagnosis, deferred primaries wait with it for the rest of the plan.
        busy = bool(running) or not diagnosed_now
        order_by_cost = given is None and len(slots) > 1
        taken = queue.take(
            fits, busy, skip, defer, *((dear, held) if order_by_cost else (None, None))
        )
        if taken is None:
            return None
        i, cand = taken
        spec = replace(base, variant=cand.spec, index=i)
        second_turn = cand.spec in queue.deferred_why
        caps[spec.id] = search_limits(estimate(cand), search_left(not second_turn))
        running.add(cand.spec)
        events.stage("search", f"{cand.spec} (of {len(stages['search']['planned'])})", left())
        return cand, spec

    def trial_done(cand: Candidate, r: dict[str, Any]) -> None:
        nonlocal next_index
        results.append(r)
        repair_judge.mark(r, results, evidence.graph_breaks)
        running.discard(cand.spec)
        idle_since[:] = [time.monotonic()]
        estimate.learn(cand, r)
        if pending_diagnosis is not None:
            return  # the leader's refinements wait for the remedies (a refinement of their own)
        if given is not None:
            return  # a given plan is measured as given
        next_index = refine(
            results, eager, evidence, queue.pending, stages["search"], next_index,
            running | queue.waiting(),
        )  # fmt: skip

    # Several GPUs: a trial starts whenever one frees, taking turns on the host (host_lock.py);
    # the diagnosis, if it runs beside, on the same lock file.
    if beside and given is None:
        pending_diagnosis = diagnosis.start(host_lock)
    try:
        executors.stream(
            slots, next_trial, run_one, trial_done, host_lock=host_lock, until=pending_diagnosis
        )
        diagnosis_in()  # ended while the last trial did
    except BaseException:
        if pending_diagnosis is not None:  # its subprocess is ended before this raises on
            stop_trials()
            wait([pending_diagnosis])
            trials_may_run()
        raise
    finally:
        if host_lock is not None and host_lock != host_turns():
            remove_lock_files(host_lock)
    plan_doc = diagnosed.get("plan")
    # In plan order, as one GPU would have run them (they finish in any order side by side).
    results[1:] = sorted(results[1:], key=lambda r: int(r["id"].split("-", 1)[0]))
    for r in results:
        repair_judge.mark(r, results, evidence.graph_breaks)
    if plan_doc is not None and plan_doc["fixes"]:
        stages["repair"]["break_costs"] = repair_judge.break_costs(plan_doc, results, eager)
    h2h = []
    if steps is None:
        h2h = head_to_head_stage(
            results, eager, set(allow_precision), base, run_one, slots, left, events, stages
        )
    compile_cache.drop([run.trial_dir(r["id"]) for r in [*results, *h2h] if r.get("id")])
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
        **results_header(
            workload=workload,
            step=step,
            device=device,
            preset=preset,
            batch_size=batch_size,
            budget_s=budget_s,
            steps=steps,
            allow_precision=allow_precision,
            environment=eager.get("environment") or None,
        ),
        "wall_s": time.monotonic() - t0,
        "stages": stages,
        "selection": selection.to_dict(),
        "recommendation": None
        if best is None
        else {
            "variant": best["variant"],
            "code": recommend.code(best["variant"], step, device),
            "why": recommend.reasons(
                best, eager, stages.get("graph_breaks"), len(selection.ranking) - 1
            ),
            "fixes": None
            if plan_doc is None
            else repair_judge.shipped(plan_doc, best["variant"], out),
        },
        "trials": results,
        "head_to_head_trials": h2h,
        "baseline_drift": baseline_drift(results),
    }
    beside_s = beside_seconds(clock.beside_spans)
    doc["time_spent"] = time_spent(doc, stage_seconds(clock.marks, t0, time.monotonic()), beside_s)
    write_json(out / "results.json", doc)
    from torchkiln.report.render import write_reports

    clock.marks.append(("report", time.monotonic()))  # not announced: the console has its line
    write_reports(doc, out, history=history)
    doc["wall_s"] = time.monotonic() - t0
    doc["time_spent"] = time_spent(doc, stage_seconds(clock.marks, t0, time.monotonic()), beside_s)
    write_json(out / "results.json", doc)
    from torchkiln.history import record

    doc["history"] = record(doc, "tune", history)  # after the files: it never costs the result
    return doc
