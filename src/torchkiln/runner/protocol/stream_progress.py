"""Where a stream trial is, written to a file while it runs.

A stream trial stopped at its time limit leaves no result: its process group is ended before it
can write one. On an H100, a bert-base stream tune's eight trials all ran past their limits
(35-111 s) and its results said only that, not whether the time went to loading, to compiling
buckets or to replaying items. The trial now keeps a small JSON file up to date (the phase, the
buckets warmed, the items replayed, the graphs compiled and their seconds), and the search reads
it when it stops the trial: `describe` turns it into the reason's second half.
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
    """This process's progress goes to ``path`` (None: nowhere)."""
    _current[:] = [Progress(path)] if path else []
    phase("load")


def phase(name: str, **info: Any) -> None:
    """The trial enters ``name`` (``load``, ``warm-up``, ``replay``); ``info`` adds counts."""
    for p in _current:
        p.update(True, phase=name, **info)


def bucket(done: int, total: int) -> None:
    """``done`` of the ``total`` buckets are warm (compiled, and recorded under CUDA graphs)."""
    for p in _current:
        p.update(True, buckets_done=done, buckets=total)


def item(done: int, total: int) -> None:
    """``done`` of the stream's ``total`` items are replayed."""
    for p in _current:
        p.update(False, items_done=done, items=total)


def read(path: str | Path) -> dict[str, Any] | None:
    """The last progress a trial wrote, or None if it wrote none."""
    p = Path(path)
    return json.loads(p.read_text()) if p.is_file() else None


def describe(doc: dict[str, Any] | None) -> str:
    """Where the trial was: ``while replaying item 341 of 2000; 5 graphs compiled in 95 s``."""
    if not doc:
        return "before it wrote any progress (starting)"
    where = {
        "start": "while starting",
        "load": "while loading the model and its stream",
    }.get(doc["phase"], f"in {doc['phase']}")
    if doc["phase"] == "warm-up":
        n = doc.get("buckets", "?")
        where = f"while warming up bucket {doc.get('buckets_done', 0) + 1} of {n}"
    elif doc["phase"] == "replay":
        where = f"while replaying item {doc.get('items_done', 0) + 1} of {doc.get('items', '?')}"
    if doc.get("compiles") is None:
        return where
    graphs = "graph" if doc["compiles"] == 1 else "graphs"
    took = doc.get("compile_time_s")
    took = f" in {took:.0f} s" if took is not None else ""
    return f"{where}; {doc['compiles']} {graphs} compiled{took}"
