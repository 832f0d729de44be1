"""A tune's head-to-head stage: the leader timed against up to two challengers, each in one
process with the leader as its baseline (select.finalists)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from torchkiln.runner.launch.executors import LocalExecutor
from torchkiln.runner.protocol.trial import TrialSpec
from torchkiln.tune.limits import FINAL_RESERVE_S, does_not_fit, head_to_head_cost
from torchkiln.tune.select import finalists

# Index of head-to-head trials in the run directory: apart from the search's (1, 2, ...).
H2H_INDEX = 100
# A head-to-head trial's spec names the search trials whose kept compile caches it starts with
# (runner/launch/compile_cache.lend): its arms load the code their search trials compiled,
# cold, and timed. On an H200 a GPT-2 tune's head-to-head compiled max-autotune again from
# nothing, 93 s of its 110 s. Its first call is then not a cold compile, and its result says
# so; the pick's compile time is its search trial's.
LEND_CACHES = "lend_caches_of"


def head_to_head_stage(
    results: list[dict[str, Any]],
    eager: dict[str, Any],
    allow_precision: set[str],
    base: TrialSpec,
    run_one: Any,
    slots: list[int | None],
    left: Any,
    events: Any,
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
            why = does_not_fit(need, room, "the report")
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
                stop_halfwidth=None,  # the comparison that decides the pick runs every rep
                extra={
                    **base.extra,
                    "unchecked_because": "a head-to-head trial: its search trial checked it",
                    LEND_CACHES: [leader["id"], c["id"]],
                },
            )
        )
    if not specs:
        return []
    names = ", ".join(s.variant for s in specs)
    events.stage("head to head", f"{names} against {leader['variant']}", left())
    # One at a time: this comparison decides the pick, and its reps then wait on nothing.
    return LocalExecutor(slots[0]).run(specs, run_one)
