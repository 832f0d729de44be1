"""The search's queue: candidates in plan order, deferred rather than dropped when they do not
fit what is left of the budget at their turn, the dearest first where waiting would cost them
their only chance."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# A candidate whose estimate takes at least this share of the search's room is dear: where
# several trials run at once it starts as soon as no primary waits, ahead of cheaper candidates
# that fit later anyway (with one trial at a time the order changes no sum, only what is cut).
# In an 8-minute resnet50 training tune (H100, torch 2.11, bf16, kiln b8486a3) the first
# max-autotune compile started 175 s into a search share of about 418 s, behind eleven compiles
# of 6-47 s, and was stopped after 262 s, still autotuning; the three max-autotune candidates by
# themselves compiled in 348-361 s, side by side, and were all measured within the same budget
# (benchmarks/results/tune_speed/h100/part-tune8-resnet50.json, part-autotuned-resnet50.json).
# A third: before any compile is measured an autotuned candidate is priced at about 170 s (8x
# the estimator's 20-s default unit, plus overhead) against about 400 s of room in such a tune.
DEAR_SHARE = 1 / 3
# A dear candidate waits for a price: while no compile of the tune has ended, its estimate is a
# guess from a 20-s default unit, and a compile in flight will price it. In the 8-minute
# resnet50 training tune (H100, kiln 4f3205c) the two max-autotune candidates, priced at about
# 190 s that way, started 11 s in beside the primaries and were both stopped at 398 s, still
# autotuning; the primaries' compiles took 64-68 s beside them (a price of about 8 x 60 s), and
# eager+bf16, left last, was stopped waiting for a timed turn. Alone, such a compile was still
# autotuning after 406 s (tune_speed/h100/alone-base-resnet50-results.json).


class SearchQueue:
    """The search's candidates in order. One that does not fit what is left when its turn
    comes is deferred, not dropped: once the queue is empty and no trial runs, the deferred
    take a second turn, judged against what is left then, and only one that still does not fit
    is skipped. Before two compiled variants are measured, the search keeps time for comparing
    the two it expects (head_to_head_reserve); at a second turn nothing else is to come, so the
    pipeline keeps time only for the finalists already measured. On an H200 (commit 4f3d327) a
    2-minute tune of `simple` skipped five candidates estimated at 35-345 s with 31 s of room,
    keeping 30 s for a comparison that never ran (one compiled variant was measured), and ended
    at 56 s of its 120. A dear candidate (DEAR_SHARE) is taken out of plan order once no
    primary waits."""

    def __init__(self, plan: list[Any]) -> None:
        self.pending: list[tuple[int, Any]] = list(enumerate(plan, start=1))
        self.deferred: list[tuple[int, Any]] = []
        # spec -> why, at its first turn: a candidate is deferred at most once.
        self.deferred_why: dict[str, str] = {}

    def waiting(self) -> set[str]:
        """Specs deferred and not yet given their second turn."""
        return {c.spec for _, c in self.deferred}

    def take(
        self,
        fits: Callable[[Any, bool], str | None],
        running: bool,
        skip: Callable[[Any, str], None],
        defer: Callable[[Any, str], None],
        dear: Callable[[Any], bool] | None = None,
        held: Callable[[Any], bool] | None = None,
    ) -> tuple[int, Any] | None:
        """The next candidate to start, or None: nothing left, or (`running`) nothing to start
        until a running trial ends. `fits(cand, second_turn)` gives None where the candidate
        fits, else why not; `defer` and `skip` are told of each candidate deferred or
        skipped; `dear(cand)`, where given, marks a candidate to start before the rest;
        `held(cand)`, where given, one not to start yet (it keeps its place)."""
        while True:
            if not self.pending:
                if running or not self.deferred:
                    return None
                self.pending.extend(self.deferred)
                self.deferred.clear()
            k = self._next(dear, held)
            if k is None:
                return None
            i, cand = self.pending.pop(k)
            second = cand.spec in self.deferred_why
            why = fits(cand, second)
            if why is None:
                return i, cand
            if second:
                skip(cand, why)
            else:
                self.deferred_why[cand.spec] = why
                self.deferred.append((i, cand))
                defer(cand, why)

    def _next(
        self, dear: Callable[[Any], bool] | None, held: Callable[[Any], bool] | None = None
    ) -> int | None:
        """Where in `pending` the next candidate is: the first not held, unless no primary waits
        and a later one is dear; None when every one is held."""
        free = [k for k, (_, c) in enumerate(self.pending) if held is None or not held(c)]
        if not free:
            return None
        if dear is None or any(getattr(c, "primary", False) for _, c in self.pending):
            return free[0]
        return next((k for k in free if dear(self.pending[k][1])), free[0])
