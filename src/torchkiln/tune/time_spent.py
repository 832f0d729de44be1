"""Where a tune's time went: wall seconds per stage (environment, baseline, profile, graph
breaks, search, head to head, select, report) and each trial phase's seconds summed over the
trials this run measured, so a user sees what the budget bought. Stages run beside the others
(the diagnosis beside the search's first trials) are counted apart, as overlap: the wall is the
main line's stages alone."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

# Time before the first stage below this is argument checking, not worth a row.
SHOWN_S = 0.05


class StageClock:
    """Wraps a tune's events: every ``stage(name, ...)`` call also marks when that stage began.
    The rest passes through unchanged."""

    def __init__(self, events: Any) -> None:
        self._events = events
        self.marks: list[tuple[str, float]] = []
        # (name, start, end) of stages run beside the main line, in another thread.
        self.beside_spans: list[tuple[str, float, float]] = []
        self._lock = threading.Lock()

    def stage(self, name: str, detail: str, seconds_left: float) -> None:
        self.marks.append((name, time.monotonic()))
        self._events.stage(name, detail, seconds_left)

    @contextlib.contextmanager
    def beside(self, name: str, detail: str, seconds_left: float) -> Iterator[None]:
        """A stage run beside the main line (which it does not mark): its span is kept apart
        (``beside_spans``), even when it fails."""
        start = time.monotonic()
        self._events.stage(name, detail, seconds_left)
        try:
            yield
        finally:
            with self._lock:
                self.beside_spans.append((name, start, time.monotonic()))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._events, name)


def stage_seconds(marks: Iterable[tuple[str, float]], start: float, end: float) -> dict[str, float]:
    """Seconds per stage name: each mark lasts until the next (the last until ``end``); a name
    marked several times (search, once per candidate) sums its spans; time before the first
    mark is ``setup`` (when it is at least SHOWN_S)."""
    out: dict[str, float] = {}
    marks = list(marks)
    if marks and marks[0][1] - start >= SHOWN_S:
        out["setup"] = marks[0][1] - start
    for (name, t), nxt in zip(marks, [m[1] for m in marks[1:]] + [end], strict=True):
        out[name] = out.get(name, 0.0) + max(0.0, nxt - t)
    return out


def beside_seconds(spans: Iterable[tuple[str, float, float]]) -> dict[str, float]:
    """Seconds per stage run beside the main line (a name run twice sums its spans)."""
    out: dict[str, float] = {}
    for name, start, end in spans:
        out[name] = out.get(name, 0.0) + max(0.0, end - start)
    return out


# A phase of trials that were stopped or crashed before their result, named apart: their
# seconds bought no measurement. In an 8-minute resnet50 training tune (H100, kiln 1f14519) two
# max-autotune compiles stopped at 350 and 356 s were read as 708 s "outside their phases".
UNFINISHED = "{}, unfinished"


def phase_seconds(trials: Iterable[dict[str, Any]]) -> tuple[dict[str, float], dict[str, int]]:
    """Each phase's seconds summed over the trials measured in this run (a reused trial's
    phases were spent in an earlier run), and how many trials were counted and reused. A trial
    that left no phase record counts the phases its launcher saw (`phase_s_seen`), each but
    `host_wait` as UNFINISHED."""
    phases: dict[str, float] = {}
    counted = reused = 0
    process = 0.0
    for r in trials:
        if r.get("reused"):
            reused += 1
            continue
        counted += 1
        process += float(r.get("process_wall_s") or 0.0)
        own = r.get("phase_s")
        for name, s in (own or r.get("phase_s_seen") or {}).items():
            if not own and name != "host_wait":
                name = UNFINISHED.format(name)
            phases[name] = phases.get(name, 0.0) + float(s)
    return phases, {"trials": counted, "reused_trials": reused, "process_s": process}


def time_spent(
    doc: dict[str, Any], stages_s: dict[str, float], beside_s: dict[str, float] | None = None
) -> dict[str, Any]:
    """The ``time_spent`` object of a tune's results.json. ``beside_s``: stages that ran beside
    the main line's (already inside the wall and the stages they overlapped, never added)."""
    trials = [*doc.get("trials", []), *doc.get("head_to_head_trials", [])]
    phases, counts = phase_seconds(trials)
    in_phases = sum(phases.values())
    out = {
        "wall_s": float(doc.get("wall_s") or sum(stages_s.values())),
        "stages_s": {k: round(v, 3) for k, v in stages_s.items()},
        "phases_s": {k: round(v, 3) for k, v in phases.items()},
        "trials": counts["trials"],
        "reused_trials": counts["reused_trials"],
        "trial_process_s": round(counts["process_s"], 3),
        # A trial process's time before its first phase: interpreter start, kiln's imports.
        "outside_phases_s": round(max(0.0, counts["process_s"] - in_phases), 3),
    }
    if beside_s:
        out["beside_s"] = {k: round(v, 3) for k, v in beside_s.items()}
    return out


def console_line(spent: dict[str, Any] | None) -> str | None:
    """One compact line: the stages, then the three costliest trial phases."""
    if not spent:
        return None
    stages = ", ".join(f"{k} {v:.0f}s" for k, v in spent["stages_s"].items() if v >= 0.5)
    top = sorted(spent["phases_s"].items(), key=lambda kv: -kv[1])[:3]
    phases = ", ".join(f"{k} {v:.0f}s" for k, v in top)
    beside = ", ".join(f"{k} {v:.0f}s" for k, v in (spent.get("beside_s") or {}).items())
    if beside:
        stages += f"; beside the search: {beside}"
    line = f"time spent: {spent['wall_s']:.0f}s ({stages})"
    if phases:
        line += f"; over {spent['trials']} trials: {phases}"
    return line
