"""A tune's diagnosis: the profile verdict, the graph breaks (`kiln explain`) and the repair plan
made from them, run in that order, inline before the search or in a thread beside its first
trials.

Beside the trials it takes turns on the search's lock file (runner/launch/host_lock.py) as a
trial does: the profile worker's timed steps on an exclusive turn, its other phases on a shared
one; explain, all tracing and compiling, and the repair plan (source rewrites in this process)
on a shared turn for their whole run. So no trial times its reps while the diagnosis works, and
the profile's steps are never timed beside a trial's compile.

Each stage's record carries when it ran, ``started_at`` and ``ended_at`` (wall-clock seconds,
time.time(), the clock of every trial's ``phase_at``), and ``beside: "search"`` when it ran
beside the search's trials."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchkiln.runner.launch.host_lock import host_turns, shared_turn
from torchkiln.runner.protocol.trial import TrialSpec
from torchkiln.tune import evidence as gather

# The graph-break stage's least time when remedies are searched: a 45 s GPU tune left explain
# a quarter of what was left, too little to trace a model in a fresh process.
EXPLAIN_FLOOR_S = 30.0
# Each diagnosis stage's share of what is left when it starts, and its cap.
STAGE_SHARE = 4
STAGE_CAP_S = 300.0


@dataclass
class Findings:
    """What the diagnosis hands the search: the three stages' records and the repair plan."""

    profile: dict[str, Any]
    graph_breaks: dict[str, Any]
    repair: dict[str, Any]
    plan: dict[str, Any] | None


class Diagnosis:
    """The profile, explain and repair-plan stages of one tune.

    ``left()`` is the budget's seconds left; ``clock`` the tune's StageClock (tune.time_spent)."""

    def __init__(
        self, base: TrialSpec, fix: str, out: Path, left: Callable[[], float], clock: Any
    ) -> None:
        self.base, self.fix, self.out = base, fix, out
        self.left, self.clock = left, clock

    def run(self, host_lock: str | None = None) -> Findings:
        """The three stages in order; beside the search when ``host_lock`` is given."""
        beside = host_lock is not None
        found: dict[str, dict[str, Any]] = {}
        with self._stage(
            "profile", "where the eager step spends its time", beside, found, "profile"
        ):
            found["profile"] = gather.stage(
                lambda spec, t: gather.profile_verdict(spec, t, host_lock=host_lock),
                self.base,
                min(STAGE_CAP_S, self.left() / STAGE_SHARE),
            )
        with self._stage("graph breaks", "kiln explain", beside, found, "graph_breaks"):
            # Its findings are the remedies' source: at least 30 s, even from a short budget.
            floor = 0.0 if self.fix == "none" else EXPLAIN_FLOOR_S
            timeout = min(STAGE_CAP_S, max(floor, self.left() / STAGE_SHARE))
            # Explain's subprocess holds a shared turn on KILN_HOST_TURNS's file itself: one
            # more on that file here would queue at its turnstile behind a trial waiting for
            # the turn this one holds, each waiting on the other.
            outer = None if host_lock == host_turns() else host_lock
            with shared_turn(outer):
                found["graph_breaks"] = gather.stage(gather.graph_breaks, self.base, timeout)
            # Each break's remedies become candidates (torchkiln.repair): rewritten copies.
            with shared_turn(host_lock):
                repair, plan = gather.repair_plan(
                    self.base, found["graph_breaks"], self.fix, self.out / "repair"
                )
        return Findings(found["profile"], found["graph_breaks"], repair, plan)

    def start(self, host_lock: str) -> Future:
        """``run(host_lock)`` in a thread of its own; the future holds its Findings, or what it
        raised (a KilnUserError the tune stops on, a stop). A daemon thread: an interpreter
        leaving after a Ctrl-C does not wait for it (its subprocess ends with kiln)."""
        fut: Future = Future()
        fut.set_running_or_notify_cancel()

        def body() -> None:
            try:
                fut.set_result(self.run(host_lock))
            except BaseException as exc:  # noqa: BLE001  (handed to the tune's thread, raised there)
                fut.set_exception(exc)

        threading.Thread(target=body, name="kiln-diagnosis", daemon=True).start()
        return fut

    @contextlib.contextmanager
    def _stage(
        self, name: str, detail: str, beside: bool, found: dict[str, Any], key: str
    ) -> Iterator[None]:
        """Announces a stage, on the main line or beside it, and stamps its record (``key`` in
        ``found``) with when it ran."""
        start = time.time()
        if beside:
            span: Any = self.clock.beside(name, f"{detail} (beside the search)", self.left())
        else:
            self.clock.stage(name, detail, self.left())
            span = contextlib.nullcontext()
        with span:
            yield
        record = found.get(key)
        if record is not None:
            record["started_at"], record["ended_at"] = round(start, 3), round(time.time(), 3)
            if beside:
                record["beside"] = "search"
