"""Where a stream trial is, written to a file while it runs, and its turns on the host.

A stream trial stopped at its time limit leaves no result: its process group is ended before it
can write one. On an H100, a bert-base stream tune's eight trials all ran past their limits
(35-111 s) and its results said only that, not whether the time went to loading, to compiling
buckets or to replaying items. The trial now keeps a small JSON file up to date (the phase, the
buckets warmed, the items replayed, the graphs compiled and their seconds), and the search reads
it when it stops the trial: `describe` turns it into the reason's second half.

With several stream trials in flight on one GPU (KILN_HOST_LOCK, as the fixed-input search's
pool sets it: runner/launch/host_lock.py) each phase takes its turn: loading shares the host,
a bucketed warm-up and the replay's first items (`replay`: the part before the steady state,
where an unbucketed candidate compiles) take a compile slot, and the steady items (`steady`),
on which the pick and the speedups are judged, hold the host alone. The file says while the
trial waits for a turn, so the search's cap counts only the trial's own seconds, and the result
keeps each phase's wall-clock interval (`phase_at`) and the seconds waited (`host_wait_s`).

Why the first items share: on an H200 (bert-base inference, 2,000 items, bf16), four plain
`torch.compile` replays that held the host alone from their first item took turns for 494 s
(default 74 s, reduce-overhead 71 s, max-autotune-no-cudagraphs 149 s, max-autotune 174 s),
most of it compiling on the stream's first shapes while the other trials waited
(benchmarks/results/stream/h200/bert-base-infer-plain). The price: the first items' seconds,
and so the whole-stream figures (`time_per_item_s`, `total_s`, `speedup`), are taken beside
other trials' compiles, as a fixed-input trial's cold compile is; the steady figures are not.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

# A replay calls `item` for every item; the file is rewritten at most this often from there
# (bert-base items take milliseconds) and at every change of phase or bucket.
WRITE_EVERY_S = 1.0

_current: list[Progress] = []  # the trial process's own, once `start` is called
# Each phase's turn on the host (host_lock.lock_mode): shared, a compile slot, alone.
LOCK_PHASES = {
    "load": "setup",
    "warm-up": "first_call",
    "replay": "first_call",
    "steady": "measure",
    "done": "done",
}


class _Turns:
    """The phases' turns on the pool's lock file, if any, with their waits and intervals."""

    def __init__(self) -> None:
        from torchkiln.runner.launch.host_lock import HostLock

        self.lock = HostLock.from_env()
        self.waited = 0.0
        self.at: dict[str, list[float | None]] = {}
        self.current: str | None = None

    def enter(self, name: str) -> None:
        if self.current is not None:
            self.at[self.current][1] = time.time()
        if self.lock is not None:
            for p in _current:
                p.update(True, waiting_since=time.time())
            self.waited += self.lock.enter(LOCK_PHASES.get(name, "setup"))
            for p in _current:
                p.update(True, waiting_since=None, waited_s=round(self.waited, 3))
        self.current = None if name == "done" else name
        if self.current is not None:
            self.at[name] = [time.time(), None]


_turns: list[_Turns] = []


class Progress:
    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.t0 = time.perf_counter()
        self.state: dict[str, Any] = {"phase": "start"}
        self.last = 0.0

    def update(self, force: bool, **state: Any) -> None:
        self.state.update(state)
        now = time.perf_counter()
        if not force and now - self.last < WRITE_EVERY_S:
            return
        self.last = now
        from torchkiln.measure import compile_watch

        done = compile_watch.snapshot()
        doc = {
            **self.state,
            "elapsed_s": round(now - self.t0, 3),
            "compiles": done["compiles"],
            "compile_time_s": done["compile_time_s"],
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.path)  # whole or not at all: the reader never sees half a file


def start(path: str | None) -> None:
    """This process's progress goes to ``path`` (None: nowhere); it takes turns on the host
    when KILN_HOST_LOCK names a lock file."""
    _current[:] = [Progress(path)] if path else []
    _turns[:] = [_Turns()]
    phase("load")


def phase(name: str, **info: Any) -> None:
    """The trial enters ``name`` (``load``, ``warm-up``, ``replay``, ``steady``), after its turn
    for it; ``info`` adds counts."""
    for t in _turns:
        t.enter(name)
    for p in _current:
        p.update(True, phase=name, **info)


def finish() -> dict[str, Any]:
    """The trial is done (its turn released): the seconds it waited for turns and each phase's
    wall-clock interval, for its result."""
    if not _turns:
        return {}
    t = _turns[0]
    t.enter("done")
    return {"host_wait_s": round(t.waited, 3), "phase_at": t.at}


def own_seconds(doc: dict[str, Any] | None, elapsed_s: float) -> float:
    """The seconds of ``elapsed_s`` the trial spent on its own work: less its waits for a turn,
    the one under way included."""
    if not doc:
        return elapsed_s
    waited = float(doc.get("waited_s") or 0.0)
    if doc.get("waiting_since") is not None:
        waited += max(0.0, time.time() - float(doc["waiting_since"]))
    return elapsed_s - waited


def bucket(done: int, total: int) -> None:
    """``done`` of the ``total`` buckets are warm (compiled, and recorded under CUDA graphs)."""
    for p in _current:
        p.update(True, buckets_done=done, buckets=total)


def steady() -> None:
    """The replay reaches its steady items: from here the trial holds the host alone."""
    phase("steady")


def item(done: int, total: int) -> None:
    """``done`` of the stream's ``total`` items are replayed."""
    for p in _current:
        p.update(False, items_done=done, items=total)


def read(path: str | Path) -> dict[str, Any] | None:
    """The last progress a trial wrote, or None if it wrote none."""
    p = Path(path)
    return json.loads(p.read_text()) if p.is_file() else None


def describe(doc: dict[str, Any] | None, now: float | None = None) -> str:
    """Where the trial was, as ``while replaying item 16 of 30; 2 graphs compiled in 14 s``,
    and, when it waited for turns on the host, how long (``now``: time.time(), for a wait
    still under way)."""
    if not doc:
        return "before it wrote any progress (starting)"
    where = {
        "start": "while starting",
        "load": "while loading the model and its stream",
    }.get(doc["phase"], f"in {doc['phase']}")
    if doc["phase"] == "warm-up":
        n, done = doc.get("buckets", "?"), doc.get("buckets_done", 0)
        where = f"while warming up bucket {done + 1} of {n}"
        if isinstance(n, int) and done >= n:
            where = f"after warming up its {n} buckets"
    elif doc["phase"] in ("replay", "steady"):
        where = f"while replaying item {doc.get('items_done', 0) + 1} of {doc.get('items', '?')}"
    waited = float(doc.get("waited_s") or 0.0)
    if doc.get("waiting_since") is not None:
        # the phase named is the last one entered: the trial was waiting to leave it
        waited += max(0.0, (time.time() if now is None else now) - float(doc["waiting_since"]))
        where += f", waiting for its turn on the host ({waited:.0f} s of waits in all)"
    elif waited >= 1.0:
        where += f" (after {waited:.0f} s of waits for turns on the host)"
    if doc.get("compiles") is None:
        return where
    graphs = "graph" if doc["compiles"] == 1 else "graphs"
    took = doc.get("compile_time_s")
    took = f" in {took:.0f} s" if took is not None else ""
    return f"{where}; {doc['compiles']} {graphs} compiled{took}"
