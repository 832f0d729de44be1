"""The search's queue: candidates in plan order, deferred rather than dropped when they do not
fit what is left of the budget at their turn."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class SearchQueue:
    """The search's candidates in order. One that does not fit what is left when its turn
    comes is deferred, not dropped: once the queue is empty and no trial runs, the deferred
    take a second turn, judged against what is left then, and only one that still does not fit
    is skipped. Before two compiled variants are measured, the search keeps time for comparing
    the two it expects (head_to_head_reserve); at a second turn nothing else is to come, so the
    pipeline keeps time only for the finalists already measured. On an H200 (commit 4f3d327) a
    2-minute tune of `simple` skipped five candidates estimated at 35-345 s with 31 s of room,
    keeping 30 s for a comparison that never ran (one compiled variant was measured), and ended
    at 56 s of its 120."""

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
    ) -> tuple[int, Any] | None:
        """The next candidate to start, or None: nothing left, or (`running`) nothing to start
        until a running trial ends. `fits(cand, second_turn)` gives None where the candidate
        fits, else why not; `defer` and `skip` are told of each candidate deferred or
        skipped."""
        while True:
            if not self.pending:
                if running or not self.deferred:
                    return None
                self.pending.extend(self.deferred)
                self.deferred.clear()
            i, cand = self.pending.pop(0)
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
