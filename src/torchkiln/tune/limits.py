"""How long each part of a tune may take: a search trial's cap and the room the budget leaves
it, why a stopped trial was stopped, the time kept for the head-to-head stage and the report,
and the estimates of a candidate's trial learned from those already run."""

from __future__ import annotations

import statistics
from typing import Any

from torchkiln.tune.search import estimate_trial_s
from torchkiln.tune.select import finalists
from torchkiln.variants import parse_variant

# A search trial may run this many times its estimate (at least TRIAL_CAP_MIN_S) before it is
# stopped as a timeout: on an H200 a max-autotune compile ran 10-33x the default mode's (resnet50
# fp32 past 600 s, `benchmarks/results/zoo/h200`), and one such compile must not spend the
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
# the time kept for the head-to-head. At 51e19d0 resnet50 and bert-base training tunes (H200) each
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
# (spawn.end_group), then selection and the reports. H200 tunes at 50de622 ended at 600.3 and
# 601.2 s of a 600 s budget, their last trials given whatever was left.
FINAL_RESERVE_S = 10.0
# The search leaves time for the head-to-head stage: two compiles in one process for each
# challenger, estimated from the search's own trials, at most this share of the budget. At
# 50de622 bert-base's search spent the whole budget and the tie it left was settled by
# compile cost: the pick was 2.4% slower than the runner-up when they were timed together.
H2H_RESERVE_SHARE = 0.25


# Phases a head-to-head trial does not repeat: its arms' search trials checked correctness
# and counted kernels, and waited for the host while a neighbour on the other GPU held it; the
# head-to-head runs after the search, alone. Counting that wait cost c137b97's bert-base
# train tune on two H200s its head-to-head: 199 s estimated (42.8 s of it the leader's wait),
# 160 s left, and 170 s of the budget went unused.
NOT_IN_H2H = ("correctness_compile", "correctness", "kernels", "host_wait")


# A head-to-head arm starts from its search trial's kept compile cache (head_to_head.LEND_CACHES),
# so its first call loads compiled code instead of compiling it. H100 tunes at c60e8eb
# (benchmarks/results/tune_speed/h100): resnet50 training's head-to-head first call took 6.5 s
# where its arms' search trials took 73.9 + 52.6 s (0.05), GPT-2's 14.4 s of 135 s (0.11); the
# estimate keeps over twice the larger share. Before this, both tunes kept about 124 s for a
# head-to-head that took 20-23 s, and resnet50's skipped nine candidates with 115 s unused.
LENT_FIRST_CALL_SHARE = 0.25


def _h2h_arm_s(r: dict[str, Any]) -> float:
    """Seconds one arm adds to a head-to-head process: its search trial's process time less
    what the head-to-head does not repeat, its compile loaded from the trial's kept cache. A
    trial reused from an earlier run left no cache here: its compile is counted whole."""
    phases = r.get("phase_s") or {}
    spared = sum(float(phases.get(k) or 0.0) for k in NOT_IN_H2H)
    if not r.get("reused"):
        spared += (1.0 - LENT_FIRST_CALL_SHARE) * float(phases.get("first_call") or 0.0)
    return max(1.0, float(r.get("process_wall_s") or 0.0) - spared)


def trial_wall_s(r: dict[str, Any]) -> float:
    """A trial's process seconds as a yardstick for the others': less the fixed costs it paid
    for them (the baseline's `fixed_costs` phase, runner.protocol.references.prepay)."""
    paid = float((r.get("phase_s") or {}).get("fixed_costs") or 0.0)
    return max(1.0, float(r.get("process_wall_s") or 30.0) - paid)


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
# H200 tunes ran at commits 65f0de3 to 6c82b99: 0.56-0.84 (72.8 of 94.6
# s, 47.0 / 76.4, 100.2 / 119.7, 51.6 / 91.9, 66.2 / 103.7, 107.2 / 143.8, 105.6 / 159.5). The
# estimate is scaled by the largest: at 1.0, a 2-minute `simple` tune on an H200 (4f3d327)
# kept 34 s for its head-to-head and skipped it with 33 s left.
H2H_COST_FACTOR = 0.85


def head_to_head_cost(leader: dict[str, Any], challenger: dict[str, Any]) -> float:
    """Seconds a head-to-head trial of two measured variants should take: both arms in one
    process, which starts once, scaled by H2H_COST_FACTOR. An H200 bert-base tune (65f0de3): arms of
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
    An H200 bert-base tune (65f0de3) kept the two slowest search trials' times (149 + 99 s, capped
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
            need = 4 * trial_wall_s(base)
    return min(need, H2H_RESERVE_SHARE * budget_s)


class Estimator:
    """Seconds a candidate's trial should take, learned from the trials already run, per
    compile family (compile_family): a candidate is priced from the compiles of its own family
    (the median of first call over compile factor), else from the whole-model compiles of the
    plain modes. One unit for all, the last trial's, priced every candidate after a regional
    compile by it: in an H200 resnet50 training tune (kiln 388cb3a) regional compiles took 62-63
    s against 32-34 s for whole-model ones (its blocks differ in shape, so each compiles on its
    own), and `reduce-overhead` over the whole step was then estimated at 213 s and skipped,
    where its relatives had compiled in 48 s. A trial of the family stopped while it compiled
    teaches a lower bound: its seconds so far (in the same tune at kiln 7d1aea6 the two
    max-autotune compiles stopped at 356 s priced the max-autotune refinement at 356 s, not at
    8x a default compile)."""

    def __init__(self, overhead_s: float, default_compile_s: float = 20.0) -> None:
        self.overhead_s = overhead_s
        self.default_compile_s = default_compile_s
        self.units: dict[str, list[float]] = {}  # family -> first call / compile factor
        self.stopped_s: dict[str, float] = {}  # family -> longest trial stopped compiling

    def priced(self, cand: Any) -> bool:
        """Whether a compile of this tune prices ``cand``: one of its family, or a whole-model
        plain one, has ended (or one of its family was stopped). Before, its estimate is a guess
        from the default unit, or from another family's."""
        family = compile_family(cand.spec)
        return family in self.units or PLAIN_FAMILY in self.units or family in self.stopped_s

    def __call__(self, cand: Any) -> float:
        family = compile_family(cand.spec)
        seen = self.units.get(family) or self.units.get(PLAIN_FAMILY)
        if seen is None:
            seen = [u for units in self.units.values() for u in units]
        unit = statistics.median(seen) if seen else self.default_compile_s
        need = estimate_trial_s(cand, self.overhead_s, unit)
        return max(need, self.stopped_s.get(family, 0.0))

    def learn(self, cand: Any, result: dict[str, Any]) -> None:
        family = compile_family(cand.spec)
        if result.get("status") == "ok" and cand.compile_factor > 0:
            unit = max(1.0, result["first_call_s"] / cand.compile_factor)
            self.units.setdefault(family, []).append(unit)
        elif result.get("status") == "timeout" and result.get("phase") == "first_call":
            wall = float(result.get("process_wall_s") or 0.0)
            self.stopped_s[family] = max(self.stopped_s.get(family, 0.0), wall)


PLAIN_FAMILY = "plain"


def compile_family(spec: str) -> str:
    """Candidates whose compiles cost alike: Inductor's plain modes (default and
    reduce-overhead; CUDA graphs add little to a compile), the autotuned modes per 16-bit or
    fp32 (fp32 templates autotune slower), each over the whole model or by regions; any other
    backend by its name."""
    v = parse_variant(spec)
    if v.name != "inductor":
        return v.name
    mode = getattr(v.backend, "mode", None) or "default"
    family = PLAIN_FAMILY
    if mode.startswith("max-autotune"):
        family = "autotune-16" if v.precision in ("bf16", "fp16") else "autotune-32"
    if getattr(v.backend, "scope", None) == "regions":
        family += "-regions"
    return family


def does_not_fit(need_s: float, room_s: float, kept_for: str) -> str:
    """Why a trial is not run: its estimate against what is left once ``kept_for`` is kept.
    What is left reads 0 s, never less: the reserve already took the rest (a skip once read
    "-28 s left")."""
    return (
        f"would not fit the budget (estimated {need_s:.0f} s, {max(0.0, room_s):.0f} s left "
        f"after the time kept for {kept_for})"
    )
