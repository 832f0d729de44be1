"""How long a stream trial should take, and the order the search spends its budget in.

A stream trial's time is mostly compiles, and how many it makes follows from the candidate and
the stream before anything runs: one graph per bucket, one for a dynamic graph, two for automatic
dynamic (a static graph, then a dynamic one at the first new shape), one per distinct shape up to
the recompile limit for a static graph. The search learns the seconds one such compile takes and
what a trial spends besides (loading, both replays) from the trials already run, and starts a
candidate only when its estimate fits what is left; a trial is stopped at a multiple of its
estimate. On an H100 a bert-base stream tune that gave each trial a fixed share of what was left
(35%) instead ran out of time in every one of its eight trials, the first at 111 s while it
compiled its four buckets, and measured nothing.

A compile's seconds are learned per kind of graph (``compile_kind``: dynamic or static shapes,
under each mode): on an H100 a bert-base training step compiled with ``dynamic=True`` took 66 s a
graph and a static one 10 s, and one figure for both would have estimated every bucketed
candidate at over four minutes. A trial stopped before it ended still teaches what it spent: its
seconds so far are a lower bound of the estimate (on that H100 the first trial, ``dynamic=True``,
ran past its cap while compiling; the search that learned only from finished trials then gave
each next candidate half of what was left, one at a time, and measured nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchkiln.tune.stream_plan import LEARNED_BUCKETS, StreamCandidate
from torchkiln.variants import parse_variant

# The trials started before any has ended have nothing to learn from: each may take this share
# of what is left. The first is the candidate expected to compile least, so that it finishes
# and teaches the estimate; on a GPU the next start beside it, one per free slot (a search that
# ran the first alone left all but one of an H100's four slots idle for the first half of its
# budget when that trial ran long).
FIRST_TRIAL_SHARE = 0.5
# A trial may run this many times its estimate (at least TRIAL_CAP_MIN_S) before it is stopped:
# compiles of one model differ by shape and mode (reduce-overhead records a CUDA graph per
# shape), and one trial must not spend what the others need.
TRIAL_CAP_FACTOR = 3.0
TRIAL_CAP_MIN_S = 60.0
# dynamo's recompile limit where the candidate does not raise it (torch 2.11-2.14: 8)
DEFAULT_RECOMPILE_LIMIT = 8


def distinct_shapes(stream: Any) -> int:
    from torchkiln.measure.stream_replay import _shape

    return len({_shape(x) for x in stream.items})


def expected_compiles(cand: StreamCandidate, stream: Any, warmup_fraction: float = 0.2) -> int:
    """The compiles ``cand`` should make over ``stream``: per bucket, per dynamic graph, or per
    distinct shape up to the recompile limit (graph breaks multiply all of them alike)."""
    shapes = distinct_shapes(stream)
    if cand.bucket:
        import math

        from torchkiln.measure.stream_buckets import stream_buckets

        warmup = int(len(stream) * warmup_fraction)
        buckets = stream_buckets(stream, cand.bucket, warmup, LEARNED_BUCKETS)
        return max(1, math.prod(len(b) for b in buckets.values()))
    dynamic = getattr(parse_variant(cand.variant).backend, "dynamic", None)
    if cand.mark_dynamic or dynamic == "true":
        return 1
    if dynamic == "auto":
        return min(shapes, 2)
    return min(shapes, cand.recompile_limit or DEFAULT_RECOMPILE_LIMIT)


def compile_seconds(r: dict[str, Any]) -> float:
    """A finished trial's seconds compiling: during the replay, and a bucketed one's warm-up
    (whose CUDA-graph recordings count with it)."""
    return float(r.get("compile_time_s") or 0.0) + float(r.get("warmup_s") or 0.0)


def compile_kind(cand: StreamCandidate) -> str:
    """The kind of graph ``cand`` compiles, whose compile seconds the search learns apart:
    ``dynamic`` (marked dims, ``dynamic=true``), ``auto`` (a static graph then a dynamic one),
    or ``static`` (buckets, a static graph per shape), under the candidate's mode."""
    backend = parse_variant(cand.variant).backend
    dynamic = getattr(backend, "dynamic", None)
    if cand.mark_dynamic or dynamic == "true":
        shapes = "dynamic"
    elif cand.bucket or dynamic == "false":
        shapes = "static"
    else:
        shapes = "auto"
    return f"{getattr(backend, 'mode', None) or 'default'}:{shapes}"


@dataclass
class StreamEstimator:
    """A trial's seconds as ``fixed_s + compiles * per_compile_s``, from the trials run so far:
    the largest of each seen (a cap that errs long stops nothing it should not), the seconds a
    compile takes learned per ``compile_kind`` (a kind not seen yet takes the largest seen for the
    same shapes under any mode; automatic dynamic not seen, the mean of a static compile and a
    dynamic one, as it makes one of each; else the largest of all). A trial stopped before it
    ended (a timeout) teaches the seconds it had spent: lower bounds, as its compile in flight
    and the rest of its replay are not in them."""

    fixed_s: float | None = None
    per_compile_s: float | None = None
    per_compile_by_kind: dict[str, float] = field(default_factory=dict)
    learned_from: list[str] = field(default_factory=list)

    def per_compile(self, kind: str | None = None) -> float | None:
        if kind is None:
            return self.per_compile_s
        mode, _, shapes = kind.rpartition(":")
        alike = self._alike(mode, shapes)
        if alike is not None:
            return alike
        if shapes == "auto":
            # automatic dynamic compiles a static graph, then a dynamic one: on an H100 a
            # bert-base training stream's took 42 s a compile, against 26 s static and 149 s
            # dynamic (the largest of all would have priced it at 149 s and skipped it)
            static, dynamic = self._alike(mode, "static"), self._alike(mode, "dynamic")
            if static is not None and dynamic is not None:
                return (static + dynamic) / 2
        return self.per_compile_s

    def _alike(self, mode: str, shapes: str) -> float | None:
        """The seconds a compile of ``shapes`` under ``mode`` takes, else under any mode."""
        if f"{mode}:{shapes}" in self.per_compile_by_kind:
            return self.per_compile_by_kind[f"{mode}:{shapes}"]
        alike = [v for k, v in self.per_compile_by_kind.items() if k.split(":")[-1] == shapes]
        return max(alike) if alike else None

    def __call__(self, compiles: int, kind: str | None = None) -> float | None:
        per = self.per_compile(kind)
        if self.fixed_s is None or per is None:
            return None
        return self.fixed_s + compiles * per

    def learn(self, name: str, compiles: int, r: dict[str, Any], kind: str | None = None) -> None:
        fixed, per = _seconds_seen(compiles, r)
        if fixed is None and per is None:
            return
        if fixed is not None:
            self.fixed_s = fixed if self.fixed_s is None else max(self.fixed_s, fixed)
        if per is not None:
            self.per_compile_s = per if self.per_compile_s is None else max(self.per_compile_s, per)
            if kind is not None:
                self.per_compile_by_kind[kind] = max(per, self.per_compile_by_kind.get(kind, 0.0))
        self.learned_from.append(name)


def _seconds_seen(compiles: int, r: dict[str, Any]) -> tuple[float | None, float | None]:
    """(seconds besides compiles, seconds a compile) that trial result ``r`` shows, None for what
    it does not: a finished trial's own seconds (its waits for a turn on the host are its
    neighbours'); a timed-out one's progress, lower bounds: the seconds of the graphs it had
    compiled, and its seconds besides them once it was replaying and not waiting for a turn
    (before that, a compile in flight is in them)."""
    if r.get("status") in ("ok", "incorrect"):
        wall = r.get("process_wall_s")
        if wall is None:
            return None, None
        spent = compile_seconds(r)
        fixed = max(0.0, float(wall) - float(r.get("host_wait_s") or 0.0) - spent)
        return fixed, spent / max(1, compiles)
    p = r.get("progress")
    if r.get("status") != "timeout" or not p:
        return None, None
    spent = float(p.get("compile_time_s") or 0.0)
    done = int(p.get("compiles") or 0)
    fixed = None
    if p.get("phase") in ("replay", "steady") and p.get("waiting_since") is None:
        own = float(p.get("elapsed_s") or 0.0) - float(p.get("waited_s") or 0.0)
        fixed = max(0.0, own - spent)
    # per expected compile, as a finished trial teaches it, once its graphs reach that count
    # (a model's graph breaks make more graphs than compiles expected); before, per graph
    return fixed, (spent / min(done, max(1, compiles)) if done else None)


def trial_order(plan: list[StreamCandidate], compiles: dict[str, int]) -> list[StreamCandidate]:
    """The plan with one candidate moved to the front: the leading precision's candidate
    expected to compile least (the first of them in plan order), whose trial teaches the
    estimate; the rest keep the plan's order (stream_plan: likely winners first)."""
    if not plan:
        return []
    lead = parse_variant(plan[0].variant).precision
    same = [c for c in plan if parse_variant(c.variant).precision == lead]
    probe = min(same, key=lambda c: compiles[c.name])
    return [probe, *(c for c in plan if c is not probe)]


def trial_cap(estimate_s: float | None, room_s: float, last: bool) -> float:
    """Seconds a trial may run: a multiple of its estimate, or before any estimate a share of
    what is left; never past what is left, and the last trial may take all of it."""
    if last:
        return room_s
    if estimate_s is None:
        return FIRST_TRIAL_SHARE * room_s
    return min(room_s, max(TRIAL_CAP_MIN_S, TRIAL_CAP_FACTOR * estimate_s))


def stream_slots(device: str) -> tuple[list[int | None], str]:
    """Stream trials in flight on this host, and why: on a GPU as many as may compile at once
    in a fixed-input search (runner.launch.concurrency: the host's cores and memory, or
    KILN_COMPILE_WORKERS), each trial's steady items alone on the host; on the CPU one, where the
    compiler and the timed items share the cores, unless KILN_COMPILE_WORKERS asks for more."""
    import os

    from torchkiln.runner.launch import concurrency

    asked = os.environ.get(concurrency.COMPILE_WORKERS_ENV)
    if asked:
        n = concurrency.parse_workers(asked, concurrency.COMPILE_WORKERS_ENV)
        return [None] * n, f"{n} at once (asked for)"
    if not device.startswith("cuda"):
        return [None], "1 at once: on the CPU the compiler and the timed items share the cores"
    n, why = concurrency.auto_workers(os.cpu_count(), concurrency._host_memory_bytes(), None, None)
    return [None] * n, f"{why}; each replay's steady items alone on the host"
