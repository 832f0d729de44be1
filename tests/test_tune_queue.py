"""The search's queue (tune/queue.py): a candidate that does not fit at its turn is deferred,
takes a second turn once the queue is empty and nothing runs, and only then is skipped."""

from __future__ import annotations

from dataclasses import dataclass

from torchkiln.tune.queue import SearchQueue


@dataclass
class Cand:
    spec: str
    need: float


def drain(queue: SearchQueue, room: dict[bool, float], log: list[str]) -> list[str]:
    """Take every candidate, one at a time as with one GPU (nothing running between takes);
    `room[second_turn]` is the seconds a candidate may take at its first or second turn."""

    def fits(cand, second):
        return None if cand.need <= room[second] else f"{cand.need:g} > {room[second]:g}"

    def skip(cand, why):
        log.append(f"skip {cand.spec}: {why}")

    def defer(cand, why):
        log.append(f"defer {cand.spec}: {why}")

    started = []
    while (taken := queue.take(fits, False, skip, defer)) is not None:
        started.append(f"{taken[0]}:{taken[1].spec}")
    return started


def test_a_candidate_that_does_not_fit_goes_again_after_the_rest():
    queue = SearchQueue([Cand("a", 35.0), Cand("b", 10.0), Cand("c", 300.0), Cand("d", 5.0)])
    log: list[str] = []
    # At their first turn 31 s of room (time kept for a comparison); at the second, 44 s.
    started = drain(queue, {False: 31.0, True: 44.0}, log)
    # Plan order, then the deferred in theirs, each with its plan index.
    assert started == ["2:b", "4:d", "1:a"]
    assert log == ["defer a: 35 > 31", "defer c: 300 > 31", "skip c: 300 > 44"]
    assert queue.deferred_why == {"a": "35 > 31", "c": "300 > 31"}


def test_nothing_is_retried_while_a_trial_runs():
    queue = SearchQueue([Cand("a", 50.0)])
    log: list[str] = []

    def fits(cand, second):
        return None if second else "no room yet"

    def take(running):
        return queue.take(fits, running, lambda c, w: log.append("skip"),
                          lambda c, w: log.append("defer"))  # fmt: skip

    # A neighbour's trial is still running: the deferred candidate waits for its result.
    assert take(running=True) is None and log == ["defer"]
    assert queue.waiting() == {"a"}
    # Nothing runs: its second turn, where it fits.
    assert take(running=False) == (1, Cand("a", 50.0))
    assert queue.waiting() == set() and take(running=False) is None


def test_a_candidate_is_deferred_once_and_refinements_take_turns_too():
    queue = SearchQueue([Cand("a", 20.0)])
    log: list[str] = []
    assert drain(queue, {False: 10.0, True: 10.0}, log) == []
    assert log == ["defer a: 20 > 10", "skip a: 20 > 10"]
    # A refinement queued later (refine() inserts at the front) gets its own two turns.
    queue.pending.insert(0, (7, Cand("a+channels_last", 15.0)))
    log.clear()
    assert drain(queue, {False: 10.0, True: 20.0}, log) == ["7:a+channels_last"]
    assert log == ["defer a+channels_last: 15 > 10"]


def test_the_second_turn_keeps_time_only_for_finalists_already_measured():
    from torchkiln.tune.limits import head_to_head_reserve

    eager = {"variant": "eager", "status": "ok", "process_wall_s": 15.0}
    # One compiled variant measured (a `simple` tune on an H200, caaa360: cudagraphs after
    # eager): while more candidates are to come, time for comparing it with the next one...
    cudagraphs = {"variant": "cudagraphs", "status": "ok", "process_wall_s": 16.5,
                  "phase_s": {"correctness": 0.1, "kernels": 0.1}}  # fmt: skip
    assert head_to_head_reserve([eager, cudagraphs], 120, eager) == 30.0  # 2 x 16.3, capped
    # ...and none at the deferred candidates' second turn, with nothing to compare yet.
    assert head_to_head_reserve([eager, cudagraphs], 120, eager, more_to_come=False) == 0.0
    assert head_to_head_reserve([eager], 120, eager, more_to_come=False) == 0.0
    # Two compiled variants measured: their comparison's time is kept at either turn.
    from test_tune_select import trial

    runs = [eager]
    for variant, ms, speedup in (("inductor", 5.0, 2.0), ("cudagraphs", 6.0, 1.7)):
        r = trial(variant, ms, (ms * 0.99, ms * 1.01), speedup, (speedup * 0.98, speedup * 1.02), 9)
        runs.append({**r, "process_wall_s": 20.0, "wall_s": 18.0, "phase_s": {"start": 3.0}})
    both = head_to_head_reserve(runs, 600, eager)
    # 20 + 20 s arms in one process that starts once (5 s), scaled (H2H_COST_FACTOR).
    assert both == head_to_head_reserve(runs, 600, eager, more_to_come=False) == 0.85 * 35.0


@dataclass
class Planned:
    spec: str
    need: float
    primary: bool = False


def test_a_dear_candidate_starts_once_the_primaries_have():
    plan = [
        Planned("default+bf16", 40.0, primary=True),
        Planned("reduce-overhead+bf16", 40.0, primary=True),
        Planned("regions+bf16", 50.0),
        Planned("channels_last+bf16", 40.0),
        Planned("max-autotune+bf16", 300.0),
    ]
    queue = SearchQueue(plan)
    log: list[str] = []

    def fits(cand, second):
        return None

    def dear(cand):
        return cand.need >= 400.0 / 3

    order = []
    while (taken := queue.take(fits, True, log.append, log.append, dear)) is not None:
        order.append(taken[1].spec)
    # The primaries in plan order, then the dear one, then the rest in plan order: the dear one
    # keeps its plan index.
    assert order == [
        "default+bf16",
        "reduce-overhead+bf16",
        "max-autotune+bf16",
        "regions+bf16",
        "channels_last+bf16",
    ]
    assert log == []


def test_a_dear_candidate_that_does_not_fit_is_deferred_as_any_other():
    queue = SearchQueue([Planned("regions", 50.0), Planned("max-autotune", 300.0)])
    log: list[str] = []

    def fits(cand, second):
        return None if cand.need <= 200.0 else f"{cand.need:g} > 200"

    taken = []
    while (t := queue.take(fits, False, lambda c, w: log.append(f"skip {c.spec}"),
                           lambda c, w: log.append(f"defer {c.spec}"),
                           lambda c: c.need >= 100.0)) is not None:  # fmt: skip
        taken.append(f"{t[0]}:{t[1].spec}")
    assert taken == ["1:regions"]
    assert log == ["defer max-autotune", "skip max-autotune"]


def test_without_a_dear_rule_the_plan_order_holds():
    plan = [Planned("a", 10.0), Planned("b", 300.0), Planned("c", 10.0)]
    assert drain(SearchQueue(plan), {False: 400.0, True: 400.0}, []) == ["1:a", "2:b", "3:c"]


def test_a_held_candidate_keeps_its_place_and_nothing_starts_when_all_are_held():
    plan = [Planned("max-autotune", 300.0), Planned("regions", 50.0), Planned("cl", 40.0)]
    queue = SearchQueue(plan)
    held = {"max-autotune"}

    def take():
        t = queue.take(lambda c, s: None, True, print, print, lambda c: c.need >= 100.0,
                       lambda c: c.spec in held)  # fmt: skip
        return None if t is None else f"{t[0]}:{t[1].spec}"

    assert take() == "2:regions"
    held |= {"cl"}
    assert take() is None  # everything left is held: wait for a running trial to end
    held.clear()
    assert take() == "1:max-autotune"  # priced now: the dear one first, at its plan index
    assert take() == "3:cl" and take() is None
